"""Probe (session 47): the multi-LoRA split-K plans with their arrival tickets from the shared per-stream region (what
ships) against a zeroed buffer per call (before: a memset node in every captured graph), cuBLAS beside, one process.

    PYTHONPATH=src python scripts/probe_ml_tickets.py --out DIR [--cases MxNxRxadapters,...]

Per case (bf16, K = 4096, the bench's 64-slot bank and random ids): graph-replay medians of ``cublas_base``,
``fused`` (the tuned plan as ``bench multilora`` runs it) and ``fused_memset`` (the same call with a fresh zeroed
ticket buffer per call: ``_ticket_probe.with_per_call_tickets``), the two fused rows checked equal bit for bit.
Writes DIR/probe_ml_tickets.{json,md}.
"""

from __future__ import annotations

import argparse

import torch

# the tuned plans with split_k > 1 (plan/tuned/multilora_h200.json, which the H100 table extends)
CASES = "64x4096x16x16,16x4096x16x16,16x4096x64x16,64x4096x64x64,64x4096x16x64,256x4096x16x64"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--cases", default=CASES)
    args = ap.parse_args(argv)
    from _ticket_probe import timed_rows, with_per_call_tickets, write_tables
    from probe_multilora_parts import case_inputs
    from lowrank_gemm.bench.multilora import K, SLOTS
    from lowrank_gemm.kernels import multilora_gemm as mg
    dev = torch.device("cuda")
    rows = []
    for case in args.cases.split(","):
        M, N, r, adapters = (int(v) for v in case.split("x"))
        distinct, sets = case_inputs(M, N, r, adapters, dev)
        plan = mg.choose_plan(M, N, K, r, SLOTS, "gather", dev, adapters=len(distinct))

        def fused(x, w, bk, i, plan=plan, nd=len(distinct)):
            return mg.multi_lora_gemm(x, w, bk.bank_a, bk.bank_b, bk.ranks, bk.scales, i, mode="gather",
                                      validate=False, adapters=nd, b_clean=bk.B_ZERO_PADDED, plan=plan)
        fused_memset = with_per_call_tickets(fused)
        same = torch.equal(fused(*sets[0]), fused_memset(*sets[0]))
        impls = {"cublas_base": lambda x, w, bk, i: torch.nn.functional.linear(x, w), "fused": fused,
                 "fused_memset": fused_memset}
        rows += timed_rows(impls, sets, dict(M=M, N=N, r=r, adapters=len(distinct), split_k=plan.main.split_k,
                                             bit_identical=same))
        del sets
        torch.cuda.empty_cache()
    write_tables(args.out, "probe_ml_tickets", rows,
                 {"M": "M", "N": "N", "r": "r", "adapters": "adapters", "impl": "impl", "graph µs": "graph_us",
                  "× cuBLAS": "x_cublas", "split_k": "split_k", "bit-identical": "bit_identical"})


if __name__ == "__main__":
    main()
