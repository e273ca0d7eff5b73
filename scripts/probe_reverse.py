"""The two-pass row quantizers' second pass last program first (``LOWRANK_GEMM_ACT_QUANT_REVERSE``, session 45) at
the FLUX activation sizes, graph µs in one process, the two orders interleaved twice: act_quant int4_2l (v3) and the
W4A8 quantizer act_quant_e4m3 alone, and the W4A8 layer (quantizer + A8 GEMM). Each order's outputs must be
bit-identical to the other's. Prediction: x of 113 MB (K = 12288) outgrows L2, so the reversed pass re-reads its
first ~25–35 MB from L2 (−5…−10 µs per quantizer); at K = 3072 x (28 MB) stays in L2 in either order (±1 µs).
Prints ROW lines; ``--out DIR`` writes reverse.json.

    PYTHONPATH=src python3 scripts/probe_reverse.py [--out DIR]
"""

from __future__ import annotations

import argparse

import torch

from _decode_probe import dump_rows, svdq_layer, timed_row
from _scoped_env import scoped_env
from lowrank_gemm.kernels.act_e4m3 import act_quant_e4m3
from lowrank_gemm.kernels.act_quant import act_quant
from lowrank_gemm.kernels.w4a4_gemm import w4a4_linear

M = 4608
SHAPES = [(12288, 3072), (3072, 12288)]   # (K, N): fc1's and fc2's activations


def _same(a, b):
    """Bitwise (NaN rows included): every output viewed as bytes."""
    return all(torch.equal(u.contiguous().view(torch.uint8), v.contiguous().view(torch.uint8))
               for u, v in zip(a, b) if u is not None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = []
    for k, n in SHAPES:
        p, bias, sets = svdq_layer(M, n, k, sets=2)
        lam, down = p["smooth"], p["lora_down"]
        cases = {
            "act_quant int4_2l": lambda x: act_quant(x, lam, down, 64, "int4_2l"),
            "act_quant_e4m3": lambda x: act_quant_e4m3(x, lam, down),
            "w4a8 layer": lambda x: w4a4_linear(x, bias=bias, act_bits=8, **p),
        }
        for case, fn in cases.items():
            outs = {}
            for rev in ("0", "1", "0", "1"):
                with scoped_env(LOWRANK_GEMM_ACT_QUANT_REVERSE=rev):
                    y = fn(sets[0][0])
                    outs.setdefault(rev, y if isinstance(y, tuple) else (y, ))
                    timed_row(rows, {"K": k, "N": n, "case": case, "reverse": rev}, fn, sets)
            rows.append({"K": k, "case": case, "same_bits": _same(outs["0"], outs["1"])})
            print("ROW", rows[-1], flush=True)
    dump_rows(args.out, "reverse", rows)


if __name__ == "__main__":
    main()
