"""GPU probe (≈ 40 s): the unsigned-activation W4A4 layer (``act_shift``) beside the signed one, one process,
CUDA-graph replays over rotated inputs, GELU-shaped inputs.

Rows per shape: ``signed`` (``w4a4_linear``, act_quant + the auto GEMM), ``unsigned`` (the same weights with
``act_shift``: act_quant's fused / v3 kernel with the shift, then the e4m3 GEMM route), ``unsigned_quant`` (that alone,
``act_quant_shifted``) and ``act_quant`` (the fused signed quantizer alone, e4m3 output). Each layer row is first
checked against the float64 spec (rel. err ≤ 1e-3, fp32 output). Default shapes: FLUX fc2 (4608 × 12288 → 3072,
the GELU-input layer) and decode 4096 → 28672 at M = 1 / 16 / 64. Writes DIR/probe_unsigned.{json,md}.

    PYTHONPATH=src python scripts/probe_unsigned.py --out DIR [--cases MxKxN,…]
"""

from __future__ import annotations

import argparse

import torch



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="4608x12288x3072,1x4096x28672,16x4096x28672,64x4096x28672")
    a = ap.parse_args()
    from _decode_probe import write_err_table
    from lowrank_gemm.bench.common import device_meta, parse_shapes, time_graph
    from lowrank_gemm.bench.w4a4 import unsigned_layer_case
    from lowrank_gemm.formats.int4 import GELU_SHIFT as SHIFT
    from lowrank_gemm.kernels.act_quant import act_quant, act_quant_shifted
    from lowrank_gemm.kernels.w4a4_gemm import w4a4_linear
    from lowrank_gemm.reference import svdq_linear_ref

    meta, rows, r = device_meta(), [], 32
    for M, K, N in parse_shapes(a.cases, dims=3):
        p, bias, sh, fold, draw = unsigned_layer_case(N, K, r, device="cuda", seed=M + K + N, shift=SHIFT)
        lam = p["smooth"]
        sets = [(draw(M), ) for _ in range(3)]
        fns = {"signed": lambda x: w4a4_linear(x, **p, bias=bias),
               "unsigned": lambda x: w4a4_linear(x, **p, bias=fold, act_shift=sh),
               "act_quant": lambda x: act_quant(x, lam, p["lora_down"], 64, out="f8"),
               "unsigned_quant": lambda x: act_quant_shifted(x, lam, p["lora_down"], sh, 64)}
        x0 = sets[0][0]
        errs = {"signed": (w4a4_linear(x0, **p, bias=bias, out_dtype=torch.float32),
                           svdq_linear_ref(x0, **p, bias=bias)),
                "unsigned": (w4a4_linear(x0, **p, bias=fold, act_shift=sh, out_dtype=torch.float32),
                             svdq_linear_ref(x0, **p, bias=bias, act_shift=sh))}
        for name, fn in fns.items():
            err = None
            if name in errs:
                y, ref = errs[name]
                err = float((y.double() - ref).norm() / ref.norm())
                if err > 1e-3:
                    print(f"FAIL {name} M={M} K={K} N={N}: rel. err {err:.3g} against the spec", flush=True)
            t = time_graph(fn, sets).median_us
            row = dict(M=M, K=K, N=N, impl=name, graph_us=round(t, 2), err=None if err is None else round(err, 6))
            rows.append(row)
            print("ROW", row, flush=True)
    write_err_table("probe_unsigned", meta, rows, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
