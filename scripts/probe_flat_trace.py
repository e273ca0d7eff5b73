"""Probe (session 54): where op ``flat``'s programs spend their time — per-program global-timer stamps
(``lora_gemm.FLAT_TRACE``, the kernel's ``TRACE``) of op ``flat``, of the same kernel with S made before it (``pre``:
every tile flattened, the epilogue's branch alone) and without the branch (``bare``), on the op's plan, one process.

    PYTHONPATH=src python scripts/probe_flat_trace.py --out DIR [--cells MxNxKxR,...]

Session 52 left the question: at 256 tokens the branch costs op ``flat`` and ``persistent_static`` ~0.04 (r16) and
~0.12 (r64) of cuBLAS's time over the bare GEMM, where at 4096×28672 r64 it costs flat 0.01 — a per-program cost, not
a per-tile one. The stamps split each op program into its S tasks, its first tile's K loop (run apart), the S wait,
that tile's epilogue and the flattened rest; ``pre`` and ``bare`` programs give the end-to-end time of the same tiles
with the branch's epilogue only and with no branch. op − pre: the S tasks and the first tile run apart; pre − bare:
the branch in the flattened epilogue.
Each traced launch is the last of three in a CUDA graph replayed ten times (steady state, no host gaps).

Rows (DIR/probe_flat_trace.{json,md}): graph-replay medians of cuBLAS, op ``flat``, ``pre`` and ``bare`` with TRACE off
and on (what the stamps cost), then per program class (tiles held, S tasks or not) the median / max of each phase in
µs and the span from the first program's start. The raw stamps go to the json.
"""

from __future__ import annotations

import argparse
import statistics

import torch

CELLS = "256x28672x4096x16,256x28672x4096x64,4096x28672x4096x64,1024x4096x4096x64"


def plan_flat(M, N, K, r):
    from lowrank_gemm.plan.planner import pinned, plan_lora
    with pinned(strategy="flat"):
        return plan_lora(M, N, K, r, torch.bfloat16, torch.device("cuda"))[1]


def kernel_fn(cfg, M, N, K, r, lowrank, trace=None):
    """The flat kernel on the op's tile and stages without its S tasks (grid min(#SMs, tiles), tiles in program
    order, everything flattened): ``lowrank`` False the bare GEMM; True the branch with S from one down launch made
    once, outside the timed call, on the first input set (``flat4_pre`` of probe_lora_flat.py: the epilogue's branch
    alone)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from lowrank_gemm.bench.lora import SCALE
    from lowrank_gemm.kernels import _lora_kernels as K_
    from lowrank_gemm.kernels import lora_gemm
    from lowrank_gemm.kernels.schedule import num_sms
    c = cfg
    tiles = -(-M // c.block_m) * -(-N // c.block_n)
    pre = {}

    def call(x, w, a, b, bs):
        y = torch.empty(M, N, device=x.device, dtype=x.dtype)
        if "s" not in pre:
            pre["s"] = torch.zeros(1, M, r, device=x.device, dtype=torch.float32)
            if lowrank:
                lora_gemm._launch_down(x, a, pre["s"], SCALE, c.block_r, Kp=K, R=r)
        s = pre["s"]
        K_.lora_flat_kernel[(min(num_sms(x.device), tiles),)](
            TensorDescriptor.from_tensor(x, [c.block_m, c.block_k]), TensorDescriptor.from_tensor(w, [c.block_n, c.block_k]),
            TensorDescriptor.from_tensor(a, [c.block_r, c.block_k]), s, s, b, y, y,
            TensorDescriptor.from_tensor(s, [1, c.block_m, c.block_r]), TensorDescriptor.from_tensor(b, [c.block_n, c.block_r]),
            M, N, K, r, SCALE, s.stride(1), s.stride(2), b.stride(0), b.stride(1), y.stride(0), y.stride(1),
            BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, BLOCK_R=c.block_r, GROUP_M=c.group_m,
            LOWRANK=lowrank, HAS_BIAS=False, FLATTEN=True, LORA_TMA=True, S_SPLITS=1, TRACE=trace is not None,
            trace_ptr=trace, num_warps=c.num_warps, num_stages=c.num_stages)
        return y
    return call


def op_fn(trace=None):
    from lowrank_gemm.bench.lora import SCALE
    from lowrank_gemm.kernels import lora_gemm

    def call(x, w, a, b, bs):
        lora_gemm.FLAT_TRACE = trace
        try:
            return lora_gemm.lora_linear(x, w, a, b, SCALE, strategy="flat")
        finally:
            lora_gemm.FLAT_TRACE = None
    return call


def traced(fn, sets, trace):
    """``fn`` three times in a CUDA graph (the sets in turn), replayed ten times: the last launch's stamps [P, 8]."""
    from lowrank_gemm.bench.common import capture_graph
    trace.fill_(-1)
    _, g, _ = capture_graph(lambda: [fn(*sets[i % len(sets)]) for i in range(3)])
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    return trace.cpu().tolist()


def tiles_of(p, grid, tiles, reverse):
    first = grid - 1 - p if reverse else p
    return len(range(first, tiles, grid))


def summarize(rows, stamps, cell, kind, grid, tiles, s_programs):
    """Per class of programs (tiles held, S tasks or not): median / max of each phase (µs), end from the first start."""
    from lowrank_gemm.kernels._lora_kernels import FLAT_TRACE_NAMES
    live = [(p, st) for p, st in enumerate(stamps[:grid]) if st[0] > 0]
    t0 = min(st[0] for _, st in live)
    span = (max(st[5] for _, st in live) - t0) / 1e3
    classes: dict[tuple, list] = {}
    for p, st in live:
        key = (tiles_of(p, grid, tiles, kind == "op"), kind == "op" and p < s_programs)
        classes.setdefault(key, []).append(st)
    for (n, s_task), group in sorted(classes.items()):
        phases = {"start": [(st[0] - t0) / 1e3 for st in group], "end": [(st[5] - t0) / 1e3 for st in group]}
        if kind == "op":
            for i in range(1, 5):
                if all(st[i] > 0 for st in group):
                    phases[FLAT_TRACE_NAMES[i]] = [(st[i] - st[i - 1]) / 1e3 for st in group]
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default=CELLS)
    args = ap.parse_args(argv)
    import sys
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from _ticket_probe import lora_baselines, lora_cells, timed_rows, write_tables
    from lowrank_gemm.kernels._lora_kernels import FLAT_TRACE_SLOTS
    from lowrank_gemm.kernels.schedule import flat_programs, flat_s_tasks, num_sms
    dev = torch.device("cuda")
    sms = num_sms(dev)
    _, cublas = lora_baselines()
    time_rows, phase_rows, raw = [], [], []
    for M, N, K, r, sets in lora_cells(args.cells):
        cfg = plan_flat(M, N, K, r)
        cell = dict(M=M, N=N, K=K, r=r)
        num_pid_m = -(-M // cfg.block_m)
        tiles = num_pid_m * -(-N // cfg.block_n)
        grid = flat_programs(tiles, num_pid_m, sms)
        _, s_programs = flat_s_tasks(num_pid_m, tiles, grid, -(-K // cfg.block_k))
        trace = torch.full((sms, FLAT_TRACE_SLOTS), -1, dtype=torch.int64, device=dev)
        impls = {"cublas_base": cublas, "op_flat": op_fn(), "op_flat_traced": op_fn(trace),
                 "pre": kernel_fn(cfg, M, N, K, r, True), "pre_traced": kernel_fn(cfg, M, N, K, r, True, trace),
                 "bare": kernel_fn(cfg, M, N, K, r, False), "bare_traced": kernel_fn(cfg, M, N, K, r, False, trace)}
        print(f"cell {cell} plan {cfg.to_dict()} grid {grid} tiles {tiles} s_programs {s_programs}", flush=True)
        time_rows += timed_rows(impls, sets, dict(cell, plan=f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} "
                                                  f"w{cfg.num_warps} st{cfg.num_stages}"))
        for kind, fn, g in (("op", op_fn(trace), grid), ("pre", kernel_fn(cfg, M, N, K, r, True, trace), min(sms, tiles)),
                            ("bare", kernel_fn(cfg, M, N, K, r, False, trace), min(sms, tiles))):
            stamps = traced(fn, sets, trace)
            raw.append(dict(cell, kind=kind, grid=g, tiles=tiles, s_programs=s_programs, stamps=stamps[:g]))
            summarize(phase_rows, stamps, cell, kind, g, tiles, s_programs)
    write_tables(args.out, "probe_flat_trace", time_rows,
                 {c: c for c in ("M", "N", "K", "r", "plan", "impl", "graph_us", "x_cublas")})
    cols = ("M", "N", "K", "r", "kind", "tiles", "s_task", "programs", "sms", "span_us", "start", "s_tasks",
            "k_loop_1", "s_wait", "epilogue_1", "rest", "run", "end")
    write_tables(args.out, "probe_flat_trace_phases", phase_rows, {c: c for c in cols})
    import json
    from pathlib import Path
    (Path(args.out) / "probe_flat_trace_raw.json").write_text(json.dumps(raw))


if __name__ == "__main__":
    main()
