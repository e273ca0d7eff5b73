"""Which kernel cuBLAS runs for ``x @ W.T`` (bf16) at the issue-2 shapes, and at what time.

    PYTHONPATH=src python scripts/probe_cublas_kernels.py [--out DIR] [--shapes MxKxN,…]

The kernel name carries cuBLAS's tile, cluster shape and split-K / stream-K choice
(e.g. ``..._128x128x64_cluster2x1x1_..._execute_segment_k_off``), which says what our Triton kernels
are compared against where they lose (a cluster > 1 means TMA multicast, which Triton 3.6 cannot emit).
Writes ``cublas_kernels.{json,md}`` under DIR (default: stdout only).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

SHAPES = [(m, k, n) for (k, n) in ((4096, 4096), (4096, 28672), (8192, 8192), (14336, 4096), (4096, 14336),
                                   (4096, 6144), (4096, 1024))
          for m in (1, 16, 64, 256, 1024, 4096)]


def kernels_of(fn, iters=3):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name
            t = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)
            out.setdefault(name, []).append(t)
    return {k: (len(v) // iters, sorted(v)[len(v) // 2]) for k, v in out.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--shapes", default=None, help="MxKxN,… instead of the issue-2 and Llama-3-8B shapes")
    args = ap.parse_args(argv)
    from triton.testing import do_bench

    from lowrank_gemm.bench.common import parse_shapes
    rows = []
    for M, K, N in (parse_shapes(args.shapes, dims=3) if args.shapes else SHAPES):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        fn = lambda: x @ w.T  # noqa: E731
        fn()
        us = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
        ks = kernels_of(fn)
        rows.append({"M": M, "K": K, "N": N, "us": round(us, 2),
                     "kernels": [{"name": k, "per_call": c, "us": round(t, 2)} for k, (c, t) in ks.items()]})
        print(f"M={M} K={K} N={N}: {us:.1f} us  " + " | ".join(f"{c}x {k[:150]} ({t:.1f})" for k, (c, t) in ks.items()),
              flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
        (args.out / "cublas_kernels.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        lines = ["# cuBLAS kernels for x @ W.T (bf16)", "", f"{meta}", "",
                 "| M | K | N | µs (do_bench, no rotation) | kernels (per call) |", "|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['M']} | {r['K']} | {r['N']} | {r['us']} | "
                         + "<br>".join(f"{k['per_call']}× `{k['name']}`" for k in r["kernels"]) + " |")
        (args.out / "cublas_kernels.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
