"""Does a tile two blocks wide fill the wave where our power-of-two tiles cannot? (session 58; ``kernels/gemm_n2.py``)

    PYTHONPATH=src python scripts/probe_wide_tiles.py --out DIR [--shapes MxKxN,…]

Per shape, in one process, bare GEMMs ``y = x·Wᵀ`` (bf16, no branch): cuBLAS; our LoRA main kernel at rank 0 on
128×256 and 128×128 tiles (the tiles our plans run, ``run_strategy`` with an empty branch); and ``gemm_n2`` on
128 × (128 + 64), 128 × (128 + 32), 64 × (128 + 64) and 128 × (128 + 128) — the last the same area as 128×256 in two
wgmmas, the control for what the second dot costs. Each is first checked against fp32 into a NaN-poisoned output,
then timed as CUDA-graph replays over rotated inputs. Writes ``wide_tiles.json`` / ``.md`` under DIR.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

SHAPES = [(256, 4096, 11008), (1024, 8192, 3072), (512, 4096, 11008), (256, 3072, 16384), (256, 4096, 28672),
          (1024, 5120, 13824), (256, 4096, 4096)]
# (label, block_m, block_n0, block_n1, warps)
N2 = [("n2 128x(128+64)", 128, 128, 64, 8), ("n2 128x(128+32)", 128, 128, 32, 8), ("n2 64x(128+64)", 64, 128, 64, 4),
      ("n2 128x(128+128)", 128, 128, 128, 8)]
OURS = [("ours 128x256", 128, 256, 8), ("ours 128x128", 128, 128, 4)]


def main(argv=None) -> int:
    from lowrank_gemm.bench.common import checked_timing, parse_shapes, rotation_count, write_probe
    from lowrank_gemm.kernels.gemm_n2 import gemm_n2, n2_stages, n2_tiles
    from lowrank_gemm.kernels.lora_gemm import run_strategy
    from lowrank_gemm.kernels.schedule import cdiv, num_sms
    from lowrank_gemm.plan.config import KernelConfig
    from lowrank_gemm.plan.planner import lora_ledger, stages_for

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default=None, help="MxKxN,…")
    args = ap.parse_args(argv)
    shapes = parse_shapes(args.shapes, dims=3) if args.shapes else SHAPES
    sms = num_sms(torch.device("cuda", torch.cuda.current_device()))
    rows = []
    for M, K, N in shapes:
        n = rotation_count(2 * (M * K + N * K + M * N))
        sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
                 torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5) for _ in range(n)]
        ref = sets[0][0].float() @ sets[0][1].float().T
        a0 = torch.empty(0, K, device="cuda", dtype=torch.bfloat16)
        b0 = torch.empty(N, 0, device="cuda", dtype=torch.bfloat16)
        impls = [("cublas", None, lambda x, w, out=None: x @ w.T)]
        for label, bm, bn, warps in OURS:
            cfg = KernelConfig(block_m=bm, block_n=bn, block_k=64, block_r=16, group_m=2, num_warps=warps)
            cfg = cfg.replace(num_stages=stages_for(lambda st: lora_ledger("split", cfg.replace(num_stages=st))))
            impls.append((label, cdiv(M, bm) * cdiv(N, bn),
                          (lambda c: lambda x, w, out=None: run_strategy("split", x, w, a0, b0, 1.0, None, c,
                                                                         out=out))(cfg)))
        for label, bm, bn0, bn1, warps in N2:
            st = n2_stages(bm, bn0, bn1, 64)
            impls.append((f"{label} s{st}", n2_tiles(M, N, bm, bn0, bn1),
                          (lambda bm, bn0, bn1, warps: lambda x, w, out=None: gemm_n2(
                              x, w, block_m=bm, block_n0=bn0, block_n1=bn1, num_warps=warps, out=out))(
                              bm, bn0, bn1, warps)))
        base = None
        for label, tiles, fn in impls:
            row = {"M": M, "K": K, "N": N, "impl": label, "tiles": tiles,
                   "waves": round(tiles / sms, 2) if tiles else None}
            row.update(checked_timing(fn, sets, ref, takes_out=label != "cublas"))
            base = row.get("us") if label == "cublas" else base
            row["x_cublas"] = round(row["us"] / base, 3) if base and "us" in row else None
            rows.append(row)
            print(f"M={M} K={K} N={N} {label:<24} tiles {tiles} us {row.get('us')} x{row.get('x_cublas')} "
                  f"{row.get('error', '')}", flush=True)
        del sets
        torch.cuda.empty_cache()
    write_probe("wide_tiles", "Bare GEMM: two-block-wide tiles against ours and cuBLAS", rows,
                [("M", "M"), ("K", "K"), ("N", "N"), ("impl", "impl"), ("tiles", "tiles"), ("waves", "waves"),
                 ("µs", "us"), ("× cuBLAS", "x_cublas"), ("rel err", "rel_err"), ("error", "error")], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
