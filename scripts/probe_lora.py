"""GPU probe of the single-adapter LoRA GEMM: cuBLAS vs a short candidate list, per shape.

    PYTHONPATH=src python scripts/probe_lora.py --out DIR [--write-tuned PATH] [--quick]
        [--budget-s 105] [--persistent-timeout-s 35] [--no-persistent] [--allow-persistent-winners]
        [--streamk-only] [--allow-streamk-winners]
    PYTHONPATH=src python scripts/probe_lora.py --small-m --out DIR [--write-tuned PATH] [--budget-s 75]
    PYTHONPATH=src python scripts/probe_lora.py --issue2 --out DIR [--budget-s 190] [--write-tuned PATH]

``--issue2`` (session 5; ≤ ~215 s): ISSUE2_POINTS (mid M first) — cuBLAS, today's ``auto`` with the
launch options (``LoraOptions``) off and on, one-launch (fixup, :func:`planner.wave_split`) candidates
with the options on (``issue2_specs``), at the best one an A/B of the options and our rank-0 GEMM at
the same tiles (how much of the gap is the base GEMM). Every plan: NaN-poisoned output, float64
reference (M > 1024: first and last 256 rows), bit-identical second call, then a CUDA-graph median.
A parallel compile warm-up (``--warm-workers`` processes, ``--warm-s``) fills the JIT cache first;
points then run in child processes (a faulting kernel costs its point only). Writes
``probe_lora_issue2.json/.md`` and ``lora_h200.json`` (the table with each point's winner where it
beats today's plan under the same options; other entries kept) under DIR; ``--write-tuned PATH``
also writes that table to PATH.

``--issue2 --swap`` (session 6): the same machinery over SWAP_POINTS (every M ≤ 16 point of issue 2, r 16 and 64;
swap plans lost at every M=64 point) with ``swap_specs`` — ``split`` / ``kloop`` plans whose main K loop is W·Xᵀ
(``KernelConfig.swap_ab``: weight rows as the wgmma M, a 16-token tile as its N; ``probes/s6/probe_box.md``: that
GEMM alone is 0.82–0.98× cuBLAS at M ≤ 16), ``split`` also in one launch with in-grid S producers
(``KernelConfig.s_producers``) — and the op's default launch options (``pdl`` only).

``--small-m`` (issue 2, decode M on few output tiles; ≤ 90 s): per (shape, M) in SMALL_M_POINTS,
cuBLAS base, torch unfused, today's ``auto``, ``auto`` with ``LOWRANK_GEMM_SPLITK_MODE=fixup``, the
heuristic plan, the one-launch split-K kloop (``split_mode="fixup"``) for split ∈ {1, 2, 4, 8} ×
BLOCK_N ∈ {64, 128} (≤ ~2 waves of CTAs), and the 2-launch ``reduce`` mode for the same 128-wide
splits (A/B in one process). Writes ``probe_lora_smallm.json/.md``; ``--write-tuned`` pins each
(shape, M) winner that beats today's ``auto`` into the LoRA tuned table (config incl. split_mode).

For each shape family of the issue (M ∈ 1, 16, 64, 256, 1024, 4096; (K, N) ∈ (4096, 28672),
(4096, 4096), (8192, 8192); r ∈ 16, 64 — the six measured points of lora.md first), in ONE
process: cuBLAS ``x @ W.T`` (no LoRA), the planner's heuristic plan ("heur") and ≤ 5 more
(strategy × tile × split_k × stages) candidates. Each candidate is first checked against the
float64 reference (rel err ≤ 1e-2, into a NaN-poisoned output), then timed as a CUDA-graph replay
(``bench.common.time_graph``, the graph half of ``time_impl``; inputs rotated ≥ 3× L2). A
candidate that fails to compile, raises or is wrong is reported and skipped. Candidate tiles
depend only on the M bucket, so compiled kernels are shared across (K, N).

The persistent strategies (spin-wait on S-ready flags: could hang) run last, in a child process
with a timeout; whatever it printed before a timeout is kept.

Outputs (DIR): ``probe_lora.json`` (every row), ``probe_lora.md`` (table), ``lora_h200.json`` (the
winners in the planner's tuned-table format). ``--write-tuned PATH`` also merges the winners
into PATH (e.g. ``src/lowrank_gemm/plan/tuned/lora_h200.json``). Winners are fused strategies
(kloop / split; persistent only with ``--allow-persistent-winners``, streamk only with
``--allow-streamk-winners``; streamk candidates — ``streamk_specs`` — are timed in the main
process: no inter-program waits, so they cannot hang). Stops starting new points
once ``--budget-s`` is spent (compiles dominate; skipped points are listed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from lowrank_gemm.bench.common import device_meta, markdown_table, time_graph, time_impl
from lowrank_gemm.bench.lora import SCALE, make_sets, nbytes
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.plan.planner import (SPLIT_BLOCK_R, block_r_for, can_implement, group_m_for,
                                       heuristic_lora, lora_ledger, pinned, split_k_for,
                                       stages_for, tuned_key)
from lowrank_gemm.reference import lora_linear_ref

ISSUE_POINTS = [(64, 4096, 28672, 16), (256, 4096, 28672, 16), (64, 4096, 4096, 16),
                (1, 4096, 4096, 16), (1024, 4096, 4096, 64), (4096, 8192, 8192, 16)]  # (M, K, N, r)
MS = (1, 16, 64, 256, 1024, 4096)
KNS = ((4096, 28672), (4096, 4096), (8192, 8192))
RANKS = (16, 64)
PERSISTENT_POINTS = [(64, 4096, 28672, 16), (256, 4096, 28672, 16)]
TOL = 1e-2
MAX_CANDIDATES = 6


def _cdiv(a, b):
    return -(-a // b)


def _cfg(strategy, M, N, K, r, bm, bn, bk, warps, sms, split=None):
    br = block_r_for(r)
    if strategy == "split":
        br = min(br, SPLIT_BLOCK_R)
    npm, npn = _cdiv(M, bm), _cdiv(N, bn)
    if split is None:
        split = 1 if strategy.startswith("persistent") else split_k_for(npm * npn, _cdiv(K, bk), sms)
    c = KernelConfig(block_m=bm, block_n=bn, block_k=bk, block_r=br, group_m=group_m_for(npm),
                     num_warps=warps, num_stages=2, split_k=split)
    c = c.replace(num_stages=stages_for(lambda s: lora_ledger(strategy, c.replace(num_stages=s))))
    return c


def candidates(M, N, K, r, sms):
    """[(label, strategy, KernelConfig)]: the heuristic plan first, then ≤ 5 alternatives."""
    hs, hc = heuristic_lora(M, N, K, r, 16, gpu=True, sms=sms)
    out = [(f"heur {hs} {hc.block_m}x{hc.block_n}x{hc.block_k} w{hc.num_warps} s{hc.num_stages} "
            f"sk{hc.split_k} br{hc.block_r}", hs, hc)]
    if M <= 64:   # memory-bound: wave shape and bytes in flight
        kl = "kloop" if r <= 64 else "split"
        specs = [(kl, 64, 256, 64, 4, None), (kl, 64, 128, 128, 4, None), ("split", 64, 128, 128, 4, None)]
        if _cdiv(N, 128) >= sms:   # ≥ 1 wave of 128-wide tiles: one wave of 256, 8 warps
            specs.append((kl, 64, 256, 64, 8, None))
        else:                      # small N: narrow tiles instead of / besides split-K
            specs += [(kl, 64, 64, 128, 4, None), (kl, 64, 32, 128, 4, 1)]
    else:         # compute-bound: the main loop is the plain GEMM (split); kloop only at M ≤ 256
        specs = [("split", 128, 256, 64, 8, None), ("split", 128, 128, 64, 4, None),
                 ("split", 256, 128, 64, 8, None)]
        if M <= 256:
            specs += [("kloop", 128, 256, 64, 8, None), ("split", 64, 256, 64, 4, None)]
    seen = {(out[0][1], out[0][2])}
    n_stream_k = 0
    for s, bm, bn, bk, w, split in specs + streamk_specs(M, N, K, r):
        if s == "streamk":   # own quota, beyond MAX_CANDIDATES: the tiles-vs-split-K question
            c = _cfg(s, M, N, K, r, bm, bn, bk, w, sms, 1)
            if can_implement(s, (M, N, K, r), c) and (s, c) not in seen:
                seen.add((s, c))
                out.append((f"{s} {bm}x{bn}x{bk} w{w} s{c.num_stages} br{c.block_r}", s, c))
                n_stream_k += 1
            continue
        if len(out) - n_stream_k >= MAX_CANDIDATES:
            continue
        try:
            c = _cfg(s, M, N, K, r, bm, bn, bk, w, sms, split)
        except Exception:
            continue
        if (s, c) in seen or not can_implement(s, (M, N, K, r), c):
            continue
        seen.add((s, c))
        out.append((f"{s} {bm}x{bn}x{bk} w{w} s{c.num_stages} sk{c.split_k} br{c.block_r}", s, c))
    return out


def streamk_specs(M, N, K, r):
    """Stream-K candidates (strategy, bm, bn, bk, warps, split): K=N=4096 at M ≤ 256 and 8192² at
    M ≤ 16, where 32–64 output tiles cannot fill 132 SMs. Wide 128-col tiles (no narrow-tile X
    re-reads, n128 wgmma) with the K work spread evenly over all SMs, one launch, no reduce kernel."""
    if r > 64 or not ((K, N) == (4096, 4096) and M <= 256 or (K, N) == (8192, 8192) and M <= 16):
        return []
    if M <= 64:
        return [("streamk", 64, 128, 128, 4, 1), ("streamk", 64, 256, 64, 4, 1),
                ("streamk", 64, 64, 128, 4, 1)]
    return [("streamk", 128, 128, 64, 8, 1), ("streamk", 128, 256, 64, 8, 1)]


def _checked(strategy, cfg, x, w, a, b):
    """One call into a NaN-poisoned output (run_strategy: same launch path as the op)."""
    from lowrank_gemm.kernels.lora_gemm import run_strategy
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype, device=x.device)
    return run_strategy(strategy, x, w, a, b, SCALE, None, cfg, out=out)


def _call(strategy, cfg):
    from lowrank_gemm.kernels.lora_gemm import lora_linear

    def fn(x, w, a, b, bs):
        with pinned(strategy=strategy, config=cfg):
            return lora_linear(x, w, a, b, SCALE)
    return fn


def _rel_err(y, ref):
    return float((y.double() - ref).norm() / ref.norm())


def _check_then_time(row: dict, fn, y, ref, sets, t0: float) -> None:
    """Record ``y``'s error vs ``ref`` (None: a baseline, not checked) and the first call's seconds (≈ compile
    time when new); time ``fn`` (CUDA-graph median) only if the error is within TOL."""
    torch.cuda.synchronize()
    if ref is not None:
        row["rel_err"] = round(_rel_err(y, ref), 6)
    row["first_call_s"] = round(time.time() - t0, 2)
    if ref is not None and not row["rel_err"] <= TOL:
        row["error"] = f"wrong: rel err {row['rel_err']} > {TOL}"
    else:
        row["graph_us"] = round(time_graph(fn, sets).median_us, 3)


def probe_point(M, K, N, r, sms, timing_eager=False):
    from lowrank_gemm.kernels.lora_gemm import lora_linear
    sets = make_sets(M, N, K, r, torch.bfloat16, "cuda")
    x, w, a, b, _ = sets[0]
    ref = lora_linear_ref(x, w, a, b, SCALE)
    base = {"M": M, "N": N, "K": K, "r": r, "bytes": nbytes(M, N, K, r)}
    rows = []
    t = time_impl(lambda x, w, a, b, bs: x @ w.T, sets, graph=True) if timing_eager else \
        {"graph_us": round(time_graph(lambda x, w, a, b, bs: x @ w.T, sets).median_us, 3)}
    rows.append(dict(base, label="cublas", strategy="cublas", **t))
    if timing_eager:   # host overhead of the op as callers see it (target: eager ≤ graph + 10 µs)
        try:
            auto = lambda x, w, a, b, bs: lora_linear(x, w, a, b, SCALE)
            rows.append(dict(base, label="auto", strategy="auto", rel_err=round(_rel_err(auto(*sets[0]), ref), 6),
                             **time_impl(auto, sets, graph=True)))
        except Exception as exc:
            rows.append(dict(base, label="auto", strategy="auto", error=f"{type(exc).__name__}: {exc}"[:300]))
    for label, s, cfg in candidates(M, N, K, r, sms):
        row = dict(base, label=label, strategy=s, config=cfg.to_dict())
        t0 = time.time()
        try:
            fn = _call(s, cfg)
            y = _checked(s, cfg, *sets[0][:4])
            _check_then_time(row, fn, y, ref, sets, t0)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
    del sets, ref
    return finish_point(rows, base["bytes"])


def finish_point(rows, nbytes=None):
    """Ratios to the point's first row (cuBLAS), bandwidth if ``nbytes``; frees the point's tensors' cache."""
    cub = rows[0]["graph_us"]
    for row in rows:
        if row.get("graph_us"):
            row["x_cublas"] = round(row["graph_us"] / cub, 3)
            if nbytes:
                row["bw_tbps"] = round(nbytes / (row["graph_us"] * 1e-6) / 1e12, 3)
    torch.cuda.empty_cache()
    return rows


STREAMK_POINTS = [(1, 4096, 4096, 16), (16, 4096, 4096, 16), (64, 4096, 4096, 16),
                  (256, 4096, 4096, 16), (1, 8192, 8192, 16), (16, 8192, 8192, 16)]


def points(quick, streamk_only=False):
    if streamk_only:
        return list(STREAMK_POINTS)
    pts = list(ISSUE_POINTS)
    if not quick:
        for r in RANKS:
            for K, N in KNS:
                for M in MS:
                    if (M, K, N, r) not in pts:
                        pts.append((M, K, N, r))
    return pts


# ---------------------------------------------------------------------------- persistent (child)

def persistent_child():
    """Prints one JSON row per line (flushed), so a timeout keeps what finished."""
    from lowrank_gemm.kernels.lora_gemm import lora_linear
    for M, K, N, r in PERSISTENT_POINTS:
        sets = make_sets(M, N, K, r, torch.bfloat16, "cuda")
        ref = lora_linear_ref(*sets[0][:4], SCALE)
        for s in ("persistent_static", "persistent_dynamic"):
            row = {"M": M, "N": N, "K": K, "r": r, "label": s, "strategy": s}
            print(json.dumps(dict(row, status="started")), flush=True)
            try:
                fn = lambda x, w, a, b, bs, s_=s: lora_linear(x, w, a, b, SCALE, strategy=s_)
                y = fn(*sets[0])
                torch.cuda.synchronize()
                from lowrank_gemm.plan.planner import plan_lora
                with pinned(strategy=s):
                    row["config"] = plan_lora(M, N, K, r, torch.bfloat16, torch.device("cuda"))[1].to_dict()
                row["rel_err"] = round(_rel_err(y, ref), 6)
                if row["rel_err"] <= TOL:
                    row["graph_us"] = round(time_graph(fn, sets).median_us, 3)
                else:
                    row["error"] = f"wrong: rel err {row['rel_err']}"
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            print(json.dumps(row), flush=True)
        del sets, ref
        torch.cuda.empty_cache()


def run_persistent(timeout_s):
    cmd = [sys.executable, os.path.abspath(__file__), "--persistent-child"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ))
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        timed_out = True
    rows, started = [], None
    for line in (out or "").splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d.get("status") == "started":
            started = d
        else:
            rows.append(d)
            started = None
    if timed_out and started is not None:
        started.pop("status")
        rows.append(dict(started, error=f"TIMEOUT after {timeout_s}s: hang (spin-wait?) or slow compile"))
    if proc.returncode not in (0, None) and not timed_out:
        rows.append({"label": "persistent child", "error": f"exit {proc.returncode}: {(out or '')[-400:]}"})
    return rows, timed_out


# ---------------------------------------------------------------------------- --small-m (issue 2)

# (M, K, N, r), most informative first: the budget may cut the tail
SMALL_M_POINTS = [(1, 4096, 4096, 16), (16, 4096, 4096, 16), (1, 8192, 8192, 16), (16, 8192, 8192, 16),
                  (64, 4096, 4096, 16), (64, 8192, 8192, 16), (16, 4096, 4096, 64), (16, 8192, 8192, 64),
                  (1, 4096, 28672, 16), (16, 4096, 28672, 16), (64, 4096, 28672, 16), (16, 4096, 28672, 64)]
SMALL_M_SPLITS = (1, 2, 4, 8)
SMALL_M_BN = (64, 128)


def small_m_specs(M, N, K, r, sms):
    """[(label, strategy, KernelConfig)] of the split-K sweep: kloop 64×BN×128, fixup for every
    split with tiles × split ≤ 2.2 waves and ≥ 2 K steps per split; reduce for BN=128, split > 1."""
    out = []
    for bn in SMALL_M_BN:
        tiles = _cdiv(M, 64) * _cdiv(N, bn)
        for split in SMALL_M_SPLITS:
            if tiles * split > 2.2 * sms or _cdiv(K, 128) // split < 2:
                continue
            modes = ("fixup", "reduce") if (bn == 128 and split > 1) else ("fixup",)
            for mode in modes:
                c = _cfg("kloop", M, N, K, r, 64, bn, 128, 4, sms, split).replace(split_mode=mode)
                c = c.replace(num_stages=stages_for(lambda st: lora_ledger("kloop", c.replace(num_stages=st))))
                if not can_implement("kloop", (M, N, K, r), c):
                    continue
                tag = f"{mode} " if split > 1 else ""
                out.append((f"kloop {tag}64x{bn}x128 s{c.num_stages} sk{split} br{c.block_r}", "kloop", c))
    return out


def _with_env(fn, name, value):
    def call(*args):
        old = os.environ.get(name)
        os.environ[name] = value
        try:
            return fn(*args)
        finally:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
    return call


def small_m_point(M, K, N, r, sms):
    from lowrank_gemm.kernels.lora_gemm import lora_linear
    from lowrank_gemm.plan.planner import SPLIT_MODE_ENV, plan_lora
    sets = make_sets(M, N, K, r, torch.bfloat16, "cuda")
    x, w, a, b, _ = sets[0]
    ref = lora_linear_ref(x, w, a, b, SCALE)
    base = {"M": M, "N": N, "K": K, "r": r, "bytes": nbytes(M, N, K, r)}
    auto = lambda x, w, a, b, bs: lora_linear(x, w, a, b, SCALE)        # noqa: E731
    auto_fix = _with_env(auto, SPLIT_MODE_ENV, "fixup")
    dev = torch.device("cuda")
    plan_today = plan_lora(M, N, K, r, torch.bfloat16, dev)
    hs, hc = heuristic_lora(M, N, K, r, 16, gpu=True, sms=sms)
    cands = [("cublas", "cublas", None, lambda x, w, a, b, bs: x @ w.T),
             ("torch_unfused", "torch_unfused", None, lambda x, w, a, b, bs: torch.addmm(x @ w.T, x @ a.T, bs.T)),
             (f"auto (today: {plan_today[0]} {plan_today[1].block_n} sk{plan_today[1].split_k} "
              f"{plan_today[1].split_mode})", "auto", plan_today[1], auto),
             ("auto [LOWRANK_GEMM_SPLITK_MODE=fixup]", "auto_fixup", None, auto_fix),
             (f"heur {hs} 64x{hc.block_n}x{hc.block_k} s{hc.num_stages} sk{hc.split_k} {hc.split_mode}",
              hs, hc, _call(hs, hc))]
    cands += [(label, s, c, _call(s, c)) for label, s, c in small_m_specs(M, N, K, r, sms)]
    rows = []
    for label, s, c, fn in cands:
        row = dict(base, label=label, strategy=s)
        if c is not None:
            row["config"] = c.to_dict()
        t0 = time.time()
        try:
            if c is not None and s not in ("auto",):
                y = _checked(s, c, *sets[0][:4])         # NaN-poisoned output, same launch path
            else:
                y = fn(*sets[0])
            _check_then_time(row, fn, y, None if s == "cublas" else ref, sets, t0)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
    cub = rows[0].get("graph_us")
    for row in rows:
        if cub and row.get("graph_us"):
            row["x_cublas"] = round(row["graph_us"] / cub, 3)
            row["bw_tbps"] = round(base["bytes"] / (row["graph_us"] * 1e-6) / 1e12, 3)
    del sets, ref
    torch.cuda.empty_cache()
    return rows


def small_m_winners(rows):
    """Per tuned key: the fastest kloop/heuristic row, if it beats today's auto in this run."""
    by_point = {}
    for row in rows:
        by_point.setdefault((row["M"], row["N"], row["K"], row["r"]), []).append(row)
    table, report = {}, []
    for (M, N, K, r), rs in by_point.items():
        timed = [x for x in rs if x.get("graph_us")]
        cand = [x for x in timed if x.get("config") and x["strategy"] in ("kloop", "split")]
        auto = next((x for x in timed if x["strategy"] == "auto"), None)
        cub = next((x for x in timed if x["strategy"] == "cublas"), None)
        if not cand:
            continue
        best = min(cand, key=lambda x: x["graph_us"])
        beats = auto is None or best["graph_us"] < auto["graph_us"]
        report.append((M, N, K, r, best["label"], best["graph_us"], auto and auto["graph_us"],
                       cub and cub["graph_us"], beats))
        if beats:
            table[tuned_key(M, N, K, r, torch.bfloat16)] = {
                "strategy": best["strategy"], "config": best["config"], "us": best["graph_us"],
                "cublas_us": cub and cub["graph_us"],
                "x_cublas": round(best["graph_us"] / cub["graph_us"], 3) if cub else None}
    return table, report


def small_m_main(args):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    t0 = time.time()
    rows, skipped = [], []
    for M, K, N, r in SMALL_M_POINTS:
        if time.time() - t0 > args.budget_s:
            skipped.append((M, K, N, r))
            continue
        try:
            pr = small_m_point(M, K, N, r, sms)
        except Exception as exc:
            pr = [{"M": M, "N": N, "K": K, "r": r, "label": "point", "strategy": "point",
                   "error": f"{type(exc).__name__}: {exc}"[:300]}]
        rows += pr
        for row in pr:
            print(f"M={M:<3} K={K:<5} N={N:<6} r={r:<3} {row.get('label', ''):<52} graph {row.get('graph_us')} "
                  f"x{row.get('x_cublas')} err {row.get('rel_err')} {row.get('error', '')}", flush=True)
        print(f"[{time.time() - t0:.0f}s]", flush=True)
    meta = device_meta()
    table, report = small_m_winners(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_lora_smallm.json").write_text(json.dumps(
        {"meta": meta, "rows": rows, "skipped": skipped, "winners": table}, indent=1) + "\n")
    md = to_md(json.dumps(meta), rows, skipped).replace("# LoRA probe", "# LoRA probe --small-m", 1)
    md += "\n## winners per (shape, M)\n\n" + markdown_table(
        ["M", "N", "K", "r", "best", "µs", "auto µs", "cuBLAS µs", "best × cuBLAS", "pinned"],
        [[M, N, K, r, lab, us, au, cu, round(us / cu, 3) if cu else None, "yes" if bt else "no (auto kept)"]
         for M, N, K, r, lab, us, au, cu, bt in report])
    (args.out / "probe_lora_smallm.md").write_text(md)
    print("\nwinners per (shape, M):")
    for M, N, K, r, lab, us, au, cu, bt in report:
        print(f"  M={M} N={N} K={K} r={r}: {lab} {us} µs (auto {au}, cuBLAS {cu}, "
              f"x{round(us / cu, 3) if cu else None}){' → pin' if bt else ''}")
    if args.write_tuned is not None and table:
        old = json.loads(args.write_tuned.read_text()) if args.write_tuned.exists() else {}
        old.update(version=1, lora=dict(old.get("lora", {}), **table))
        args.write_tuned.write_text(json.dumps(old, indent=1) + "\n")
        print(f"merged {len(table)} winners into {args.write_tuned}")
    print(f"total {time.time() - t0:.0f}s; skipped {len(skipped)} points; wrote {args.out}")
    return 0


# ---------------------------------------------------------------------------- --issue2 (session 5)

# (M, K, N, r), most informative first: the budget may cut the tail. Mid M (the worst ratios and
# the new one-launch plans) first, then the small-M and large-M points of issue 2.
ISSUE2_POINTS = [(256, 4096, 4096, 16), (256, 4096, 4096, 64), (256, 8192, 8192, 16), (256, 4096, 28672, 16),
                 (4096, 4096, 4096, 64), (1, 4096, 4096, 16), (64, 4096, 4096, 16), (1024, 4096, 4096, 16),
                 (16, 8192, 8192, 16), (1, 8192, 8192, 16), (16, 4096, 4096, 16), (1024, 4096, 4096, 64),
                 (256, 8192, 8192, 64), (256, 4096, 28672, 64), (4096, 4096, 4096, 16), (64, 4096, 4096, 64),
                 (16, 4096, 4096, 64), (1, 4096, 4096, 64), (16, 8192, 8192, 64), (64, 8192, 8192, 64)]
# issue 2: auto ≤ 1.00× cuBLAS at M ≤ 64, ≤ 1.05× at M ≥ 256
ISSUE2_TARGET = {True: 1.00, False: 1.05}
ALL_OPTIONS = "prefetch,pdl,down_full_rank"
OPTIONS_ON = ALL_OPTIONS          # --swap: "pdl" (the op's defaults)
SWAP_POINTS = [(M, K, N, r) for r in (16, 64) for (K, N) in ((4096, 4096), (8192, 8192), (4096, 28672))
               for M in (1, 16)]   # (M=64: swap lost at every point in session 6, runs 2–4)
_MODE_ARGS: list = []             # passed on to the warm-up and timing children (--swap)
ROW_PREFIX = "ROW "
REF_ROWS = 256          # M > 1024: the float64 reference covers the first and last REF_ROWS rows


def _cfg_fixup(strategy, M, N, K, r, bm, bn, bk, warps, sms, split=None):
    """A one-launch (``fixup``) candidate: split-K by :func:`planner.wave_split` unless given."""
    from lowrank_gemm.plan.planner import wave_split
    if split is None:
        split = wave_split(_cdiv(M, bm) * _cdiv(N, bn), _cdiv(K, bk), sms)
    c = _cfg(strategy, M, N, K, r, bm, bn, bk, warps, sms, split)
    return c.replace(split_mode="fixup") if c.split_k > 1 else c


def issue2_specs(M, N, K, r, sms):
    """[(label, strategy, KernelConfig)] of one point: the new heuristic plan first, then one-launch
    (fixup) split-K candidates by M class — mid M (64 < M ≤ 512): 128×256 / 128×128 / 64×256 /
    256×128 tiles for ``split`` and ``kloop`` (the K-loop S costs one m64n16 wgmma per k16, measured
    +25 % at 128×256, but saves the down kernel's launch); large M: 128×256 / 256×128; decode M:
    64-row tiles with 128/256-wide K steps (half the K-loop iterations of session 3's sweep)."""
    hs, hc = heuristic_lora(M, N, K, r, 16, gpu=True, sms=sms)
    kl = "kloop" if r <= 64 else "split"
    if M <= 64:
        specs = [(kl, 64, 128, 128, 4), (kl, 64, 64, 128, 4), (kl, 64, 128, 256, 4), (kl, 64, 64, 256, 4),
                 (kl, 64, 32, 256, 4), (kl, 64, 256, 64, 4)]
    elif M <= 512:
        specs = [("split", 128, 256, 64, 8), ("kloop", 128, 256, 64, 8), ("split", 128, 128, 64, 8),
                 ("kloop", 128, 128, 64, 8), ("split", 128, 128, 64, 4), ("split", 64, 256, 64, 4),
                 ("kloop", 64, 256, 64, 4), ("split", 256, 128, 64, 8)]
    else:
        specs = [("split", 128, 256, 64, 8), ("split", 256, 128, 64, 8), ("kloop", 128, 256, 64, 8)]
    out = [(f"heur {hs} {hc.block_m}x{hc.block_n}x{hc.block_k} w{hc.num_warps} s{hc.num_stages} "
            f"sk{hc.split_k} {hc.split_mode} br{hc.block_r}", hs, hc)]
    seen = {(hs, hc)}
    for s, bm, bn, bk, w in specs:
        if s == "kloop" and r > 64:
            continue
        try:
            c = _cfg_fixup(s, M, N, K, r, bm, bn, bk, w, sms)
        except Exception:      # no stage count fits
            continue
        if (s, c) in seen or not can_implement(s, (M, N, K, r), c):
            continue
        seen.add((s, c))
        out.append((f"{s} {bm}x{bn}x{bk} w{w} s{c.num_stages} sk{c.split_k} {c.split_mode} br{c.block_r}", s, c))
    if r > SPLIT_BLOCK_R and M > 64:
        # the whole rank in one epilogue chunk (SPLIT_BLOCK_R=16 came from spills that only the test
        # suite's unspecialized compiles have: 128×256 r64 in one chunk is 225 registers as launched)
        c = _cfg_fixup("split", M, N, K, r, 128, 256, 64, 8, sms).replace(block_r=block_r_for(r))
        if ("split", c) not in seen and can_implement("split", (M, N, K, r), c):
            out.append((f"split 128x256x64 w8 s{c.num_stages} sk{c.split_k} {c.split_mode} br{c.block_r}",
                        "split", c))
    return out


def swap_specs(M, N, K, r, sms):
    """[(label, strategy, KernelConfig)] with ``swap_ab``: 16-token tiles at M ≤ 16 (64 at M=64), 64/128 weight
    rows, 64–256-wide K steps, unsplit or a one-launch (fixup) split-K — the fastest rows of
    ``probes/s6/probe_box.md`` per shape family, where the bare GEMM beat cuBLAS; ``kloop`` (S = A·Xᵀ in
    the K loop, one launch) and ``split`` (PDL down kernel, or unsplit plans once more with 4 in-grid S
    producers), all with the whole rank in one prefetched epilogue chunk."""
    bm = 16 if M <= 16 else 32 if M <= 32 else 64
    br = block_r_for(r)
    # (session 6, runs 2–4: kloop + swap wins only some r64 points — TMA zero fill of its 64-row A box —, and only
    # in these two tiles; every winner elsewhere is split + swap)
    specs = [("kloop", 64, 128, 1), ("kloop", 128, 128, 1), ("split", 128, 64, 1), ("split", 64, 256, 1),
             ("split", 64, 128, 2)]
    out, seen = [], set()
    for s, bn, bk, split in specs:
        # one epilogue chunk of the whole rank (prefetched B: _prefetch_ok); kloop: ≥ 64 rank rows on the S wgmma
        rows = max(64, br) if s == "kloop" else br
        c = KernelConfig(block_m=bm, block_n=bn, block_k=bk, block_r=rows, group_m=1, num_warps=4, num_stages=2,
                         split_k=split, split_mode="fixup" if split > 1 else "reduce", swap_ab=True)
        c = c.replace(num_stages=stages_for(lambda st: lora_ledger(s, c.replace(num_stages=st))))
        if (s, c) in seen or not can_implement(s, (M, N, K, r), c):
            continue
        seen.add((s, c))
        out.append((f"{s} swap {bm}x{bn}x{bk} s{c.num_stages} sk{c.split_k} br{c.block_r}", s, c))
        if s == "split" and split == 1:   # the same plan in one launch: S from 4 producers at the grid's head
            p = c.replace(s_producers=4)
            if can_implement(s, (M, N, K, r), p):
                out.append((f"{s} swap prod4 {bm}x{bn}x{bk} s{p.num_stages} br{p.block_r}", s, p))
    return out


def _specs(M, N, K, r, sms):
    return swap_specs(M, N, K, r, sms) if "--swap" in _MODE_ARGS else issue2_specs(M, N, K, r, sms)


def _flags(on=()):
    """Every LoraOptions field, True for the names in ``on`` (explicit: the env cannot leak in)."""
    return {k: k in on for k in ALL_OPTIONS.split(",")}


def _option_sets(strategy, r):
    """{label: LoraOptions flags} of the A/B at a point's best candidate: all off (today's defaults),
    and each option that acts on this strategy switched off alone."""
    names = OPTIONS_ON.split(",")
    if names == ["pdl"]:
        return {"off": _flags()}
    sets = {"off": _flags()}
    acting = ["prefetch"] + (["pdl"] + (["down_full_rank"] if r > 16 else []) if strategy == "split" else [])
    for n in acting:
        sets[f"on-{n}"] = _flags([k for k in names if k != n])
    return sets


def _timed_call(strategy, cfg, flags, rank0=False):
    """fn(x, w, a, b, bs, out=None) as the op runs it (pinned plan, launch options in scope); rank0:
    our plain GEMM at the same config (lora_a/lora_b with r = 0), the LoRA-free time of that tile
    plan. ``out``: the result goes there (a NaN-poisoned buffer in the checks) — same launches,
    through ``run_strategy`` with the plan the op would take."""
    from lowrank_gemm.kernels.lora_gemm import lora_linear, lora_options, run_strategy
    from lowrank_gemm.plan.planner import plan_lora

    def fn(x, w, a, b, bs, out=None):
        with lora_options(**flags):
            if rank0:
                return run_strategy(strategy, x, w, a[:0], b[:, :0], SCALE, None, cfg, out=out)
            if out is not None:
                s, c = (strategy, cfg) if strategy != "auto" else \
                    plan_lora(x.shape[0], w.shape[0], x.shape[1], a.shape[0], x.dtype, x.device)
                return run_strategy(s, x, w, a, b, SCALE, None, c, out=out)
            if strategy == "auto":
                return lora_linear(x, w, a, b, SCALE)
            with pinned(strategy=strategy, config=cfg):
                return lora_linear(x, w, a, b, SCALE)
    return fn


def _issue2_check(row, fn, sets, ref, ref_rows, rank0):
    """Two calls into NaN-poisoned outputs: no NaN left, error on the reference rows ≤ TOL, the two
    bit-identical; True if the plan may be timed."""
    x, w, a, b, bs = sets[0]
    ys = []
    for _ in range(2):
        out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype, device=x.device)
        y = fn(x, w, a, b, bs, out=out)
        if y.is_cuda:
            torch.cuda.synchronize()
        ys.append(y)
    y = ys[0]
    row["nan"] = bool(y.isnan().any().item())
    sub = y[ref_rows] if ref_rows is not None else y
    row["rel_err"] = round(_rel_err(sub, ref if not rank0 else ref[1]), 6)
    row["bit_identical"] = bool(torch.equal(ys[0], ys[1]))
    if row["nan"] or not row["rel_err"] <= TOL or not row["bit_identical"]:
        row["error"] = (f"wrong: rel err {row['rel_err']} nan {row['nan']} "
                        f"bit-identical {row['bit_identical']}")
        return False
    return True


def _exit_if_context_lost(row, emit):
    """A faulting kernel (illegal address, misaligned TMA) leaves the CUDA context unusable: every
    later call would fail too. Report the row and end this child; the parent resumes after the point."""
    if not torch.cuda.is_available():
        return
    try:
        torch.cuda.synchronize()
    except Exception as exc:
        row["error"] += f" | context lost: {type(exc).__name__}: {exc}"[:200]
        emit(row)
        sys.stdout.flush()
        os._exit(3)


def issue2_point(M, K, N, r, sms, emit, device="cuda", dtype=torch.bfloat16):
    """Rows of one point, each passed to ``emit`` as soon as it is timed (device/dtype: CPU tests)."""
    from lowrank_gemm.plan.planner import plan_lora
    sets = make_sets(M, N, K, r, dtype, device)
    x, w, a, b, _ = sets[0]
    Mx = x.shape[0]
    ref_rows = None if Mx <= 1024 else torch.cat([torch.arange(REF_ROWS), torch.arange(Mx - REF_ROWS, Mx)]).to(device)
    xr = x if ref_rows is None else x[ref_rows]
    ref = lora_linear_ref(xr, w, a, b, SCALE)
    ref0 = xr.double() @ w.double().T                       # rank-0 diagnostic rows
    base = {"M": M, "N": N, "K": K, "r": r, "bytes": nbytes(M, N, K, r)}
    on = _flags(OPTIONS_ON.split(","))
    today = plan_lora(*x.shape[:1], w.shape[0], x.shape[1], a.shape[0], dtype, torch.device(device))
    rows = []

    def run(label, strategy, cfg, flags, kind, fn=None, rank0=False):
        row = dict(base, label=label, strategy=strategy, kind=kind,
                   options=",".join(k for k, v in sorted(flags.items()) if v) or "off",
                   config=cfg.to_dict() if cfg else None)
        t0 = time.time()
        try:
            call = fn or _timed_call(strategy, cfg, flags, rank0)
            if strategy == "cublas" or _issue2_check(row, call, sets, (ref, ref0) if rank0 else ref,
                                                     ref_rows, rank0):
                row["first_call_s"] = round(time.time() - t0, 2)
                row["graph_us"] = round(time_graph(call, sets).median_us, 3)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            _exit_if_context_lost(row, emit)
        cub = rows[0].get("graph_us") if rows else row.get("graph_us")
        if cub and row.get("graph_us"):
            row["x_cublas"] = round(row["graph_us"] / cub, 3)
            row["bw_tbps"] = round(base["bytes"] / (row["graph_us"] * 1e-6) / 1e12, 3)
        # a launch option never measured on the device (PDL under graph capture, a prefetched
        # tile's SMEM) must not cost the candidate: the same plan once more with all of them off
        retry = "error" in row and any(flags.values()) and fn is None
        if retry:
            row["kind"] = f"{kind} (failed with options)"
        rows.append(row)
        emit(row)
        if retry:
            return run(label + " [retry, options off]", strategy, cfg, _flags(), kind, rank0=rank0)
        return row

    run("cublas", "cublas", None, _flags(), "baseline", fn=lambda x, w, a, b, bs: x @ w.T)
    tl = f"{today[0]} {today[1].block_m}x{today[1].block_n}x{today[1].block_k} sk{today[1].split_k} {today[1].split_mode}"
    run(f"auto (today: {tl})", "auto", today[1], _flags(), "today")
    run(f"auto (today: {tl}) [options on]", "auto", today[1], on, "today")
    cands = [run(label, s, c, on, "candidate") for label, s, c in _specs(M, N, K, r, sms)]
    timed = [c for c in cands if c.get("graph_us")]
    if timed:
        best = min(timed, key=lambda c: c["graph_us"])
        cfg = KernelConfig.from_dict(best["config"])
        for tag, flags in _option_sets(best["strategy"], r).items():
            run(f"best [{tag}]: {best['label']}", best["strategy"], cfg, flags, "ab")
        run(f"ours rank 0 @best: {best['label']}", best["strategy"], cfg, on, "rank0", rank0=True)
    del sets
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return rows


def issue2_warm(args):
    """Compile-only pass over some points (``--points``): every plan the timing child will run first
    (today's and each candidate's, with the options on and off) is called once on the real shapes, so the
    JIT's disk cache holds it when the timing child gets there. Several of these run in parallel
    (compiles are CPU-bound; the device machine has 16 cores); anything they miss compiles later."""
    from lowrank_gemm.plan.planner import plan_lora
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    on, off = _flags(OPTIONS_ON.split(",")), _flags()
    for i in (int(v) for v in args.points.split(",") if v):
        if time.time() > args.deadline:
            break
        M, K, N, r = ISSUE2_POINTS[i]
        x, w, a, b, bs = make_sets(M, N, K, r, torch.bfloat16, "cuda")[0]
        today = plan_lora(M, N, K, r, torch.bfloat16, torch.device("cuda"))
        plans = [("auto", today[1], off), ("auto", today[1], on)]
        cands = _specs(M, N, K, r, sms)
        plans += [(s, c, on) for _, s, c in cands] + [(s, c, off) for _, s, c in cands]
        for s, c, f in plans:
            if time.time() > args.deadline:
                break
            try:
                _timed_call(s, c, f)(x, w, a, b, bs)
                torch.cuda.synchronize()
            except Exception as exc:
                print(f"warm {ISSUE2_POINTS[i]} {s} {c}: {type(exc).__name__}: {exc}"[:300], flush=True)
                _exit_if_context_lost({"error": ""}, lambda row: None)
        print(f"WARM {i}", flush=True)
        del x, w, a, b, bs
        torch.cuda.empty_cache()


def issue2_warm_all(deadline, workers):
    """Run ``workers`` warm-up children in parallel over ISSUE2_POINTS (round-robin shares, so each
    holds early points), each in its own process group, all killed at ``deadline``. → warmed points."""
    import signal
    import subprocess
    procs = []
    for k in range(workers):
        share = ",".join(str(i) for i in range(k, len(ISSUE2_POINTS), workers))
        cmd = [sys.executable, os.path.abspath(__file__), "--issue2-warm", "--points", share,
               "--deadline", str(deadline)] + _MODE_ARGS
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    warmed = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.time() + 10))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
        warmed += [int(l.split()[1]) for l in (out or "").splitlines() if l.startswith("WARM ")]
    return sorted(warmed)


def issue2_child(args):
    """Runs ISSUE2_POINTS[start:] until the deadline; prints ``ROW {json}`` per row (flushed)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for i in range(args.start, len(ISSUE2_POINTS)):
        if time.time() > args.deadline:
            break
        M, K, N, r = ISSUE2_POINTS[i]
        print(f"POINT {i} {json.dumps([M, K, N, r])}", flush=True)
        issue2_point(M, K, N, r, sms, lambda row: print(ROW_PREFIX + json.dumps(row), flush=True))
        print(f"DONE {i}", flush=True)


def issue2_winners(rows, existing):
    """Per tuned key: the fastest correct candidate (options on) if it beats today's plan timed with
    the same options in this run; else the existing entry stays. → (table updates, report lines)."""
    by_point = {}
    for row in rows:
        by_point.setdefault((row["M"], row["N"], row["K"], row["r"]), []).append(row)
    updates, report = {}, []
    for (M, N, K, r), rs in by_point.items():
        timed = [x for x in rs if x.get("graph_us")]
        cub = next((x["graph_us"] for x in timed if x["strategy"] == "cublas"), None)
        today = next((x for x in timed if x["kind"] == "today" and x["options"] != "off"), None)
        today_off = next((x for x in timed if x["kind"] == "today" and x["options"] == "off"), None)
        cands = [x for x in timed if x["kind"] == "candidate"]
        if not cands:
            continue
        best = min(cands, key=lambda x: x["graph_us"])
        key = tuned_key(M, N, K, r, torch.bfloat16)
        pin = today is None or best["graph_us"] < today["graph_us"]
        if pin:
            updates[key] = {"strategy": best["strategy"], "config": best["config"], "us": best["graph_us"],
                            "cublas_us": cub, "x_cublas": round(best["graph_us"] / cub, 3) if cub else None,
                            "options": best["options"]}
        final = best["graph_us"] if pin else today["graph_us"]
        report.append(dict(M=M, N=N, K=K, r=r, key=key, best=best["label"], best_us=best["graph_us"],
                           today_us=today_off and today_off["graph_us"], today_on_us=today and today["graph_us"],
                           cublas_us=cub, final_x=round(final / cub, 3) if cub else None,
                           target=ISSUE2_TARGET[M <= 64], pinned=pin, had_entry=key in existing))
    return updates, report


def issue2_md(meta, rows, report, skipped):
    md = f"# LoRA probe --issue2\n\n{json.dumps(meta)}\n\n## scoreboard (graph µs; final = the tuned table after this run, options on)\n\n"
    md += markdown_table(
        ["M", "N", "K", "r", "cuBLAS", "today (off)", "today (on)", "best candidate", "best µs", "final ×", "target", "met", "pinned"],
        [[e["M"], e["N"], e["K"], e["r"], e["cublas_us"], e["today_us"], e["today_on_us"], e["best"], e["best_us"],
          e["final_x"], e["target"], "yes" if e["final_x"] and e["final_x"] <= e["target"] else "no",
          "yes" if e["pinned"] else "no (kept)"] for e in report])
    md += "\n## every row\n\n" + markdown_table(
        ["M", "N", "K", "r", "kind", "candidate", "options", "graph µs", "× cuBLAS", "TB/s", "rel err", "error"],
        [[x.get("M"), x.get("N"), x.get("K"), x.get("r"), x.get("kind"), x.get("label"), x.get("options"),
          x.get("graph_us"), x.get("x_cublas"), x.get("bw_tbps"), x.get("rel_err"), (x.get("error") or "")[:80]]
         for x in rows])
    if skipped:
        md += f"\nnot reached (budget or a dead child): {skipped}\n"
    return md


def _issue2_write(args, rows, done, failed, warmed, t0, tuned_path, meta):
    """probe_lora_issue2.json/.md and the merged lora_h200.json under args.out (→ the report)."""
    skipped = [p for i, p in enumerate(ISSUE2_POINTS) if i not in done]
    existing_path = tuned_path or args.write_tuned or (Path(__file__).resolve().parents[1]
                                                       / "src/lowrank_gemm/plan/tuned/lora_h200.json")
    existing = json.loads(Path(existing_path).read_text()) if Path(existing_path).exists() else {"version": 1, "lora": {}}
    updates, report = issue2_winners(rows, existing.get("lora", {}))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_lora_issue2.json").write_text(json.dumps(
        {"meta": meta, "rows": rows, "skipped": skipped, "failed": failed, "winners": updates, "report": report,
         "options_on": OPTIONS_ON, "warmed": warmed, "seconds": round(time.time() - t0, 1)}, indent=1) + "\n")
    (args.out / "probe_lora_issue2.md").write_text(issue2_md(meta, rows, report, skipped))
    merged = dict(existing, version=1, lora=dict(existing.get("lora", {}), **updates))
    merged["meta"] = dict(existing.get("meta", {}), issue2=dict(meta, source="scripts/probe_lora.py --issue2",
                                                               options=OPTIONS_ON))
    (args.out / "lora_h200.json").write_text(json.dumps(merged, indent=1) + "\n")
    if args.write_tuned is not None:
        args.write_tuned.write_text(json.dumps(merged, indent=1) + "\n")
        print(f"merged {len(updates)} winners into {args.write_tuned}")
    return report


def issue2_main(args, tuned_path=None):
    """Parent (no CUDA until the children are done): children run the points; a child that dies (a
    CUDA error poisons its context) or passes the deadline costs only its current point, the next
    child resumes after it. ``tuned_path``: the table to merge into (default ``--write-tuned``, else
    the repository's ``plan/tuned/lora_h200.json``, which is then only read)."""
    from _childproc import run_child
    t0 = time.time()
    deadline = t0 + args.budget_s
    warmed = issue2_warm_all(t0 + args.warm_s, args.warm_workers) if args.warm_workers > 0 else []
    print(f"[{time.time() - t0:.0f}s] compile warm-up: points {warmed}", flush=True)
    rows, done, failed, start = [], set(), [], 0
    while start < len(ISSUE2_POINTS) and time.time() < deadline - 5:
        cmd = [sys.executable, os.path.abspath(__file__), "--issue2-child", "--start", str(start),
               "--deadline", str(deadline)] + _MODE_ARGS
        limit = deadline - time.time() + args.grace_s
        status, out, _, got = run_child(cmd, dict(os.environ), limit, row_prefix=ROW_PREFIX)
        rows += got
        began = [int(l.split()[1]) for l in out.splitlines() if l.startswith("POINT ")]
        ended = {int(l.split()[1]) for l in out.splitlines() if l.startswith("DONE ")}
        done |= ended
        cut = [i for i in began if i not in ended]
        _issue2_write(args, rows, done, failed, warmed, t0, tuned_path, {"partial": True})   # if killed later
        if not cut:
            break                                   # the child ran out of points or of time
        i = cut[0]
        failed.append({"point": ISSUE2_POINTS[i], "status": status or "died",
                       "log_tail": out[-1500:]})
        print(f"point {ISSUE2_POINTS[i]}: child {status or 'died'}; resuming after it\n{out[-800:]}", flush=True)
        start = i + 1
    for row in rows:
        print(f"M={row['M']:<5} K={row['K']:<5} N={row['N']:<6} r={row['r']:<3} {row['kind']:<9} "
              f"{row['label'][:60]:<60} [{row['options']}] graph {row.get('graph_us')} x{row.get('x_cublas')} "
              f"err {row.get('rel_err')} {row.get('error', '')}", flush=True)
    from lowrank_gemm.bench.common import measure_copy_tbps
    try:
        copy = measure_copy_tbps()
    except Exception:
        copy = None
    report = _issue2_write(args, rows, done, failed, warmed, t0, tuned_path, device_meta(copy))
    print("\nscoreboard:")
    for e in report:
        print(f"  M={e['M']} N={e['N']} K={e['K']} r={e['r']}: cuBLAS {e['cublas_us']} today {e['today_us']} "
              f"(on {e['today_on_us']}) best {e['best_us']} ({e['best']}) → x{e['final_x']} "
              f"(target {e['target']}){' pinned' if e['pinned'] else ''}")
    skipped = [p for i, p in enumerate(ISSUE2_POINTS) if i not in done]
    print(f"total {time.time() - t0:.0f}s; {len(done)} points done, {len(failed)} failed, not reached: {skipped}; "
          f"wrote {args.out}")
    return 0


# ---------------------------------------------------------------------------- main

def winners(rows, allow_persistent, allow_streamk=False):
    table = {}
    fused = {"kloop", "split"} | ({"persistent_static", "persistent_dynamic"} if allow_persistent else set())
    fused |= {"streamk"} if allow_streamk else set()
    by_key = {}
    for row in rows:
        if row.get("strategy") in fused and row.get("graph_us") and row.get("config"):
            k = tuned_key(row["M"], row["N"], row["K"], row["r"], torch.bfloat16)
            if k not in by_key or row["graph_us"] < by_key[k]["graph_us"]:
                by_key[k] = row
    cub = {(r["M"], r["N"], r["K"], r["r"]): r["graph_us"] for r in rows if r.get("strategy") == "cublas"}
    for k, row in by_key.items():
        c = cub.get((row["M"], row["N"], row["K"], row["r"]))
        table[k] = {"strategy": row["strategy"], "config": row["config"], "us": row["graph_us"],
                    "cublas_us": c, "x_cublas": round(row["graph_us"] / c, 3) if c else None}
    return table


def to_md(meta, rows, skipped):
    hdr = ["M", "N", "K", "r", "candidate", "graph µs", "eager µs", "× cuBLAS", "TB/s", "rel err", "error"]
    body = [[r.get("M"), r.get("N"), r.get("K"), r.get("r"), r.get("label"), r.get("graph_us"),
             r.get("median_us"), r.get("x_cublas"), r.get("bw_tbps"), r.get("rel_err"),
             (r.get("error") or "")[:80]] for r in rows]
    md = f"# LoRA probe\n\n{meta}\n\n" + markdown_table(hdr, body)
    if skipped:
        md += f"\nskipped (budget): {skipped}\n"
    return md


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=False)
    ap.add_argument("--write-tuned", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="only the six measured points of lora.md")
    ap.add_argument("--budget-s", type=float, default=105.0, help="no new point after this (main process)")
    ap.add_argument("--persistent-timeout-s", type=float, default=35.0)
    ap.add_argument("--no-persistent", action="store_true")
    ap.add_argument("--allow-persistent-winners", action="store_true")
    ap.add_argument("--streamk-only", action="store_true",
                    help="only STREAMK_POINTS (K=N=4096 M 1-256, 8192² M 1/16), no persistent child")
    ap.add_argument("--allow-streamk-winners", action="store_true",
                    help="let streamk rows win tuned-table entries (timed either way)")
    ap.add_argument("--small-m", action="store_true",
                    help="issue 2: split-K fixup vs reduce vs baselines at M 1/16/64 (≤ 90 s)")
    ap.add_argument("--issue2", action="store_true",
                    help="session 5: one-launch mid-M plans, launch options A/B, re-tune ISSUE2_POINTS (≤ budget)")
    ap.add_argument("--swap", action="store_true",
                    help="with --issue2: SWAP_POINTS (M ≤ 64) and swap_ab split candidates, default options")
    ap.add_argument("--grace-s", type=float, default=15.0, help="--issue2: a child's limit past the deadline")
    ap.add_argument("--warm-s", type=float, default=70.0, help="--issue2: parallel compile warm-up, seconds")
    ap.add_argument("--warm-workers", type=int, default=12, help="--issue2: warm-up processes (0: none)")
    ap.add_argument("--issue2-warm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--points", default="", help=argparse.SUPPRESS)
    ap.add_argument("--persistent-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--issue2-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.swap:
        global OPTIONS_ON
        OPTIONS_ON = "pdl"
        ISSUE2_POINTS[:] = SWAP_POINTS
        _MODE_ARGS[:] = ["--swap"]
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.persistent_child:
        persistent_child()
        return 0
    if args.issue2_child:
        issue2_child(args)
        return 0
    if args.issue2_warm:
        issue2_warm(args)
        return 0
    if args.out is None:
        ap.error("--out is required")
    if args.issue2:
        if args.budget_s == ap.get_default("budget_s"):
            args.budget_s = 190.0
        return issue2_main(args)
    if args.small_m:
        if args.budget_s == ap.get_default("budget_s"):
            args.budget_s = 75.0
        return small_m_main(args)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    t0 = time.time()
    rows, skipped = [], []
    for i, (M, K, N, r) in enumerate(points(args.quick, args.streamk_only)):
        if time.time() - t0 > args.budget_s:
            skipped.append((M, K, N, r))
            continue
        try:
            pr = probe_point(M, K, N, r, sms, timing_eager=(M, K, N, r) in ISSUE_POINTS)
        except Exception as exc:   # e.g. out of memory building inputs
            pr = [{"M": M, "N": N, "K": K, "r": r, "label": "point", "error": f"{type(exc).__name__}: {exc}"[:300]}]
        rows += pr
        for row in pr:
            print(f"M={M:<5} K={K:<5} N={N:<6} r={r:<3} {row.get('label', ''):<44} "
                  f"graph {row.get('graph_us')} eager {row.get('median_us', '')} x{row.get('x_cublas')} "
                  f"err {row.get('rel_err')} {row.get('error', '')}", flush=True)
        print(f"[{time.time() - t0:.0f}s]", flush=True)
    if not (args.no_persistent or args.streamk_only):
        prow, to = run_persistent(args.persistent_timeout_s)
        cub = {(r["M"], r["N"], r["K"], r["r"]): r["graph_us"] for r in rows if r.get("strategy") == "cublas"}
        for row in prow:
            c = cub.get((row.get("M"), row.get("N"), row.get("K"), row.get("r")))
            if c and row.get("graph_us"):
                row["x_cublas"] = round(row["graph_us"] / c, 3)
            print(f"persistent: {row}", flush=True)
        rows += prow
    meta = device_meta()
    table = winners(rows, args.allow_persistent_winners, args.allow_streamk_winners)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_lora.json").write_text(json.dumps({"meta": meta, "rows": rows, "skipped": skipped,
                                                          "winners": table}, indent=1) + "\n")
    (args.out / "probe_lora.md").write_text(to_md(json.dumps(meta), rows, skipped))
    tuned = {"version": 1, "meta": dict(meta, source="scripts/probe_lora.py"), "lora": table}
    (args.out / "lora_h200.json").write_text(json.dumps(tuned, indent=1) + "\n")
    if args.write_tuned is not None:
        old = json.loads(args.write_tuned.read_text()) if args.write_tuned.exists() else {}
        merged = dict(old.get("lora", {}), **table)
        old.update(version=1, lora=merged)
        args.write_tuned.write_text(json.dumps(old, indent=1) + "\n")
        print(f"merged {len(table)} winners into {args.write_tuned}")
    print("\nwinners:")
    for k, v in sorted(table.items()):
        print(f"  {k}: {v['strategy']} {v['us']} µs (×{v['x_cublas']} cuBLAS)")
    print(f"total {time.time() - t0:.0f}s; skipped {len(skipped)} points; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
