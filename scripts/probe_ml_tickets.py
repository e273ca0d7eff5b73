"""Probe (session 47): the multi-LoRA split-K plans with their arrival tickets from the shared per-stream region (what
ships) against a zeroed buffer per call (before: a memset node in every captured graph), cuBLAS beside, one process.

    PYTHONPATH=src python scripts/probe_ml_tickets.py --out DIR [--cases MxNxRxadapters,...]

Per case (bf16, K = 4096, the bench's 64-slot bank and random ids): graph-replay medians of ``cublas_base``,
``fused`` (the tuned plan as ``bench multilora`` runs it) and ``fused_memset`` (the same call with
``lora_gemm._TICKETS`` replaced by a stand-in that hands out a fresh ``torch.zeros`` per call), the two fused rows
checked equal bit for bit. Writes DIR/probe_ml_tickets.{json,md}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

# the tuned plans with split_k > 1 (plan/tuned/multilora_h200.json, which the H100 table extends)
CASES = "64x4096x16x16,16x4096x16x16,16x4096x64x16,64x4096x64x64,64x4096x16x64,256x4096x16x64"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--cases", default=CASES)
    args = ap.parse_args(argv)
    from _ticket_probe import with_per_call_tickets
    from probe_multilora_parts import case_inputs
    from lowrank_gemm.bench.common import device_meta, markdown_table, time_impl
    from lowrank_gemm.bench.multilora import K, SLOTS
    from lowrank_gemm.kernels import multilora_gemm as mg
    dev = torch.device("cuda")
    rows = []
    for case in args.cases.split(","):
        M, N, r, adapters = (int(v) for v in case.split("x"))
        distinct, sets = case_inputs(M, N, r, adapters, dev)
        nd = len(distinct)
        plan = mg.choose_plan(M, N, K, r, SLOTS, "gather", dev, adapters=nd)

        def fused(x, w, bk, i):
            return mg.multi_lora_gemm(x, w, bk.bank_a, bk.bank_b, bk.ranks, bk.scales, i, mode="gather",
                                      validate=False, adapters=nd, b_clean=bk.B_ZERO_PADDED, plan=plan)
        fused_memset = with_per_call_tickets(fused)
        x, w, bk, i = sets[0]
        same = torch.equal(fused(x, w, bk, i), fused_memset(x, w, bk, i))
        base = None
        for name, fn in (("cublas_base", lambda x, w, bk, i: torch.nn.functional.linear(x, w)),
                         ("fused", fused), ("fused_memset", fused_memset)):
            t = time_impl(fn, sets)
            us = t.get("graph_us") or t["median_us"]
            base = us if name == "cublas_base" else base
            rows.append({"M": M, "N": N, "r": r, "adapters": nd, "impl": name, "graph_us": round(us, 2),
                         "x_cublas": round(us / base, 3), "split_k": plan.main.split_k, "bit_identical": same})
            print(f"{case} {name}: {us:.2f} µs ({us / base:.3f}×) split_k={plan.main.split_k} same={same}",
                  flush=True)
        del sets
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe_ml_tickets.json").write_text(json.dumps({"meta": device_meta(), "rows": rows}, indent=1))
    table = markdown_table(["M", "N", "r", "adapters", "impl", "graph µs", "× cuBLAS", "split_k", "bit-identical"],
                           [[rw["M"], rw["N"], rw["r"], rw["adapters"], rw["impl"], rw["graph_us"], rw["x_cublas"],
                             rw["split_k"], rw["bit_identical"]] for rw in rows])
    (out / "probe_ml_tickets.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
