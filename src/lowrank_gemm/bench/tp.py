"""Tensor parallelism: one MLP block on one GPU against the same block sharded over ``--world`` GPUs (NCCL).

    python -m lowrank_gemm bench tp [--ms 1,16,64,256] [--rank 16] [--world 2] [--out DIR]

The block has Llama-3-8B widths — ``up`` 4096 → 14336 (column-parallel), GELU, ``down`` 14336 → 4096 (row-parallel,
one all-reduce that carries base and branch together: ``nn.parallel``) — with a rank-``--rank`` LoRA adapter on both
layers (our fused ``lora_linear``, ``auto``), and the same block without adapters (``nn.Linear``, cuBLAS) beside it.
Each rank builds the whole block from one seed, shards it with :func:`~lowrank_gemm.nn.parallel.parallelize_` and
checks its output against the unsharded block before any timing.

Timing: every implementation is captured in a CUDA graph of ``GRAPH_CALLS`` calls on every rank (NCCL collectives
included) and replayed a fixed number of times between CUDA events, ranks released together by a barrier; the
row's time is the slowest rank's median per call. ``impl``: ``tp1_lora`` / ``tp1_base`` (the unsharded block on rank
0's GPU, the other ranks idle), ``tp<world>_lora`` / ``tp<world>_base`` (sharded), ``allreduce`` (the all-reduce of
one [M, 4096] bf16 output alone). Writes ``tp.json`` (shared schema, plus ``world``), ``tp.md`` under
``benchmarks/results/<gpu>x<world>`` (``h200x2`` on two H200s).

On a machine with fewer GPUs than ``--world`` the suite stops with a message. ``--backend gloo --device cpu`` runs the
same plumbing on the CPU (tiny shapes, no timing: the tests use it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

from .common import GRAPH_CALLS, capture_graph, device_meta, markdown_table, meta_header, results_dir, write_results

HIDDEN, FFN = 4096, 14336
MS = (1, 16, 64, 256)
REPLAYS, ROUNDS = 20, 5


class _MLP(nn.Module):
    def __init__(self, hidden, ffn, rank, dtype, lora: bool, seed: int = 0):
        super().__init__()
        from ..nn import LoRALinear
        g = torch.Generator().manual_seed(seed)
        up, down = nn.Linear(hidden, ffn, bias=False), nn.Linear(ffn, hidden, bias=False)
        with torch.no_grad():
            up.weight.copy_(torch.randn(ffn, hidden, generator=g) / hidden ** 0.5)
            down.weight.copy_(torch.randn(hidden, ffn, generator=g) / ffn ** 0.5)
        up, down = up.to(dtype), down.to(dtype)
        if lora:
            def adapter(n, k):
                return (torch.randn(rank, k, generator=g) / k ** 0.5, torch.randn(n, rank, generator=g) / rank ** 0.5)
            up = LoRALinear.from_linear(up, *adapter(ffn, hidden), 0.5)
            down = LoRALinear.from_linear(down, *adapter(hidden, ffn), 0.5)
        self.up, self.down = up, down

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def _joined(fn):
    """``fn`` whose output, if a functional collective's (AsyncCollectiveTensor), is waited for inside the call — so a
    captured graph joins the collective's stream and the timing includes it."""
    def call(x):
        out = fn(x)
        wait = getattr(out, "wait", None)
        return wait() if callable(wait) else out
    return call


def _timed(fn, x, dev, group, replays=REPLAYS, rounds=ROUNDS) -> float | None:
    """Median µs per call of ``fn(x)`` over ``rounds`` of ``replays`` replays of a CUDA graph of GRAPH_CALLS calls
    (None on the CPU: nothing is timed there). Every rank of ``group`` must call this together."""
    import torch.distributed as dist
    fn = _joined(fn)
    if dev.type != "cuda":
        fn(x)
        return None

    def calls():
        for _ in range(GRAPH_CALLS):
            fn(x)
    graph = capture_graph(calls)[1]      # the harness's capture: the calls run once on a side stream first
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        if group is not None:
            dist.barrier(group)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (replays * GRAPH_CALLS))
    return statistics.median(times)


def _worker(rank, world, init_file, args, results):
    import torch.distributed as dist
    from ..nn.parallel import parallelize_
    dev = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(args.backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            **({"device_id": dev} if dev.type == "cuda" else {}))
    # fp16 on the CPU: the tests run the fused op under Triton's interpreter there, whose bf16 dot is wrong
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float16
    hidden, ffn = args.hidden, args.ffn
    rows = []
    try:
        for lora in (True, False):
            name = "lora" if lora else "base"
            full = _MLP(hidden, ffn, args.rank, dtype, lora).to(dev)
            tp = parallelize_(_MLP(hidden, ffn, args.rank, dtype, lora).to(dev), {"up": "column", "down": "row"})
            for M in args.ms:
                x = torch.randn(M, hidden, generator=torch.Generator().manual_seed(M)).to(dtype).to(dev)
                with torch.no_grad():
                    want, got = full(x).float(), _joined(tp)(x).float()
                err = float((got - want).norm() / want.norm())
                base = dict(suite="tp", M=M, N=hidden, K=hidden, ffn=ffn, r=args.rank if lora else 0,
                            dtype=str(dtype).replace("torch.", ""), world=world)
                dist.barrier()
                t1 = None
                if rank == 0:
                    with torch.no_grad():
                        t1 = _timed(full, x, dev, None)
                dist.barrier()
                with torch.no_grad():
                    tw = _timed(tp, x, dev, dist.group.WORLD)
                tws = [None] * world
                dist.all_gather_object(tws, tw)
                if rank == 0:
                    slowest = None if any(t is None for t in tws) else max(tws)
                    rows.append(dict(base, impl=f"tp1_{name}", graph_us=None if t1 is None else round(t1, 3)))
                    rows.append(dict(base, impl=f"tp{world}_{name}", rel_err_vs_tp1=round(err, 6),
                                     graph_us=None if slowest is None else round(slowest, 3),
                                     rank_us=[None if t is None else round(t, 3) for t in tws]))
                if lora:
                    y = torch.randn(M, hidden, generator=torch.Generator().manual_seed(M + 1)).to(dtype).to(dev)

                    def allreduce(v):
                        import torch.distributed._functional_collectives as fc
                        return fc.all_reduce(v, "sum", dist.group.WORLD)
                    ta = _timed(allreduce, y, dev, dist.group.WORLD)
                    tas = [None] * world
                    dist.all_gather_object(tas, ta)
                    if rank == 0:
                        rows.append(dict(base, r=0, impl="allreduce",
                                         graph_us=None if any(t is None for t in tas) else round(max(tas), 3)))
                if rank == 0:
                    print(rows[-1], flush=True)
        if rank == 0:
            results["rows"] = rows      # a Manager round trip: in the parent's dict once this returns
        dist.barrier()      # every rank past its last collective before any closes its sockets
    finally:
        dist.destroy_process_group()
    _exit_past_gloo()


def _exit_past_gloo():
    """End a rank that finished cleanly without the interpreter's finalization. gloo has no shutdown: its worker
    threads outlive ``destroy_process_group`` (functional collectives keep the group alive) and free a finished
    collective's tensors after its waiter returned — the last barrier frees the all_gather_object before it. Freeing
    a tensor that has a Python object takes the GIL, and a thread asking for it while the interpreter finalizes is
    ended by ``pthread_exit``, whose unwind through that C++ destructor aborts ("terminate called without an active
    exception", exit −6: 2 runs in 30 on the CPU). A failed rank still raises through the ``finally`` above."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run(args) -> list[dict]:
    """Spawn ``args.world`` ranks and return rank 0's rows."""
    import torch.multiprocessing as mp
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        raise SystemExit(f"bench tp --world {args.world} needs {args.world} CUDA devices; this machine has "
                         f"{torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory() as d:
        ctx = mp.get_context("spawn")
        results = ctx.Manager().dict()
        procs = [ctx.Process(target=_worker, args=(r, args.world, os.path.join(d, "init"), args, results))
                 for r in range(args.world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(args.timeout_s)
        bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
        for p in procs:
            if p.is_alive():
                p.kill()
        if bad:
            raise RuntimeError(f"bench tp: ranks exited abnormally (rank, exit code): {bad}")
        return list(results["rows"])


def markdown(meta: dict, rows: list[dict]) -> str:
    world = rows[0]["world"] if rows else "?"
    by = {(r["impl"], r["M"]): r for r in rows}
    table = []
    for M in sorted({r["M"] for r in rows}):
        def t(impl):
            return (by.get((impl, M)) or {}).get("graph_us")
        lora1, loraw, base1, basew, ar = (t("tp1_lora"), t(f"tp{world}_lora"), t("tp1_base"), t(f"tp{world}_base"),
                                          t("allreduce"))
        ratio = (lambda a, b: None if a is None or b is None else round(a / b, 2))
        table.append([M, lora1, loraw, ratio(lora1, loraw), base1, basew, ratio(base1, basew), ar,
                      (by.get((f"tp{world}_lora", M)) or {}).get("rel_err_vs_tp1")])
    head = ["M", "LoRA 1 GPU µs", f"LoRA {world} GPUs µs", "speed-up", "base 1 GPU µs", f"base {world} GPUs µs",
            "speed-up", "all-reduce µs", "rel err vs 1 GPU"]
    return (f"# Tensor parallelism: MLP {HIDDEN}→{FFN}→{HIDDEN} (GELU), LoRA r{rows[0]['r'] if rows else '?'} on both "
            f"layers\n\n{meta_header(meta)}\n\nCUDA-graph replays ({GRAPH_CALLS} calls per graph, NCCL collectives "
            f"captured); the {world}-GPU time is the slowest rank's. base = the same block without adapters "
            f"(cuBLAS).\n\n" + markdown_table(head, table) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank of both layers")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--hidden", type=int, default=HIDDEN)
    ap.add_argument("--ffn", type=int, default=FFN)
    ap.add_argument("--timeout-s", type=float, default=600)
    ap.add_argument("--out", type=Path, default=None, help="default benchmarks/results/<gpu>x<world>")
    args = ap.parse_args(argv)
    args.ms = [int(v) for v in args.ms.split(",")]
    rows = run(args)
    meta = device_meta() if args.device == "cuda" else {"device": "cpu", "torch": torch.__version__}
    meta.update(world=args.world, backend=args.backend)
    out = args.out or results_dir(suffix=f"x{args.world}")
    md = markdown(meta, rows)
    write_results("tp", meta, rows, out, md=md)
    print(md)
    return rows


if __name__ == "__main__":
    main()
