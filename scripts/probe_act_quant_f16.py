"""GPU probe (≈ 90 s): act_quant writing the int4_g64 decode kernel's fp16 token operand itself
(``act_quant(out="f16")``, one launch) against the packed pair + ``w4_expand.f16_act_operands`` (two launches), one
process, CUDA-graph replays over three rotated inputs.

Per M (K = 4096, N = 28672 by default, rank 32): act_quant alone — ``aq_packed`` (the default plan), ``f16_operands``
(the operand kernel on its output), ``aq_f16`` (the default S programs), ``aq_f16_rank`` / ``aq_f16_ticket`` (both
S modes); then the layer (``w4a4_linear``, checked against ``svdq_linear_ref``) — ``layer_aq16=0`` / ``=1`` at the
default route (``LOWRANK_GEMM_ACT_QUANT_F16``), ``layer_dec16=0`` (``LOWRANK_GEMM_DECODE_F16=0``: the route without
the fp16 path), and at M ≤ 32 ``layer_dec16_aq16=0`` / ``=1`` (``LOWRANK_GEMM_DECODE_F16=1``: the fp16 decode path at
every M) — and ``cublas_bf16`` (x @ Wᵀ). Writes DIR/probe_act_quant_f16.{json,md}.

``--chain``: only act_quant(packed) → the GEMM op per operand-kernel PDL trigger (:func:`chain_rows`).

    PYTHONPATH=src python scripts/probe_act_quant_f16.py --out DIR [--cases MxKxN,…] [--ab | --chain]
"""

from __future__ import annotations

import argparse

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="16x4096x28672,32x4096x28672,33x4096x28672,48x4096x28672,64x4096x28672")
    ap.add_argument("--ab", action="store_true", help="also the unit shapes (quant_cols 1024 / 2048 / 4096), r = 0, "
                    "the layer with LOWRANK_GEMM_PDL=0, and the GEMM op on packed operands (fp16 route vs v2)")
    ap.add_argument("--chain", action="store_true", help="only the chain act_quant(packed) → w4a4_gemm (the operand "
                    "kernel between them) per w4_expand.OPERAND_PDL_TRIGGER, and with LOWRANK_GEMM_PDL=0")
    a = ap.parse_args()
    from _decode_probe import graph_row, svdq_layer, write_err_table
    from _scoped_env import scoped_env
    from lowrank_gemm.bench.common import device_meta, parse_shapes
    from lowrank_gemm.kernels.act_quant import act_quant
    from lowrank_gemm.kernels.w4_expand import f16_act_operands
    from lowrank_gemm.kernels.w4a4_gemm import w4a4_gemm, w4a4_linear
    from lowrank_gemm.reference import svdq_linear_ref

    meta, rows = device_meta(), []
    switches = ("LOWRANK_GEMM_ACT_QUANT_F16", "LOWRANK_GEMM_DECODE_F16", "LOWRANK_GEMM_PDL")

    def row(*args, **kw):
        graph_row(rows, *args, **kw)

    for M, K, N in parse_shapes(a.cases, dims=3):
        p, bias, xs = svdq_layer(M, N, K)
        sm, down = p["smooth"], p["lora_down"]
        if a.chain:
            chain_rows(M, K, N, p, bias, xs, row)
            continue
        row(M, K, N, "aq_packed", lambda x: act_quant(x, sm, down, 64), xs)
        packed = [act_quant(x, sm, down, 64)[:2] for (x, ) in xs]
        row(M, K, N, "f16_operands", lambda q, s: f16_act_operands(q, s, 64), packed)
        for name, kw in (("aq_f16", {}), ("aq_f16_rank", dict(s_ranks=1)), ("aq_f16_ticket", dict(s_ranks=0))):
            row(M, K, N, name, lambda x, kw=kw: act_quant(x, sm, down, 64, out="f16", **kw), xs)
        if a.ab:
            for qk in (1024, 2048, 4096):
                row(M, K, N, f"aq_f16_qk{qk}", lambda x, qk=qk: act_quant(x, sm, down, 64, out="f16", quant_cols=qk), xs)
            row(M, K, N, "aq_f16_r0", lambda x: act_quant(x, sm, down[:0], 64, out="f16"), xs)
            row(M, K, N, "aq_packed_r0", lambda x: act_quant(x, sm, down[:0], 64), xs)
            s_sets = [(q, sc, act_quant(x, sm, down, 64)[2]) for (x, ), (q, sc) in zip(xs, packed)]
            for name, env in (("gemm_packed", {}), ("gemm_packed_dec16=0", {"LOWRANK_GEMM_DECODE_F16": "0"})):
                with scoped_env(**{**dict.fromkeys(switches), **env}):
                    row(M, K, N, name,
                        lambda q, sc, s: w4a4_gemm(q, sc, p["qweight"], p["wscales"], s, p["lora_up"], bias), s_sets)
        lref = svdq_linear_ref(xs[0][0], **p, bias=bias)
        settings = [("layer_aq16=0", {"LOWRANK_GEMM_ACT_QUANT_F16": "0"}), ("layer_aq16=1", {}),
                    ("layer_dec16=0", {"LOWRANK_GEMM_DECODE_F16": "0"})]
        if a.ab:
            settings += [("layer_aq16=0_pdl0", {"LOWRANK_GEMM_ACT_QUANT_F16": "0", "LOWRANK_GEMM_PDL": "0"}),
                         ("layer_aq16=1_pdl0", {"LOWRANK_GEMM_PDL": "0"})]
        if M <= 32:
            settings += [("layer_dec16_aq16=0", {"LOWRANK_GEMM_DECODE_F16": "1", "LOWRANK_GEMM_ACT_QUANT_F16": "0"}),
                         ("layer_dec16_aq16=1", {"LOWRANK_GEMM_DECODE_F16": "1"})]
        for name, env in settings:
            with scoped_env(**{**dict.fromkeys(switches), **env}):
                y = w4a4_linear(xs[0][0], **p, bias=bias, out_dtype=torch.float32)
                err = float((y.double().cpu() - lref.cpu()).norm() / lref.cpu().norm())
                if err > 1e-3:
                    print(f"FAIL {name} M={M}: rel. err {err:.3g} against the spec", flush=True)
                row(M, K, N, name, lambda x: w4a4_linear(x, **p, bias=bias), xs, err)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        row(M, K, N, "cublas_bf16", lambda x: x @ w.t(), xs)
    write_err_table("probe_act_quant_f16", meta, rows, a.out)
    return 0


def chain_rows(M, K, N, p, bias, xs, row):
    """act_quant(packed) then the GEMM op on its outputs in one graph: the op builds its token operand with
    expand_act_f8 (M ≤ 16) or f16_act_operands (17–48), mid-chain. One row per operand-kernel PDL trigger (outputs
    checked bit-identical to the first; "default" = the committed per-operand choice), one with PDL off everywhere,
    and the two launches apart."""
    from _scoped_env import scoped_env
    from lowrank_gemm.kernels import w4_expand
    from lowrank_gemm.kernels.act_quant import act_quant
    from lowrank_gemm.kernels.w4a4_gemm import w4a4_gemm
    sm, down = p["smooth"], p["lora_down"]

    def chain(x):
        q, sc, s = act_quant(x, sm, down, 64)
        return w4a4_gemm(q, sc, p["qweight"], p["wscales"], s, p["lora_up"], bias)

    ref, saved = None, w4_expand.OPERAND_PDL_TRIGGER
    try:
        for trig in ("default", *w4_expand._OPERAND_PDL_TRIGGERS):
            w4_expand.OPERAND_PDL_TRIGGER = saved if trig == "default" else dict.fromkeys(saved, trig)
            y = chain(xs[0][0])
            ref = y if ref is None else ref
            if not torch.equal(y, ref):
                print(f"FAIL chain M={M}: trigger {trig} changes the output", flush=True)
            row(M, K, N, f"chain_{trig}", chain, xs)
    finally:
        w4_expand.OPERAND_PDL_TRIGGER = saved
    with scoped_env(LOWRANK_GEMM_PDL="0"):
        row(M, K, N, "chain_pdl0", chain, xs)
    row(M, K, N, "aq_packed", lambda x: act_quant(x, sm, down, 64), xs)
    s_sets = [act_quant(x, sm, down, 64) for (x, ) in xs]
    row(M, K, N, "gemm_packed", lambda q, sc, s: w4a4_gemm(q, sc, p["qweight"], p["wscales"], s, p["lora_up"], bias),
        s_sets)


if __name__ == "__main__":
    raise SystemExit(main())
