"""Session 29: LoRA ``split`` on narrow swap-AB tiles (16 / 32 weight rows per program: mma.sync, 2–4× the programs
of today's 64-row wgmma tiles) at decode M, against cuBLAS and today's ``auto`` in one process.

``probe_lora_gemv.py`` (call 1) found the bare skinny mma.sync GEMM on 32-row tiles at 12.8 µs at K = N = 4096
(cuBLAS 13.7 / 14.6 at M = 1 / 16, today's auto 14.3), and at 8192² 34.5–35 µs (cuBLAS 34.5 / 35.0, auto 36.7).
Here the real op (``split``: PDL down kernel or in-grid S producers, the main kernel's K loop, the prefetched B
epilogue) runs on those tiles. Every candidate: NaN-poisoned output, float64 reference (rel err ≤ 1e-2), a
bit-identical second call, then a CUDA-graph median (bench.common.time_graph, rotated inputs); the best
candidate per point is then timed in alternation with cuBLAS (bench.common.paired_ratio).

Outcome (call 2, NOTES.md session 29): the narrow tiles lost at every point (4096²: 15.0–16.0 µs against auto's
14.3–14.9; 8192² M = 1: 41 against 36.5), so ``KernelConfig.swap_ab_mismatch`` was put back to block_n ≥ 64 and the
NARROW rows now report "infeasible"; to rerun them, let it accept block_n 16 / 32 (mma.sync) again. ``--wide``
(calls 6 and 8) times the 64-row tiles with 0/2/4/8 in-grid S producers.

Usage: python scripts/probe_lora_narrow_swap.py --out DIR [--points M:K:N:r,...] [--wide]
"""

from __future__ import annotations

import json
import time

import torch
from _points import points_and_out, probe_parser   # scripts/_points.py (this script's folder is on sys.path)

from lowrank_gemm.bench.common import device_meta, paired_ratio, time_graph
from lowrank_gemm.bench.lora import SCALE, make_sets
from lowrank_gemm.kernels.lora_gemm import lora_linear, run_strategy
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.plan.planner import block_r_for, can_implement, pinned
from lowrank_gemm.reference import lora_linear_ref

TOL = 1e-2
DEFAULT_POINTS = [(M, K, N, r) for (K, N) in ((4096, 4096), (8192, 8192)) for M in (1, 16) for r in (8, 16, 64)]

# (block_n, block_k, num_warps, num_stages, s_producers)
NARROW = [(32, 256, 4, 4, 0), (32, 256, 4, 4, 4), (32, 256, 2, 4, 0), (32, 128, 4, 6, 0), (16, 512, 2, 3, 0),
          (16, 256, 1, 4, 0), (16, 256, 2, 5, 0), (32, 512, 4, 3, 0)]
# --wide (call 6): today's 64-row wgmma tiles with and without in-grid S producers (the r16 table entry at 4096² is
# 64x256 s5 prod4; r8 falls to the heuristic and r64 to split + PDL)
WIDE = [(64, 256, 4, 5, 0), (64, 256, 4, 5, 4), (64, 256, 4, 5, 2), (64, 256, 4, 5, 8), (64, 128, 4, 6, 4),
        (16, 256, 2, 5, 0)]


def candidates(M, N, K, r, tiles=NARROW):
    br = block_r_for(r)
    out = []
    for bn, bk, warps, stages, prod in tiles:
        c = KernelConfig(block_m=16, block_n=bn, block_k=bk, block_r=br, group_m=1, num_warps=warps,
                         num_stages=stages, swap_ab=True, s_producers=prod)
        feas = can_implement("split", (M, N, K, r), c)
        label = f"split swap {bn}x{bk} w{warps} s{stages}" + (f" prod{prod}" if prod else "")
        out.append((label, c, None if feas else getattr(feas, "reason", str(feas))))
    return out


def _rel_err(y, ref):
    return float((y.double() - ref).norm() / ref.norm())


def probe_point(M, K, N, r, tiles=NARROW):
    sets = make_sets(M, N, K, r, torch.bfloat16, "cuda")
    x, w, a, b, _ = sets[0]
    ref = lora_linear_ref(x, w, a, b, SCALE)
    base = dict(M=M, K=K, N=N, r=r)
    cublas = lambda x, w, a, b, bs: x @ w.T  # noqa: E731
    rows = [dict(base, impl="cublas", graph_us=round(time_graph(cublas, sets).median_us, 3))]
    auto = lambda x, w, a, b, bs: lora_linear(x, w, a, b, SCALE)  # noqa: E731
    rows.append(dict(base, impl="auto", rel_err=round(_rel_err(auto(*sets[0]), ref), 6),
                     graph_us=round(time_graph(auto, sets).median_us, 3)))
    best = None
    for label, c, why in candidates(M, N, K, r, tiles):
        row = dict(base, impl=label, config=c.to_dict())
        if why is not None:
            row["infeasible"] = why
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        try:
            t0 = time.time()
            outs = []
            for _ in range(2):
                y = torch.full((M, N), float("nan"), dtype=x.dtype, device=x.device)
                outs.append(run_strategy("split", x, w, a, b, SCALE, None, c, out=y))
            torch.cuda.synchronize()
            row["first_call_s"] = round(time.time() - t0, 2)
            row["rel_err"] = round(_rel_err(outs[0], ref), 6)
            row["bit_identical"] = bool(torch.equal(outs[0], outs[1]))
            if not (row["rel_err"] <= TOL) or not row["bit_identical"]:
                row["error"] = "wrong or not deterministic"
            else:
                def fn(x, w, a, b, bs, c=c):
                    with pinned(strategy="split", config=c):
                        return lora_linear(x, w, a, b, SCALE)
                row["graph_us"] = round(time_graph(fn, sets).median_us, 3)
                if best is None or row["graph_us"] < best[0]:
                    best = (row["graph_us"], label, fn)
        except Exception as exc:  # noqa: BLE001 — a failing candidate is a row
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)
    for r_ in rows[:2]:
        print(json.dumps(r_), flush=True)
    if best is not None:
        for label, fn in ((best[1], best[2]), ("auto", auto)):
            p = paired_ratio(fn, sets, cublas, sets)
            row = dict(base, impl=f"paired {label}", **{k: (round(v, 4) if isinstance(v, float) else v)
                                                        for k, v in p.items()})
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main():
    ap = probe_parser("M:K:N:r,... (default: 4096² and 8192², M 1 / 16, r 8 / 16 / 64)")
    ap.add_argument("--wide", action="store_true", help="the 64-row tiles ± S producers (WIDE) instead of NARROW")
    args = ap.parse_args()
    points, out = points_and_out(args, DEFAULT_POINTS)
    rows = []
    for p in points:
        rows += probe_point(*p, tiles=WIDE if args.wide else NARROW)
        (out / "narrow_swap.json").write_text(json.dumps({"meta": device_meta(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
