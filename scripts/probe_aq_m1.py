"""GPU probe (≈ 60 s): where the decode layer's time over its GEMM goes, per weight format — act_quant alone (as the
layer asks it; with quant units of other widths; without the branch), the GEMM alone on its outputs, the layer
(``w4a4_linear``, impl auto, checked against the float64 GEMM on act_quant's packed operands) with act_quant's unit
width overridden, and cuBLAS bf16, in one process, CUDA-graph replays over rotated weight sets (past the L2).
``--knob VAR``: act_quant and the layer again with the env knob VAR = 0 and = 1 (outputs checked bit-identical).

The layer's 3× target at M = 1 (issue 4) needs it within 0.7 µs (int4_g64) / 1.8 µs (int4_2l) of its GEMM alone on
the H200 (NOTES.md, session 40).

    PYTHONPATH=src python scripts/probe_aq_m1.py --out DIR [--ms 1,2] [--fmts int4_2l,int4_g64] [--shapes N:K,…]
        [--widths 512,…] [--knob VAR]

Writes DIR/probe_aq_m1.{json,md}.
"""

from __future__ import annotations

import argparse

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ms", default="1,2")
    ap.add_argument("--fmts", default="int4_2l,int4_g64")
    ap.add_argument("--shapes", default="28672:4096")
    ap.add_argument("--widths", default="512,1024,2048,4096", help="act_quant quant_cols to try ('' for none)")
    ap.add_argument("--knob", default="", help="an on/off env knob: act_quant and the layer again with it =0 and =1 "
                    "(outputs checked bit-identical)")
    a = ap.parse_args()
    from _decode_probe import graph_row, write_err_table
    from _scoped_env import scoped_env
    from lowrank_gemm.bench.common import device_meta, rotation_count
    from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
    from lowrank_gemm.formats.int4_twolevel import pack_weight_2l
    from lowrank_gemm.kernels import w4a4_gemm as wg
    from lowrank_gemm.kernels.act_quant import act_quant
    from lowrank_gemm.reference import w4a4_gemm_ref

    meta, rows = device_meta(), []
    real_aq = wg.act_quant

    def row(*args, **kw):
        graph_row(rows, *args, **kw)

    for fmt in a.fmts.split(","):
        for shape in a.shapes.split(","):
            N, K = (int(v) for v in shape.split(":"))
            g = torch.Generator(device="cuda").manual_seed(N + K)

            def weights():
                w = torch.randn(N, K, device="cuda", generator=g) * 0.02
                if fmt == "int4_2l":
                    wq, wmul, wsc = pack_weight_2l(w, 64)
                    return dict(qweight=wq, wscales=wsc, wmul=wmul)
                q, sc = quantize_weight_int4(w, 64)
                return dict(qweight=pack_int4(q), wscales=sc)
            ws = [weights() for _ in range(min(4, rotation_count(N * K // 2)))]
            common = dict(smooth=(torch.rand(K, device="cuda", generator=g) + 0.5).bfloat16(),
                          lora_down=(torch.randn(32, K, device="cuda", generator=g) * 0.02).bfloat16(),
                          lora_up=(torch.randn(N, 32, device="cuda", generator=g) * 0.02).bfloat16(),
                          bias=torch.randn(N, device="cuda", generator=g).bfloat16())
            sm, down = common["smooth"], common["lora_down"]
            sdt = ws[0]["wscales"].dtype if fmt == "int4_g64" else torch.bfloat16
            for M in (int(v) for v in a.ms.split(",")):
                xs = [torch.randn(M, K, device="cuda", generator=g).bfloat16() for _ in ws]
                tag = f"{fmt}:"
                out = wg._layer_act_out("auto", fmt, M, N, K, 32, 64, xs[0].device, sdt, ws[0]["wscales"])
                early = wg._early_launch("auto", fmt, M, N, K, xs[0].device)

                def aq(x, r0=False, **kw):
                    return act_quant(x, sm, down[:0] if r0 else down, 64, fmt, sdt, out=out, early_launch=early, **kw)
                row(M, K, N, tag + "aq", lambda x: aq(x), [(x, ) for x in xs])
                row(M, K, N, tag + "aq_r0", lambda x: aq(x, r0=True), [(x, ) for x in xs])
                for qk in (int(v) for v in a.widths.split(",") if v):
                    try:
                        row(M, K, N, tag + f"aq_qk{qk}", lambda x, qk=qk: aq(x, quant_cols=qk), [(x, ) for x in xs])
                    except Exception as exc:       # a width the plan rejects
                        print(f"SKIP aq_qk{qk}: {exc}", flush=True)
                ops = [(aq(x), w) for x, w in zip(xs, ws)]
                row(M, K, N, tag + "gemm", lambda o, w: wg.w4a4_gemm(o[0], o[1], w["qweight"], w["wscales"], o[2],
                                                                     common["lora_up"], common["bias"],
                                                                     w_mul=w.get("wmul"), fmt=fmt), ops)
                del ops
                # the float64 GEMM on act_quant's packed operands (the same codes every output mode carries)
                q, sc, s = act_quant(xs[0], sm, down, 64, fmt, sdt)
                ref = w4a4_gemm_ref(q, sc, ws[0]["qweight"], ws[0]["wscales"], s, common["lora_up"], common["bias"],
                                    w_mul=ws[0].get("wmul"), fmt=fmt).cpu()

                def layer(x, w):
                    return wg.w4a4_linear(x, **w, **common, fmt=fmt)
                for qk in (0, *(int(v) for v in a.widths.split(",") if v)):
                    name = "layer" if qk == 0 else f"layer_qk{qk}"
                    if qk:
                        wg.act_quant = lambda *p, qk=qk, **kw: real_aq(*p, quant_cols=qk, **kw)
                    try:
                        y = layer(xs[0], ws[0]).double().cpu()
                        err = float((y - ref).norm() / ref.norm())
                        row(M, K, N, tag + name, layer, list(zip(xs, ws)), err)
                    except Exception as exc:
                        print(f"SKIP {name}: {exc}", flush=True)
                    finally:
                        wg.act_quant = real_aq
                if a.knob:
                    got = {}
                    for v in ("0", "1"):
                        with scoped_env(**{a.knob: v}):
                            row(M, K, N, tag + f"aq:{a.knob[-12:]}={v}", lambda x: aq(x), [(x, ) for x in xs])
                            got[v] = layer(xs[0], ws[0])
                            err = float((got[v].double().cpu() - ref).norm() / ref.norm())
                            row(M, K, N, tag + f"layer:{a.knob[-12:]}={v}", layer, list(zip(xs, ws)), err)
                    if not torch.equal(got["0"], got["1"]):
                        print(f"FAIL {tag} M={M}: {a.knob} changes the layer's output", flush=True)
                wb = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
                row(M, K, N, "cublas_bf16", lambda x, b: x @ b.t(), list(zip(xs, wb)))
                del wb
    write_err_table("probe_aq_m1", meta, rows, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
