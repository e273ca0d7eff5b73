"""The W4A8 decode layer per PDL trigger of its quantizer (``w4_expand.OPERAND_PDL_TRIGGER["e4m3_rows"]``: off /
early / after_wait), beside the W4A4 layer, CUDA-graph µs in one process (session 41). The outputs must be
bit-identical across triggers. Prints ROW lines; ``--out DIR`` writes a8_pdl.json.

    PYTHONPATH=src python3 scripts/probe_a8_pdl.py [--out DIR]
"""

from __future__ import annotations

import argparse

import torch

from _decode_probe import dump_rows, svdq_layer, timed_row
from lowrank_gemm.kernels import w4_expand
from lowrank_gemm.kernels.w4a4_gemm import w4a4_linear

N, K = 28672, 4096


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = []
    for m in (1, 16, 64):
        p, bias, sets = svdq_layer(m, N, K)
        timed_row(rows, {"M": m, "case": "w4a4 layer"}, lambda x: w4a4_linear(x, bias=bias, **p), sets)
        ref = None
        for trig in ("off", "early", "after_wait"):
            w4_expand.OPERAND_PDL_TRIGGER["e4m3_rows"] = trig
            y = w4a4_linear(sets[0][0], bias=bias, act_bits=8, **p)
            torch.cuda.synchronize()
            same = ref is None or torch.equal(y, ref)
            ref = y if ref is None else ref
            timed_row(rows, {"M": m, "case": f"w4a8 layer, trigger {trig}", "same_bits": same},
                      lambda x: w4a4_linear(x, bias=bias, act_bits=8, **p), sets)
        w4_expand.OPERAND_PDL_TRIGGER["e4m3_rows"] = "off"
    dump_rows(args.out, "a8_pdl", rows)


if __name__ == "__main__":
    main()
