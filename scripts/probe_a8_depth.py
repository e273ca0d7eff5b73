"""The W4A8 GEMM (v2 A8 route) at the FLUX shapes per in-flight depth and orientation (trans) (sessions 41–42), graph µs in
one process beside fp8 ``_scaled_mm`` and the routed W4A4 GEMM. Prints ROW lines; ``--out DIR`` writes a8_depth.json.

    PYTHONPATH=src python3 scripts/probe_a8_depth.py [--out DIR]
"""

from __future__ import annotations

import argparse

import torch

from _decode_probe import dump_rows, timed_row
from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
from lowrank_gemm.kernels.act_e4m3 import act_quant_e4m3
from lowrank_gemm.kernels.act_quant import act_quant
from lowrank_gemm.kernels.gluon.w4a4_ws import launch_w4a4_v2
from lowrank_gemm.kernels.w4a4_gemm import w4a4_gemm

SHAPES = [(4608, 12288, 3072), (4608, 3072, 12288), (4608, 3072, 3072), (4608, 9216, 3072)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = "cuda"
    rows = []
    for m, n, k in SHAPES:
        def make():
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            lam = (torch.rand(k, device=dev) + 0.5).bfloat16()
            a = (torch.randn(32, k, device=dev) * 0.02).bfloat16()
            b = (torch.randn(n, 32, device=dev) * 0.02).bfloat16()
            qw, sw = quantize_weight_int4(torch.randn(n, k, device=dev) * 0.02, 64)
            x8, t, s = act_quant_e4m3(x, lam, a)
            xq, xs, s4 = act_quant(x, lam, a, out="f8")
            return x8, t, pack_int4(qw), sw, s, b, xq, xs, s4
        sets = [make() for _ in range(2)]

        def a8(**kw):
            def fn(x8, t, wq, sw, s, b, xq, xs, s4):
                out = torch.empty((m, n), device=dev, dtype=torch.bfloat16)
                return launch_w4a4_v2(x8, t, wq, sw, None, s, b, None, out, "int4_g64", 64, **kw)
            return fn
        fp8 = []
        for _ in range(2):
            xa = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
            wb = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()
            fp8.append((xa, wb, torch.ones(m, 1, device=dev), torch.ones(1, n, device=dev)))
        cases = [("fp8_scaled_mm", lambda a_, b_, sa, sb: torch._scaled_mm(a_, b_, sa, sb, out_dtype=torch.bfloat16),
                  fp8),
                 ("w4a4 g64 routed", lambda x8, t, wq, sw, s, b, xq, xs, s4: w4a4_gemm(xq, xs, wq, sw, s4, b), sets)]
        cases += [(f"a8 depth {d}", a8(inflight=d, trans=False), sets) for d in (2, 4)]
        cases += [("a8 trans pairs", a8(inflight=2, trans=True), sets)]
        cases += [(f"a8 trans depth {d}", a8(inflight=d, trans=True), sets) for d in (4, 6)]   # spill-free since s42
        for name, fn, ss in cases:
            timed_row(rows, {"M": m, "N": n, "K": k, "case": name}, fn, ss)
    dump_rows(args.out, "a8_depth", rows)


if __name__ == "__main__":
    main()
