"""Where the W4A8 layer's time goes beside its GEMM (session 41): its quantizer (act_quant_e4m3) against act_quant, on the
FLUX shapes, CUDA-graph µs in one process. Prints ROW lines; ``--out DIR`` also writes a8_parts.json.

    PYTHONPATH=src python3 scripts/probe_a8_parts.py [--out DIR]
"""

from __future__ import annotations

import argparse

import torch

from _decode_probe import dump_rows, timed_row
from lowrank_gemm.kernels.act_e4m3 import act_quant_e4m3
from lowrank_gemm.kernels.act_quant import act_quant

SHAPES = [(4608, 3072), (4608, 12288), (64, 4096), (1, 4096)]      # (M, K); r = 32


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = "cuda"
    rows = []
    for m, k in SHAPES:
        def make():
            return (torch.randn(m, k, device=dev, dtype=torch.bfloat16), (torch.rand(k, device=dev) + 0.5).bfloat16(),
                    (torch.randn(32, k, device=dev) * 0.02).bfloat16())
        sets = [make() for _ in range(4)]
        for name, fn in (("act_quant packed", lambda x, lam, a: act_quant(x, lam, a)),
                         ("act_quant f8", lambda x, lam, a: act_quant(x, lam, a, out="f8")),
                         ("act_quant_e4m3", lambda x, lam, a: act_quant_e4m3(x, lam, a))):
            timed_row(rows, {"M": m, "K": k, "part": name}, fn, sets)
    dump_rows(args.out, "a8_parts", rows)


if __name__ == "__main__":
    main()
