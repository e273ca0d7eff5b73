"""The W4A8 decode layer on the decode kernel's e4m3 path (``act_quant_e4m3(out="xab")``,
``LOWRANK_GEMM_A8_DECODE_XAB=1``) against its fp16 path (the default until measured), beside the W4A4 layer and
cuBLAS bf16, CUDA-graph µs in one process (session 43). Also the two W4A8 outputs' relative difference and each
one's relative error against the float64 spec. Prints ROW lines; ``--out DIR`` writes a8_decode_xab.json.

    PYTHONPATH=src python3 scripts/probe_a8_decode_xab.py [--out DIR]
"""

from __future__ import annotations

import argparse

import torch

from _decode_probe import dump_rows, svdq_layer, timed_row
from _scoped_env import scoped_env
from lowrank_gemm.kernels.w4a4_gemm import w4a4_linear
from lowrank_gemm.reference import svdq_linear_ref

N, K = 28672, 4096


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = []
    wb = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    for m in (1, 4, 16):
        p, bias, sets = svdq_layer(m, N, K)
        timed_row(rows, {"M": m, "case": "cublas_bf16"}, lambda x: x @ wb.T, sets)
        timed_row(rows, {"M": m, "case": "w4a4 layer"}, lambda x: w4a4_linear(x, bias=bias, **p), sets)
        x0 = sets[0][0]
        ref = svdq_linear_ref(x0, bias=bias, act_bits=8, **p)
        outs = {}
        for name, on in (("f16", "0"), ("xab", "1")):
            with scoped_env(LOWRANK_GEMM_A8_DECODE_XAB=on):
                y = w4a4_linear(x0, bias=bias, act_bits=8, out_dtype=torch.float32, **p)
                same = torch.equal(y, w4a4_linear(x0, bias=bias, act_bits=8, out_dtype=torch.float32, **p))
                outs[name] = y
                timed_row(rows, {"M": m, "case": f"w4a8 layer {name}", "rel_err": _rel(y, ref), "same_bits": same},
                          lambda x: w4a4_linear(x, bias=bias, act_bits=8, **p), sets)
        rows.append({"M": m, "case": "w4a8 xab vs f16", "rel_diff": _rel(outs["xab"], outs["f16"])})
        print("ROW", rows[-1], flush=True)
    dump_rows(args.out, "a8_decode_xab", rows)


if __name__ == "__main__":
    main()
