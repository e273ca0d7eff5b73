"""Probe: where the fused multi-LoRA GEMM's time goes on the issue-5 cells that sit just above 1.10× cuBLAS.

    PYTHONPATH=src python scripts/probe_multilora_parts.py --out DIR [--cases 16x28672x16x1,...]

Per case (bf16, K = 4096, a bank of 64 slots, random ids; MxNxRxadapters), one process, CUDA-graph replay
medians with the bench's rotated input sets: ``cublas_base``; ``fused`` (what ``bench multilora`` times: tuned
plan, gather mode); ``fused_base`` (the same plan with ``has_lora=False``: the main kernel's base product alone,
no shrink launch); ``lora_single`` (one adapter only: the single-adapter ``lora_linear`` with that adapter's A, B
and scale — what the same bytes cost through the LoRA kernel). Writes DIR/probe_multilora_parts.{json,md}.

``--early`` adds EPI_EARLY candidates (``MultiLoRAPlan.epi_early``: the epilogue expand's ids-only work and its
first B tile before the K loop, 16-B B loads, the S slices summed unrolled): ``early`` (today's main config),
``early_k64`` (the main loop with BK = 64 and 6 stages (M ≤ 16, swap-AB, the single-adapter kernel's config) or
4 stages (M > 16): two CTAs per SM). Every fused row is checked against the float64 reference before it is timed.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

DEFAULT_CASES = ("16x28672x16x1,16x28672x16x4,16x28672x64x1,16x28672x64x4,64x28672x16x1,64x28672x16x4,"
                 "64x28672x64x4,16x28672x16x16,16x4096x16x1")


def early_candidates(plan, M, N, r, nd, dev):
    """EPI_EARLY plans for one case: today's main config, and a BK = 64 main loop (two CTAs per SM). A case whose
    plan fuses the shrink into the K loop (fuse_d > 0) takes the shrink launch instead; M ≤ 16 always swap-AB."""
    import dataclasses
    from lowrank_gemm.kernels.epilogue import rank_block
    main, shrink = plan.main, plan.shrink
    if M <= 16 and not main.swap_ab:
        main = main.replace(block_m=16, block_n=128, block_k=128, num_stages=5, swap_ab=True, num_warps=4, split_k=1)
    epi_d = max(1, min(4, 64 // rank_block(r)))
    common = dict(fuse_d=0, expand="epilogue", epi_early=True, b_vec=True, s_unroll=True, epi_pipe=0, epi_d=epi_d,
                  x_tma=False if main.swap_ab else plan.x_tma)
    out = {"early": dataclasses.replace(plan, main=main, shrink=shrink, **common)}
    k64 = main.replace(block_k=64, num_stages=6 if M <= 16 else 4)
    out["early_k64"] = dataclasses.replace(plan, main=k64, shrink=shrink, **common)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--early", action="store_true")
    args = ap.parse_args(argv)
    from lowrank_gemm.bench.common import device_meta, markdown_table, rotation_count, time_impl
    from lowrank_gemm.bench.multilora import K, SLOTS, _bank, _ids, floor_bytes
    from lowrank_gemm.kernels import multilora_gemm as mg
    from lowrank_gemm.kernels.lora_gemm import lora_linear
    dev = torch.device("cuda")
    rows = []
    for case in args.cases.split(","):
        M, N, r, adapters = (int(v) for v in case.split("x"))
        gen_cpu = torch.Generator().manual_seed(M * 131 + N + r * 7 + adapters)
        gen = torch.Generator(device=dev).manual_seed(M * 131 + N + r * 7 + adapters)
        ids, distinct = _ids(M, adapters, dev, gen_cpu)
        nd = len(distinct)
        sets = []
        for _ in range(rotation_count(floor_bytes(M, N, r, nd))):
            x = torch.randn(M, K, device=dev, generator=gen).to(torch.bfloat16)
            w = (torch.randn(N, K, device=dev, generator=gen) / math.sqrt(K)).to(torch.bfloat16)
            sets.append((x, w, _bank(N, r, dev, gen), ids))
        plan = mg.choose_plan(M, N, K, r, SLOTS, "gather", dev, adapters=nd)

        def fused(x, w, bk, i, has_lora=True, p=None):
            return mg.multi_lora_gemm(x, w, bk.bank_a, bk.bank_b, bk.ranks, bk.scales, i, mode="gather",
                                      validate=False, adapters=nd, b_clean=bk.B_ZERO_PADDED, has_lora=has_lora,
                                      plan=p)
        impls = {"cublas_base": lambda x, w, bk, i: torch.nn.functional.linear(x, w),
                 "fused": fused,
                 "fused_base": lambda x, w, bk, i: fused(x, w, bk, i, has_lora=False)}
        plans = {}
        if args.early:
            plans = early_candidates(plan, M, N, r, nd, dev)
            for name, p in plans.items():
                impls[name] = lambda x, w, bk, i, p=p: fused(x, w, bk, i, p=p)
        if nd == 1:
            a0 = distinct[0]
            impls["lora_single"] = lambda x, w, bk, i: lora_linear(x, w, bk.bank_a[a0], bk.bank_b[a0], 0.5)
        x, w, bk, i = sets[0]
        ref = (torch.nn.functional.linear(x.double(), w.double()))
        errs = {}
        for name in ("fused", "lora_single", *plans):
            if name in impls:
                want = ref.clone()
                for a in distinct:
                    sel = i == a
                    s = (x[sel].double() @ bk.bank_a[a].double().T)
                    want[sel] += 0.5 * s @ bk.bank_b[a].double().T
                errs[name] = ((impls[name](x, w, bk, i).double() - want).norm() / want.norm()).item()
        base = None
        for name, fn in impls.items():
            t = time_impl(fn, sets)
            us = t.get("graph_us") or t["median_us"]
            base = us if name == "cublas_base" else base
            if name in plans and not errs[name] < 3e-3:
                print(f"{case} {name}: WRONG (rel err {errs[name]}), not timed", flush=True)
                continue
            rows.append({"M": M, "N": N, "r": r, "adapters": nd, "impl": name, "graph_us": round(us, 2),
                         "x_cublas": round(us / base, 3), "rel_err": errs.get(name),
                         "plan": plans.get(name, plan).to_dict()})
            print(f"{case} {name}: {us:.2f} µs ({us / base:.3f}×) err={errs.get(name)}", flush=True)
        del sets
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe_multilora_parts.json").write_text(json.dumps({"meta": device_meta(), "rows": rows}, indent=1))
    table = markdown_table(["M", "N", "r", "adapters", "impl", "graph µs", "× cuBLAS", "rel err"],
                           [[rw["M"], rw["N"], rw["r"], rw["adapters"], rw["impl"], rw["graph_us"], rw["x_cublas"],
                             rw["rel_err"]] for rw in rows])
    (out / "probe_multilora_parts.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
