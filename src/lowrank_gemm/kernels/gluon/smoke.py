"""One small, checked launch of each v2 kernel: the target of scripts/sanitize_gluon.sh.

    python -m lowrank_gemm.kernels.gluon.smoke [--fmt int4_2l|int4_g64|int4_g64_w8|all]

``int4_g64_w8``: the no-expander kernel (pre-expanded weights, coop, two partials in flight) that ``auto`` runs from
``W8_MIN_M`` tokens, pinned at a small shape (M, N % 8 == 0 for its TMA'd scale rows).

Exits non-zero (with shapes and the error) if the output differs from the float64 reference.
"""

import argparse
import sys

import torch

from .w4a4_ws import launch_w4a4_v2, make_operands_v2, reference_v2, two_level_enabled


def normalized_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got = got.detach().cpu().double()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def run_one(fmt, M, N, K, rank, group=64, grid=None, out_dtype=torch.bfloat16, launch_kw=None, **kw):
    ops = make_operands_v2(fmt, M, N, K, rank, group, device="cuda", out_dtype=out_dtype, **kw)
    out = launch_w4a4_v2(**ops, grid=grid, **(launch_kw or {}))
    torch.cuda.synchronize()
    ref = reference_v2(ops)
    return normalized_error(out, ref)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--fmt", default="all", choices=["all", "int4_2l", "int4_g64", "int4_g64_w8"])
    args = ap.parse_args(argv)
    fmts = ([f for f in ("int4_2l", "int4_g64", "int4_g64_w8") if f != "int4_2l" or two_level_enabled()]
            if args.fmt == "all" else [args.fmt])
    bad = 0
    for fmt in fmts:
        # 3 programs over several tiles each, ragged edges, K loop longer than the ring
        if fmt == "int4_g64_w8":
            M, N, lkw = 248, 296, dict(f8=True, expanders=0, coop=True, inflight=True)
        else:
            M, N, lkw = 250, 300, None
        err = run_one(fmt.replace("_w8", ""), M, N, 1024, 16, grid=3, launch_kw=lkw)
        ok = err < 2e-2
        bad += not ok
        print(f"{fmt}: M={M} N={N} K=1024 r=16 grid=3 normalized max error {err:.3e} {'OK' if ok else 'FAIL'}",
              flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
