"""Is the 8192² decode gap in the base GEMM's balance over the SMs? (written in session 30; not yet run)

At K = N = 8192, M ≤ 16 the table's plan runs 128 swap-AB main tiles (64 W rows × 256-deep K steps, 5 stages,
~200 KB of shared memory: one CTA per SM) beside 4 S producers, and lands at 1.02–1.03× cuBLAS. Session 29 put
the best bare GEMM of ours at 34.0–34.5 µs against cuBLAS 34.5–35.4; the branch costs ~1.5 µs there against ~0.9
at 4096² (NOTES.md, session 30). This probe times, in one process and paired against cuBLAS (kloop is left out:
on swap-AB tiles it needs block_r ≥ 64):

- ``bare``: our GEMM alone (rank 0) on the table's tile, unsplit;
- ``bare skS bkB sT``: split-K S (``fixup``: in-launch reduction by the last piece to arrive, or ``reduce``: a second
  launch) on B-deep K steps with T stages, so that two to four CTAs share an SM and the grid covers all 132;
- ``split skS …``: the same split with S from the PDL-chained down kernel;
- ``auto``.

If a bare split reaches ≤ 34.0 µs at M = 1 / 16, in-grid S producers (words) combined with the fixup finisher are the
next build (``lora_main_kernel`` forbids S_PRODUCERS with FIXUP today); if none beats ``bare``, the gap is the
branch's ~1.5 µs and the 8192² cells stay out of reach with this design.

    PYTHONPATH=src python scripts/probe_splitk_decode.py --out DIR [--points M:K:N:r,...] [--list]
"""

from __future__ import annotations

import json

import torch
from _points import points_and_out, probe_parser   # scripts/_points.py (this script's folder is on sys.path)

from lowrank_gemm.bench.common import device_meta, paired_ratio, time_graph
from lowrank_gemm.bench.lora import SCALE, make_sets
from lowrank_gemm.kernels.lora_gemm import lora_linear, run_strategy
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.plan.planner import can_implement, load_tuned, plan_lora, tuned_key
from lowrank_gemm.plan.tuned import TUNED_DIR
from lowrank_gemm.reference import lora_linear_ref

DEFAULT_POINTS = [(1, 8192, 8192, 16), (16, 8192, 8192, 16), (1, 4096, 4096, 16)]
SPLITS = ((2, 256, 2), (2, 128, 4), (3, 128, 3), (4, 128, 2), (2, 128, 6))   # (split_k, block_k, stages)


def variants(M, N, K, r):
    """[(name, strategy, rank, KernelConfig)] for one point; the ones the planner's feasibility check rejects are
    printed and left out."""
    if torch.cuda.is_available():
        _, table = plan_lora(M, N, K, r, torch.bfloat16, torch.device("cuda", 0))
    else:   # --list on a CPU machine: the H200 table's entry
        entry = load_tuned(TUNED_DIR / "lora_h200.json")[tuned_key(M, N, K, r, torch.bfloat16)]
        table = KernelConfig(**entry["config"])
    base = table.replace(s_producers=0)
    out = [("bare", "split", 0, base)]
    for sk, bk, st in SPLITS:
        for mode in ("fixup", "reduce"):
            cfg = base.replace(split_k=sk, split_mode=mode, block_k=bk, num_stages=st)
            out.append((f"bare sk{sk} {mode} bk{bk} s{st}", "split", 0, cfg))
        fix = base.replace(split_k=sk, split_mode="fixup", block_k=bk, num_stages=st)
        out.append((f"split sk{sk} bk{bk} s{st}", "split", r, fix))
    kept = []
    for name, strategy, rank, cfg in out:
        ok = can_implement(strategy, (M, N, K, max(rank, 1)), cfg)
        if ok:
            kept.append((name, strategy, rank, cfg))
        else:
            print(f"{M}:{K}:{N}:{r} {name}: rejected — {ok.reason.splitlines()[0]}", flush=True)
    return kept


def main():
    ap = probe_parser()
    ap.add_argument("--list", action="store_true", help="print the variants the planner accepts and stop")
    args = ap.parse_args()
    points, out = points_and_out(args, DEFAULT_POINTS)
    if args.list:
        for p in points:
            for name, strategy, rank, cfg in variants(*p):
                print(p, name, strategy, rank, cfg)
        return
    rows = []
    for M, K, N, r in points:
        sets = make_sets(M, N, K, r, torch.bfloat16, "cuda")
        x, w, a, b, _ = sets[0]
        refs = {0: x.double() @ w.double().T, r: lora_linear_ref(x, w, a, b, SCALE)}
        cublas = lambda x, w, a, b, bs: x @ w.T  # noqa: E731
        base = dict(M=M, K=K, N=N, r=r)
        rows.append(dict(base, impl="cublas", graph_us=round(time_graph(cublas, sets).median_us, 3)))
        auto = lambda x, w, a, b, bs: lora_linear(x, w, a, b, SCALE)  # noqa: E731
        todo = [("auto", auto, r)]
        for name, strategy, rank, cfg in variants(M, N, K, r):
            def fn(x, w, a, b, bs, strategy=strategy, rank=rank, cfg=cfg):
                return run_strategy(strategy, x, w, a[:rank], b[:, :rank], SCALE, None, cfg)
            todo.append((name, fn, rank))
        for name, fn, rank in todo:
            try:
                y = fn(*sets[0])
                torch.cuda.synchronize()
                err = float((y.double() - refs[rank]).norm() / refs[rank].norm())
                rows.append(dict(base, impl=name, rank=rank, rel_err=round(err, 6),
                                 graph_us=round(time_graph(fn, sets).median_us, 3),
                                 **paired_ratio(fn, sets, cublas, sets)))
            except Exception as e:  # noqa: BLE001 — a variant that fails to compile or launch is a row, not the end
                rows.append(dict(base, impl=name, rank=rank, error=f"{type(e).__name__}: {e}"[:300]))
            print(json.dumps(rows[-1]), flush=True)
        (out / "splitk_decode.json").write_text(json.dumps({"meta": device_meta(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
