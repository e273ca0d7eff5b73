"""Probe (session 47): the LoRA persistent strategies with their sync words (S-ready flags, work counter) from the
shared per-stream ticket region (what ships) against a zeroed buffer per call (before: a memset node in every captured
graph), cuBLAS beside, one process.

    PYTHONPATH=src python scripts/probe_lora_sync.py --out DIR [--cells MxNxKxR,...] [--readers]

``--readers`` (session 48) times ``auto_readers_early`` instead of ``auto_memset``: the persistent kernel with
``READERS_LATE=False`` (session 47's scalar count of the tiles past their S wait, broadcast behind a CTA barrier)
against what ships (one lane's atomic, its result first used after the tile's store). (Session 49 ran ``--s-poll``,
an early S-flag read before the K loop, at c07c0e8: no gain, the candidate and its option were removed.)

Per cell (bf16, the bench's rotated input sets): graph-replay medians of ``cublas_base``, ``auto`` (``lora_linear``
as ``bench lora`` times it; the row names the planner's strategy), ``auto_memset`` (the same call with a fresh zeroed
ticket buffer per call: ``_ticket_probe.with_per_call_tickets``) and the ratio of each to cuBLAS timed in
alternation (``bench.common.paired_ratio``, as issue 2's table reads it); the two auto rows checked equal bit for
bit. Writes DIR/probe_lora_sync.{json,md}.
"""

from __future__ import annotations

import argparse

import torch

# issue 2's cells where H200 `auto` runs persistent_static (results/h200/lora.md, session 30)
CELLS = ("256x4096x4096x8,256x4096x4096x16,256x4096x4096x64,1024x4096x4096x8,1024x4096x4096x16,"
         "256x28672x4096x8,256x28672x4096x16,256x28672x4096x64,1024x28672x4096x16,256x8192x8192x16,"
         "1024x8192x8192x16,4096x28672x4096x16")


def with_readers_early(fn):
    """``fn`` with the persistent kernel launched as session 47 shipped it (``READERS_LATE=False``)."""
    from lowrank_gemm.kernels import lora_gemm

    def call(*args):
        shipped = lora_gemm.launch

        def early(kernel, grid, *a, **kw):
            if kernel is lora_gemm.K_.lora_persistent_kernel:
                kw["READERS_LATE"] = False
            return shipped(kernel, grid, *a, **kw)
        lora_gemm.launch = early
        try:
            return fn(*args)
        finally:
            lora_gemm.launch = shipped
    return call


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--cells", default=CELLS)
    ap.add_argument("--readers", action="store_true")
    args = ap.parse_args(argv)
    from _ticket_probe import lora_baselines, lora_cells, timed_rows, with_per_call_tickets, write_tables
    from lowrank_gemm.plan.planner import plan_lora
    dev = torch.device("cuda")
    auto, cublas = lora_baselines()
    rows = []
    for M, N, K, r, sets in lora_cells(args.cells):
        other, other_name = ((with_readers_early(auto), "auto_readers_early") if args.readers
                             else (with_per_call_tickets(auto), "auto_memset"))
        same = torch.equal(auto(*sets[0]), other(*sets[0]))
        rows += timed_rows({"cublas_base": cublas, "auto": auto, other_name: other}, sets,
                           dict(M=M, N=N, K=K, r=r, strategy=plan_lora(M, N, K, r, torch.bfloat16, dev)[0],
                                bit_identical=same), paired_base=cublas)
    write_tables(args.out, "probe_lora_sync", rows,
                 {"M": "M", "N": "N", "K": "K", "r": "r", "impl": "impl", "strategy": "strategy",
                  "graph µs": "graph_us", "× cuBLAS": "x_cublas", "× cuBLAS (paired)": "x_cublas_paired",
                  "bit-identical": "bit_identical"})


if __name__ == "__main__":
    main()
