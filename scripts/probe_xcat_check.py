"""Probe: the x-concat kernel's correctness and speed per config on the GPU (session 15: kcat's error was 3–4× the
other strategies' at M ≥ 1024, where xcat_plan picks 64-row blocks, and repeats were not bit-identical there).

    PYTHONPATH=src python scripts/probe_xcat_check.py [ROWSxSLICESxSTAGESxWARPS,... [MxKxR,...]]
Per (M, K) and config (rows, K slices, stages, warps): x copied exactly?, S's error vs float64, five repeats
bit-identical?, CUDA-graph µs."""
import torch

from lowrank_gemm.bench.common import time_graph
from lowrank_gemm.kernels.lora_kcat import build_xcat, r_padded

import sys

CONFIGS = [(64, 8, 3, 4), (64, 8, 1, 4), (64, 8, 3, 8), (64, 8, 2, 4), (32, 8, 3, 4), (16, 8, 3, 4), (64, 1, 3, 4),
           (128, 8, 3, 8)]
SHAPES = ((1024, 4096, 16), (4096, 4096, 16), (4096, 8192, 64), (256, 4096, 16))
if len(sys.argv) > 1:       # rows x slices x stages x warps,...  [MxKxr,...]
    CONFIGS = [tuple(map(int, c.split("x"))) for c in sys.argv[1].split(",")]
if len(sys.argv) > 2:
    SHAPES = [tuple(map(int, c.split("x"))) for c in sys.argv[2].split(",")]
for M, K, r in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    a = (torch.randn(r, K, device="cuda", generator=g) / K ** 0.5).bfloat16()
    rp = r_padded(r)
    s_ref = 0.5 * x.double() @ a.double().t()
    for bm, sp, st, nw in CONFIGS:
        def f(x=x, a=a, bm=bm, sp=sp, st=st, nw=nw):
            return build_xcat(x, a, 0.5, rp, block_m=bm, split=sp, num_stages=st, num_warps=nw)
        ys = [f() for _ in range(5)]
        y = ys[0]
        copy_ok = torch.equal(y[:, :K], x)
        bad_rows = int((y[:, :K] != x).any(1).sum())
        s_err = float((y[:, K:K + r].double() - s_ref).norm() / s_ref.norm())
        pad_ok = bool((y[:, K + r:] == 0).all())
        same = all(torch.equal(y, z) for z in ys[1:])
        t = time_graph(f, [()]).median_us
        print(f"M={M} K={K} r={r} bm={bm} split={sp} stages={st} warps={nw}: copy {copy_ok} (bad rows {bad_rows}) "
              f"S err {s_err:.2e} pad {pad_ok} repeat-equal {same}  {t:.1f} us", flush=True)
