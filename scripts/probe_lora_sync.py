"""Probe (session 47): the LoRA persistent strategies with their sync words (S-ready flags, work counter) from the
shared per-stream ticket region (what ships) against a zeroed buffer per call (before: a memset node in every captured
graph), cuBLAS beside, one process.

    PYTHONPATH=src python scripts/probe_lora_sync.py --out DIR [--cells MxNxKxR,...]

Per cell (bf16, the bench's rotated input sets): graph-replay medians of ``cublas_base``, ``auto`` (``lora_linear``
as ``bench lora`` times it; the row names the planner's strategy), ``auto_memset`` (the same call with
``lora_gemm._TICKETS`` replaced by a stand-in that hands out a fresh ``torch.zeros`` per call) and the paired ratio of
``auto`` to cuBLAS (``bench.common.paired_ratio``, as issue 2's table reads it); the two auto rows checked equal bit
for bit. Writes DIR/probe_lora_sync.{json,md}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

# issue 2's cells where H200 `auto` runs persistent_static (results/h200/lora.md, session 30)
CELLS = ("256x4096x4096x8,256x4096x4096x16,256x4096x4096x64,1024x4096x4096x8,1024x4096x4096x16,"
         "256x28672x4096x8,256x28672x4096x16,256x28672x4096x64,1024x28672x4096x16,256x8192x8192x16,"
         "1024x8192x8192x16,4096x28672x4096x16")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--cells", default=CELLS)
    args = ap.parse_args(argv)
    from lowrank_gemm.bench.common import device_meta, markdown_table, paired_ratio, time_impl
    from lowrank_gemm.bench.lora import SCALE, make_sets
    from _ticket_probe import with_per_call_tickets
    from lowrank_gemm.kernels import lora_gemm
    from lowrank_gemm.plan.planner import plan_lora
    dev = torch.device("cuda")
    rows = []
    for cell in args.cells.split(","):
        M, N, K, r = (int(v) for v in cell.split("x"))
        sets = make_sets(M, N, K, r, torch.bfloat16, dev)
        strategy = plan_lora(M, N, K, r, torch.bfloat16, dev)[0]

        def auto(x, w, a, b, bs):
            return lora_gemm.lora_linear(x, w, a, b, SCALE)
        auto_memset = with_per_call_tickets(auto)

        def cublas(x, w, a, b, bs):
            return x @ w.T
        same = torch.equal(auto(*sets[0]), auto_memset(*sets[0]))
        base = None
        for name, fn in (("cublas_base", cublas), ("auto", auto), ("auto_memset", auto_memset)):
            t = time_impl(fn, sets)
            us = t.get("graph_us") or t["median_us"]
            base = us if name == "cublas_base" else base
            paired = paired_ratio(fn, sets, cublas, sets)["ratio_paired"] if name != "cublas_base" else None
            rows.append({"M": M, "N": N, "K": K, "r": r, "impl": name, "strategy": strategy, "graph_us": round(us, 2),
                         "x_cublas": round(us / base, 3), "x_cublas_paired": paired, "bit_identical": same})
            print(f"{cell} {name} ({strategy}): {us:.2f} µs ({us / base:.3f}×, paired {paired}) same={same}",
                  flush=True)
        del sets
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe_lora_sync.json").write_text(json.dumps({"meta": device_meta(), "rows": rows}, indent=1))
    table = markdown_table(["M", "N", "K", "r", "impl", "strategy", "graph µs", "× cuBLAS", "× cuBLAS (paired)",
                            "bit-identical"],
                           [[rw["M"], rw["N"], rw["K"], rw["r"], rw["impl"], rw["strategy"], rw["graph_us"],
                             rw["x_cublas"], rw["x_cublas_paired"], rw["bit_identical"]] for rw in rows])
    (out / "probe_lora_sync.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
