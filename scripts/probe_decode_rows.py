"""Why does a 64-row tile run slower on 32 tokens than on 64? (session 59)

    PYTHONPATH=src python scripts/probe_decode_rows.py --out DIR [--shapes KxN,…] [--ms 17,24,…] [--r 16]

Session 59's tuner (``probes/s59/s59a``, H100) timed the same plan — kloop 64×64×128, 6 stages — at 27.1–27.6 µs for
M = 32 and 23.7–23.9 µs for M = 64 at K = N = 5120 (cuBLAS 22.3 / 22.4), and 14.6–14.8 against 13.7 at
2048→5632. Per (K, N) and M, in one process, each as CUDA-graph replays over rotated inputs after a check against
fp32 into a NaN-poisoned output: cuBLAS; kloop and split on that tile at rank r; the same tile at rank 0 (the bare
main loop); kloop on a 64-row copy of x whose rows past M are zero (what the tile costs without TMA's zero fill,
slow since session 6); split with swap_ab on token tiles of the next power of two ≥ M (``SWAPS``); and ``auto``
(the op as the planner routes it, its plan in the row). Writes ``decode_rows.json`` / ``.md`` under DIR.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

# the two shapes where s59a saw it, then issue 2's three families (the branch `swap32` would replan all of them)
SHAPES = [(5120, 5120), (2048, 5632), (4096, 28672), (4096, 4096), (8192, 8192)]
MS = [24, 32, 48, 64]
# swap-AB split tiles (tokens on the wgmma's N, block_m = the next power of two ≥ M): (block_n, block_k)
SWAPS = [(64, 256), (64, 128), (128, 64)]


def main(argv=None) -> int:
    from lowrank_gemm.bench.common import checked_timing, parse_shapes, rotation_count, write_probe
    from lowrank_gemm.kernels.lora_gemm import lora_linear, run_strategy
    from lowrank_gemm.plan.config import KernelConfig
    from lowrank_gemm.kernels.schedule import next_pow2
    from lowrank_gemm.plan.planner import block_r_for, lora_ledger, plan_lora, stages_for

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default=None, help="KxN,…")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--r", type=int, default=16)
    args = ap.parse_args(argv)
    shapes = parse_shapes(args.shapes, dims=2) if args.shapes else SHAPES
    ms = [int(m) for m in args.ms.split(",")]
    r, dt, dev = args.r, torch.bfloat16, "cuda"

    def tile(strategy, rank, bm=64, bn=64, bk=128, swap=False):
        c = KernelConfig(block_m=bm, block_n=bn, block_k=bk, block_r=block_r_for(max(rank, 1)), group_m=1,
                         num_warps=4, swap_ab=swap)
        return c.replace(num_stages=stages_for(lambda s: lora_ledger(strategy, c.replace(num_stages=s))))

    rows = []
    for K, N in shapes:
        for M in ms:
            n = rotation_count(2 * (M * K + N * K + M * N + r * (K + N)))
            g = torch.Generator(device=dev).manual_seed(M)
            sets = [(torch.randn(M, K, device=dev, dtype=dt, generator=g),
                     torch.randn(N, K, device=dev, dtype=dt, generator=g) / K ** 0.5,
                     torch.randn(r, K, device=dev, dtype=dt, generator=g) / K ** 0.5,
                     torch.randn(N, r, device=dev, dtype=dt, generator=g) / r ** 0.5) for _ in range(n)]
            x, w, a, b = (t.float() for t in sets[0])
            ref = x @ w.T + (x @ a.T) @ b.T
            ref0 = x @ w.T
            a0 = torch.empty(0, K, device=dev, dtype=dt)
            b0 = torch.empty(N, 0, device=dev, dtype=dt)
            padded = [(torch.cat([s[0], torch.zeros(64 - M, K, device=dev, dtype=dt)]) if M < 64 else s[0],) + s[1:]
                      for s in sets]

            def ours(strategy, rank0=False, **tile_kw):
                cfg = tile(strategy, 0 if rank0 else r, **tile_kw)

                def fn(x, w, a, b, out=None):
                    if rank0:
                        return run_strategy(strategy, x, w, a0, b0, 1.0, None, cfg, out=out)
                    return run_strategy(strategy, x, w, a, b, 1.0, None, cfg, out=out)
                return fn, cfg

            impls = [("cublas", lambda x, w, a, b, out=None: x @ w.T, None, False, False)]
            for label, strategy, rank0, pad in (("kloop", "kloop", False, False), ("split", "split", False, False),
                                                ("bare (split, rank 0)", "split", True, False),
                                                ("kloop on x padded to 64 rows", "kloop", False, True)):
                fn, cfg = ours(strategy, rank0)
                impls.append((label, fn, cfg, rank0, pad))
            tokens = max(16, next_pow2(M))
            for bn, bk in SWAPS:
                fn, cfg = ours("split", bm=tokens, bn=bn, bk=bk, swap=True)
                impls.append((f"split swap {tokens}x{bn}x{bk}", fn, cfg, False, False))
            strategy, cfg = plan_lora(M, N, K, r, dt, torch.device(dev))
            impls.append((f"auto ({strategy})", lambda x, w, a, b: lora_linear(x, w, a, b, 1.0), cfg, False, False))
            base = None
            for label, fn, cfg, rank0, pad in impls:
                row = {"M": M, "K": K, "N": N, "r": 0 if rank0 or label == "cublas" else r, "impl": label,
                       "config": None if cfg is None else
                       f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} s{cfg.num_stages} br{cfg.block_r}"
                       + (" swap" if cfg.swap_ab else "")}
                use = padded if pad else sets
                row.update(checked_timing(fn, use, ref0 if (rank0 or label == "cublas") else ref,
                                          out_rows=use[0][0].shape[0],
                                          takes_out=label != "cublas" and not label.startswith("auto")))
                base = row.get("us") if label == "cublas" else base
                row["x_cublas"] = round(row["us"] / base, 3) if base and "us" in row else None
                rows.append(row)
                print(f"ROW K={K} N={N} M={M} {label:<30} us {row.get('us')} x{row.get('x_cublas')} "
                      f"{row.get('error', '')}", flush=True)
            del sets, padded
            torch.cuda.empty_cache()
    write_probe("decode_rows", "One 64-row tile at M = 17…64 tokens", rows,
                [("K", "K"), ("N", "N"), ("M", "M"), ("r", "r"), ("impl", "impl"), ("config", "config"), ("µs", "us"),
                 ("× cuBLAS", "x_cublas"), ("rel err", "rel_err"), ("error", "error")], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
