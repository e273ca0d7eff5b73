"""GPU probe of the single-adapter LoRA GEMM: cuBLAS vs a short candidate list, per shape.

    PYTHONPATH=src python scripts/probe_lora.py --out DIR [--write-tuned PATH] [--quick]
        [--budget-s 105] [--persistent-timeout-s 35] [--no-persistent] [--allow-persistent-winners]
        [--streamk-only] [--allow-streamk-winners]
    PYTHONPATH=src python scripts/probe_lora.py --small-m --out DIR [--write-tuned PATH] [--budget-s 75]

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
    cub = rows[0]["graph_us"]
    for row in rows:
        if row.get("graph_us"):
            row["x_cublas"] = round(row["graph_us"] / cub, 3)
            row["bw_tbps"] = round(base["bytes"] / (row["graph_us"] * 1e-6) / 1e12, 3)
    del sets, ref
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
    ap.add_argument("--persistent-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.persistent_child:
        persistent_child()
        return 0
    if args.out is None:
        ap.error("--out is required")
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
