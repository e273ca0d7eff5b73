"""GPU probe (≈ 60 s): the int4_g64 decode kernel's fp16 path (``f16``: exact fp16 operands, no per-group rescale)
beside today's routes, one process, CUDA-graph replays over rotated inputs.

Per shape (K = 4096, N = 28672 by default, rank 32): GEMM rows on one set of packed operands — ``decode_f8`` (the
e4m3 path), ``decode_f16`` (f16 with its token operand built per call by ``w4_expand.f16_act_operands``, torch ops),
``decode_f16_kernel`` (the kernel alone, operands built once), ``auto`` (the GEMM op's route today: v2 at M > 16) —
each first checked against the float64 spec in fp32 output; then the layer (``w4a4_linear``) with
``LOWRANK_GEMM_DECODE_F16`` = 0 / 1, checked against ``svdq_linear_ref``; and ``cublas_bf16`` (x @ Wᵀ). Writes
DIR/probe_decode_f16.{json,md}.

    PYTHONPATH=src python scripts/probe_decode_f16.py --out DIR [--cases MxKxN,…]
"""

from __future__ import annotations

import argparse
import os

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="1x4096x28672,16x4096x28672,32x4096x28672,64x4096x28672")
    a = ap.parse_args()
    from _decode_probe import svdq_layer, write_err_table
    from lowrank_gemm.bench.common import device_meta, parse_shapes, time_graph
    from lowrank_gemm.kernels import w4_expand
    from lowrank_gemm.kernels.gluon import w4a4_decode as d
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    from lowrank_gemm.kernels.w4a4_gemm import w4a4_gemm, w4a4_linear
    from lowrank_gemm.reference import svdq_linear_ref

    meta, rows, r = device_meta(), [], 32
    env = "LOWRANK_GEMM_DECODE_F16"

    def row(M, K, N, impl, fn, sets, err=None):
        t = time_graph(fn, sets).median_us
        x = dict(M=M, K=K, N=N, impl=impl, graph_us=round(t, 2), err=None if err is None else float(f"{err:.3g}"))
        rows.append(x)
        print("ROW", x, flush=True)

    def rel(y, ref):
        return float((y.double().cpu() - ref.cpu()).norm() / ref.cpu().norm())

    for M, K, N in parse_shapes(a.cases, dims=3):
        # GEMM alone: the launcher contract's operands (random codes and scales), three sets for rotation
        sets = [w4.make_operands_v2("int4_g64", M, N, K, r, 64, device="cuda", seed=s) for s in range(3)]
        ref = w4.reference_v2(sets[0])
        o32 = {**sets[0], "out": torch.full((M, N), float("nan"), device="cuda")}
        for impl, kw in (("decode_f8", dict(f8=True)), ("decode_f16", dict(f16=True))):
            o32["out"].fill_(float("nan"))
            err = rel(d.launch_w4a4_decode(**o32, **kw), ref)
            if err > 1e-4:
                print(f"FAIL {impl} M={M}: rel. err {err:.3g} against the spec (fp32 out)", flush=True)
            row(M, K, N, impl, lambda o, kw=kw: d.launch_w4a4_decode(**o, **kw), [(o, ) for o in sets], err)
        # the kernel alone: the token operand built once per set, handed back by a stand-in of f16_act_operands
        prepped = {id(o["x_q"]): w4_expand.f16_act_operands(o["x_q"], o["x_scale"], 64) for o in sets}
        real = w4_expand.f16_act_operands
        w4_expand.f16_act_operands = lambda xq, xs, gs: prepped[id(xq)]
        try:
            row(M, K, N, "decode_f16_kernel", lambda o: d.launch_w4a4_decode(**o, f16=True), [(o, ) for o in sets])
            if M > 16:      # 64 weight rows per tile: twice the CTAs, the deepest ring two of them fit
                base = d.default_decode_config(M, 64, "int4_g64", f16=True).replace(block_n=64)
                cfg = max((base.replace(num_stages=st) for st in range(2, 9)
                           if d.CTAS_PER_SM * d.decode_ledger(base.replace(num_stages=st), 64, "int4_g64",
                                                              lowrank_block=32, f16=True).total()
                           <= d.SM90_SMEM_PER_SM), key=lambda c: c.num_stages)
                row(M, K, N, f"decode_f16_kernel_bn64_s{cfg.num_stages}",
                    lambda o: d.launch_w4a4_decode(**o, f16=True, config=cfg), [(o, ) for o in sets])
        finally:
            w4_expand.f16_act_operands = real
        row(M, K, N, "f16_act_operands", lambda o: real(o["x_q"], o["x_scale"], 64), [(o, ) for o in sets])

        def gemm(o):
            return w4a4_gemm(o["x_q"], o["x_scale"], o["w_q"], o["w_scale"], o["lowrank_act"], o["lora_up"],
                             o["bias"], fmt="int4_g64")
        row(M, K, N, "gemm_auto", gemm, [(o, ) for o in sets], rel(gemm(sets[0]), ref))
        # the layer, both switch positions (read per call)
        p, bias, xs = svdq_layer(M, N, K, r)
        lref = svdq_linear_ref(xs[0][0], **p, bias=bias)
        for flag in ("0", "1"):
            os.environ[env] = flag
            err = rel(w4a4_linear(xs[0][0], **p, bias=bias, out_dtype=torch.float32), lref)
            if err > 1e-3:
                print(f"FAIL layer f16={flag} M={M}: rel. err {err:.3g} against the spec", flush=True)
            row(M, K, N, f"layer_f16={flag}", lambda x: w4a4_linear(x, **p, bias=bias), xs, err)
        os.environ.pop(env)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        row(M, K, N, "cublas_bf16", lambda x: x @ w.t(), xs)
    write_err_table("probe_decode_f16", meta, rows, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
