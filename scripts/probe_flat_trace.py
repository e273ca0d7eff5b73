"""Probe (session 54): where op ``flat``'s programs spend their time — per-program global-timer stamps
(``lora_gemm.KERNEL_TRACE``, the kernel's ``TRACE``) of op ``flat``, of the same kernel with S made before it (``pre``:
every tile flattened, the epilogue's branch alone) and without the branch (``bare``), on the op's plan, and of the tuned
table's ``persistent_static`` plan where it has one for the cell (``ps``: what ``auto`` runs at 256 tokens), one
process.

    PYTHONPATH=src python scripts/probe_flat_trace.py --out DIR [--cells MxNxKxR,...]

Session 52 left the question: at 256 tokens the branch costs op ``flat`` and ``persistent_static`` ~0.04 (r16) and
~0.12 (r64) of cuBLAS's time over the bare GEMM, where at 4096×28672 r64 it costs flat 0.01 — a per-program cost, not
a per-tile one. The stamps split each op program into its S tasks, its first tile's K loop (run apart), the S wait,
that tile's epilogue and the flattened rest; ``pre`` and ``bare`` programs give the end-to-end time of the same tiles
with the branch's epilogue only and with no branch. op − pre: the S tasks and the first tile run apart; pre − bare:
the branch in the flattened epilogue. ``ps`` programs stamp their first tile's phases (every tile of theirs runs them
apart). Each traced launch is the last of three in a CUDA graph replayed ten times (steady state, no host gaps).

Rows (DIR/probe_flat_trace.{json,md}): graph-replay medians of cuBLAS, op ``flat``, ``pre``, ``bare`` (and ``ps``)
with TRACE off and on (what the stamps cost); ``bare_st4`` where the plan has fewer than 4 stages (the bare GEMM at
the depth the branch's operands take from it: r64's 3 stages against 4) and likewise ``ps_st4`` (the tuned
persistent_static entry at 4 stages, which fit its ledger since the epilogue buffers were counted). Then per program
class (tiles held, S tasks or not) the median / max of each phase in µs and the span from the first program's start
(``_phases``), and per cell the traced spans with op − pre, pre − bare and ps − bare in µs and as a fraction of
cuBLAS's time (``_split``: the answer). The raw stamps go to ``_raw.json``.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

import torch

CELLS = "256x28672x4096x16,256x28672x4096x64,4096x28672x4096x64,1024x4096x4096x64"


def plan_flat(M, N, K, r):
    from lowrank_gemm.plan.planner import pinned, plan_lora
    with pinned(strategy="flat"):
        return plan_lora(M, N, K, r, torch.bfloat16, torch.device("cuda"))[1]


def kernel_fn(cfg, M, N, K, r, lowrank, trace=None):
    """The flat kernel on the op's plan without its S tasks (``probe_lora_flat.flat_fn``: grid min(#SMs, tiles), tiles
    in program order, everything flattened): ``lowrank`` False the bare GEMM; True the branch with S in one slice from
    one down launch made once, outside the timed call, on the first input set (its ``flat4_pre``: the epilogue's
    branch alone)."""
    from probe_lora_flat import flat_fn

    from lowrank_gemm.bench.lora import SCALE
    return flat_fn(dict(FLATTEN=True, LOWRANK=lowrank, PRE_S=lowrank), M, N, K, r, SCALE, cfg=cfg, splits=1,
                   trace=trace)


def op_fn(trace=None, pin=None):
    """The op under ``pin`` (planner.pinned's arguments; default strategy flat, its planner tile)."""
    from lowrank_gemm.bench.lora import SCALE
    from lowrank_gemm.kernels import lora_gemm
    from lowrank_gemm.plan.planner import pinned
    pin = pin or dict(strategy="flat")

    def call(x, w, a, b, bs):
        lora_gemm.KERNEL_TRACE = trace
        try:
            with pinned(**pin):
                return lora_gemm.lora_linear(x, w, a, b, SCALE)
        finally:
            lora_gemm.KERNEL_TRACE = None
    return call


def tuned_persistent(M, N, K, r):
    """The tuned table's entry for the cell as planner.pinned's arguments where it is ``persistent_static``, else
    None."""
    from lowrank_gemm.plan.config import KernelConfig
    from lowrank_gemm.plan.planner import load_tuned, tuned_key
    from lowrank_gemm.plan.tuned import tuned_file
    hit = load_tuned(tuned_file("lora", torch.device("cuda"))).get(tuned_key(M, N, K, r, torch.bfloat16))
    if hit is None or hit["strategy"] != "persistent_static":
        return None
    return dict(strategy="persistent_static", config=KernelConfig.from_dict(hit["config"]))


def traced(fn, sets, trace):
    """``fn`` three times in a CUDA graph (the sets in turn), replayed ten times: the last launch's stamps [P, 8]."""
    from lowrank_gemm.bench.common import capture_graph
    trace.fill_(-1)
    _, g, _ = capture_graph(lambda: [fn(*sets[i % len(sets)]) for i in range(3)])
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    return trace.cpu().tolist()


def holds(kind, grid, tiles, s_programs, num_pid_m):
    """p → (tiles program p holds, whether it runs an S task) for each kind of launch: op flat walks the tiles in
    reverse program order with its S tasks on programs below s_programs; pre / bare walk them in program order;
    persistent_static (ps) takes tasks p, p + grid, … of the S blocks then the tiles."""
    if kind == "op":
        return lambda p: (len(range(grid - 1 - p, tiles, grid)), p < s_programs)
    if kind == "ps":
        return lambda p: (len([t for t in range(p, num_pid_m + tiles, grid) if t >= num_pid_m]), p < num_pid_m)
    return lambda p: (len(range(p, tiles, grid)), False)


def summarize(rows, stamps, cell, kind, grid, held):
    """Per class of programs (``held(p)``: tiles held, S tasks or not): median / max of each phase (µs), end from the
    first start."""
    from lowrank_gemm.kernels._lora_kernels import TRACE_NAMES
    live = [(p, st) for p, st in enumerate(stamps[:grid]) if st[0] > 0]
    t0 = min(st[0] for _, st in live)
    span = (max(st[5] for _, st in live) - t0) / 1e3
    classes: dict[tuple, list] = {}
    for p, st in live:
        key = held(p)
        classes.setdefault(key, []).append(st)
    for (n, s_task), group in sorted(classes.items()):
        phases = {"start": [(st[0] - t0) / 1e3 for st in group], "end": [(st[5] - t0) / 1e3 for st in group]}
        if kind in ("op", "ps"):
            for i in range(1, 5):
                prev = i - 1
                if i == 2 and kind == "ps" and not s_task:      # ps stamps slot 1 only after an S task
                    prev = 0
                if all(st[i] > 0 and st[prev] > 0 for st in group):
                    phases[TRACE_NAMES[i]] = [(st[i] - st[prev]) / 1e3 for st in group]
            if n > 1 and all(st[4] > 0 for st in group):
                phases["rest"] = [(st[5] - st[4]) / 1e3 for st in group]
        else:
            phases["run"] = [(st[5] - st[0]) / 1e3 for st in group]
        row = dict(cell, kind=kind, tiles=n, s_task=s_task, programs=len(group), span_us=round(span, 2),
                   sms=len({st[7] for st in group}))
        for name, v in phases.items():
            row[name] = f"{statistics.median(v):.2f} / {max(v):.2f}"
        rows.append(row)
        print("ROW", " ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    return span


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default=CELLS)
    args = ap.parse_args(argv)
    import sys
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from _ticket_probe import lora_baselines, lora_cells, timed_rows, write_tables
    from lowrank_gemm.kernels._lora_kernels import TRACE_SLOTS, smem_ledger
    from lowrank_gemm.kernels.schedule import flat_programs, flat_s_tasks, num_sms
    dev = torch.device("cuda")
    sms = num_sms(dev)
    _, cublas = lora_baselines()
    time_rows, phase_rows, raw, split_rows = [], [], [], []
    for M, N, K, r, sets in lora_cells(args.cells):
        cfg = plan_flat(M, N, K, r)
        cell = dict(M=M, N=N, K=K, r=r)
        num_pid_m = -(-M // cfg.block_m)
        tiles = num_pid_m * -(-N // cfg.block_n)
        grid = flat_programs(tiles, num_pid_m, sms)
        _, s_programs = flat_s_tasks(num_pid_m, tiles, grid, -(-K // cfg.block_k))
        trace = torch.full((sms, TRACE_SLOTS), -1, dtype=torch.int64, device=dev)
        ps = tuned_persistent(M, N, K, r)
        impls = {"cublas_base": cublas, "op_flat": op_fn(), "op_flat_traced": op_fn(trace),
                 "pre": kernel_fn(cfg, M, N, K, r, True), "pre_traced": kernel_fn(cfg, M, N, K, r, True, trace),
                 "bare": kernel_fn(cfg, M, N, K, r, False), "bare_traced": kernel_fn(cfg, M, N, K, r, False, trace)}
        # r64 runs 3 stages (the branch's S / B tiles take shared memory beside the ring): the bare GEMM at 4 too
        if cfg.num_stages < 4:
            impls["bare_st4"] = kernel_fn(replace(cfg, num_stages=4), M, N, K, r, False)
        launches = [("op", impls["op_flat_traced"], grid), ("pre", impls["pre_traced"], min(sms, tiles)),
                    ("bare", impls["bare_traced"], min(sms, tiles))]
        if ps is not None:      # the tuned persistent_static plan: what auto ran at 256 tokens before flat
            pc = ps["config"]
            ps_pid_m = -(-M // pc.block_m)
            ps_tiles = ps_pid_m * -(-N // pc.block_n)
            impls.update(ps=op_fn(pin=ps), ps_traced=op_fn(trace, ps))
            st4 = replace(pc, num_stages=4)     # r64's 128×256 entries: 3 stages, where the ledger fits 4
            if pc.num_stages < 4 and smem_ledger(st4, 16, "persistent_static").fits():
                impls["ps_st4"] = op_fn(pin=dict(ps, config=st4))
            launches.append(("ps", impls["ps_traced"], min(sms, ps_pid_m + ps_tiles), ps_tiles, ps_pid_m))
        print(f"cell {cell} plan {cfg.to_dict()} grid {grid} tiles {tiles} s_programs {s_programs}", flush=True)
        cell_rows = timed_rows(impls, sets, dict(cell, plan=f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} "
                                                 f"w{cfg.num_warps} st{cfg.num_stages}"))
        time_rows += cell_rows
        spans = {}
        for kind, fn, g, *ps_shape in launches:
            n_tiles, n_pid_m = ps_shape or (tiles, num_pid_m)
            stamps = traced(fn, sets, trace)
            raw.append(dict(cell, kind=kind, grid=g, tiles=n_tiles, s_programs=s_programs, stamps=stamps[:g]))
            spans[kind] = summarize(phase_rows, stamps, cell, kind, g, holds(kind, g, n_tiles, s_programs, n_pid_m))
        # the split the probe is for: traced spans (first start → last end), their differences in µs and as a fraction
        # of the same cell's cuBLAS graph time
        base = cell_rows[0]["graph_us"]     # cublas_base, the first impl
        split = dict(cell, cublas_us=base, **{f"span_{k}": round(v, 2) for k, v in spans.items()})
        for name, (a_, b_) in (("op_minus_pre", ("op", "pre")), ("pre_minus_bare", ("pre", "bare")),
                               ("ps_minus_bare", ("ps", "bare"))):
            if a_ in spans and b_ in spans:
                split[name] = f"{spans[a_] - spans[b_]:.2f} ({(spans[a_] - spans[b_]) / base:+.3f})"
        split_rows.append(split)
        print("ROW split", " ".join(f"{k}={v}" for k, v in split.items()), flush=True)
    write_tables(args.out, "probe_flat_trace", time_rows,
                 {c: c for c in ("M", "N", "K", "r", "plan", "impl", "graph_us", "x_cublas")})
    cols = ("M", "N", "K", "r", "kind", "tiles", "s_task", "programs", "sms", "span_us", "start", "s_tasks",
            "k_loop_1", "s_wait", "epilogue_1", "rest", "run", "end")
    write_tables(args.out, "probe_flat_trace_phases", phase_rows, {c: c for c in cols})
    write_tables(args.out, "probe_flat_trace_split", split_rows, {c: c for c in (
        "M", "N", "K", "r", "cublas_us", "span_op", "span_pre", "span_bare", "span_ps", "op_minus_pre",
        "pre_minus_bare", "ps_minus_bare")})
    import json
    from pathlib import Path
    (Path(args.out) / "probe_flat_trace_raw.json").write_text(json.dumps(raw))


if __name__ == "__main__":
    main()
