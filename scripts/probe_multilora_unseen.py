"""GPU probe (session 18): the multi-LoRA heuristic's plan on untuned shapes where it still loses to shrink + expand.

    PYTHONPATH=src python scripts/probe_multilora_unseen.py --out DIR [--budget-s 150] [--cases "K,N,r,M,a;…"]

Why: after session 18 made the appended expand the heuristic from 2 adapters on (``probes/s18/verify``: worst cell
25× → 4.7× cuBLAS), 6 of 66 cells on the Llama-3-8B projections still lose to shrink + expand, all at r=16 with
16–64 adapters (fused/SE 1.08–1.18). The tuned in-grid winners there differ from the heuristic in two knobs:
``append_d`` = 4 (four adapters stacked per appended step: M=256, N=4096, 16 / 64 adapters) and 128×256 tiles at
M=256 (N=28672). Per case, in one process: cuBLAS, shrink + expand, the heuristic (``heur``) and one-knob variants
(``st4``: append_d 4; ``bn256``: 128×256 tiles; ``sk2``: in-kernel split-K doubled), each checked against
shrink + expand (relative error ≤ 1e-2) before its CUDA-graph median. Session 19 adds ``--cases`` and, at M > 64, the
other tile width (``bn128`` / ``bn256``) and for one adapter the plan the heuristic gave it before (``fused128``:
shrink fused into the k-loop, 128×128 tiles). Outputs (DIR): ``probe_multilora_unseen.{json,md}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from probe_multilora import restage  # noqa: E402

from lowrank_gemm.bench.common import device_meta, markdown_table, time_graph  # noqa: E402
from lowrank_gemm.bench.multilora import SLOTS, make_case  # noqa: E402
from lowrank_gemm.kernels import multilora_gemm as mg  # noqa: E402
from lowrank_gemm.kernels._multilora_baselines import shrink_expand  # noqa: E402
from lowrank_gemm.kernels.schedule import num_sms  # noqa: E402

# (K, N, r, M, adapters): the six cells lost to shrink + expand first, then close wins at r=64
CASES = ((4096, 6144, 16, 256, 64), (14336, 4096, 16, 256, 64), (4096, 14336, 16, 256, 64),
         (4096, 6144, 16, 64, 64), (4096, 14336, 16, 64, 64), (14336, 4096, 16, 256, 16),
         (4096, 6144, 64, 64, 64), (14336, 4096, 64, 256, 16), (4096, 6144, 64, 256, 64))
TOL = 1e-2


def variants(h: mg.MultiLoRAPlan, M: int, r: int, nd: int) -> dict:
    out = {"heur": h}
    var = lambda **kw: restage(mg, dataclasses.replace(h, **kw))  # noqa: E731
    if r <= 16 and h.expand == "appended":
        out["st4"] = var(append_d=4)
    if M > 64:
        other = 128 if h.main.block_n == 256 else 256
        out[f"bn{other}"] = var(main=h.main.replace(block_n=other))
        if nd == 1 and h.expand == "appended":
            # session 19: the plan the heuristic gave one adapter at M > 64 before — shrink fused in the k-loop,
            # expand in the epilogue, 128×128 tiles
            out["fused128"] = var(main=h.main.replace(block_n=128), fuse_d=1, expand="epilogue", s_unroll=False)
    out["sk2"] = var(main=h.main.replace(split_k=max(2, 2 * h.main.split_k)))
    if nd >= 16 and h.expand == "appended" and not h.main.swap_ab:
        # session 28: what won the tuned 64-adapter cells since session 27 — the shrink by row (a program per row ×
        # K slice) on 8 warps, with the appended expand stacking four adapters a step; at M ≤ 64 the rows expand
        # (each row's branch on the CUDA cores, 32-row chunks)
        for ks in (4, 8):
            sr = dict(shrink_rows=True, shrink=h.shrink.replace(split_k=ks, num_warps=8))
            out[f"sr{ks}w8"] = var(**sr)
            if r <= 16:
                out[f"sr{ks}w8_st4"] = var(append_d=4, **sr)
        if M <= 64:
            rows = dict(expand="rows", rows_chunk=mg.rows_chunk(h.main, h.main.block_r, 32))
            out["rows32"] = var(**rows)
            out["rows32_sr4w8"] = var(**rows, shrink_rows=True, shrink=h.shrink.replace(split_k=4, num_warps=8))
    return out


def probe_case(K, N, r, M, adapters):
    dev = torch.device("cuda")
    sets, distinct, _ = make_case(M, N, r, adapters, K, dev)       # the bench's inputs for the same case
    nd = len(distinct)
    x, w, bk, i = sets[0]
    ref = shrink_expand(x, w, bk.bank_a, bk.bank_b, bk.ranks, bk.scales, i).double()
    base = {"K": K, "N": N, "r": r, "M": M, "adapters": nd}
    rows = [dict(base, impl="cublas_base", graph_us=round(time_graph(
                lambda x, w, bk, i: torch.nn.functional.linear(x, w), sets).median_us, 3)),
            dict(base, impl="shrink_expand", graph_us=round(time_graph(
                lambda x, w, bk, i: shrink_expand(x, w, bk.bank_a, bk.bank_b, bk.ranks, bk.scales, i), sets
            ).median_us, 3))]
    h = mg.heuristic_plan(M, N, K, r, SLOTS, "gather", num_sms(dev), nd)
    try:
        cands = variants(h, M, r, nd)
    except Exception as exc:        # a variant the ledger cannot stage: report, keep the heuristic
        cands = {"heur": h}
        rows.append(dict(base, impl="variants", error=f"{type(exc).__name__}: {exc}"[:300]))
    for name, plan in cands.items():
        def fn(x, w, bk, i, plan=plan):
            return mg.multi_lora_gemm(x, w, bk.bank_a, bk.bank_b, bk.ranks, bk.scales, i, mode="gather", plan=plan,
                                      validate=False, adapters=nd, b_clean=bk.B_ZERO_PADDED)
        row = dict(base, impl=name, plan=plan.to_dict())
        try:
            y1, y2 = fn(*sets[0]), fn(*sets[0])
            torch.cuda.synchronize()
            row["rel_err"] = float((y1.double() - ref).norm() / ref.norm())
            row["bitwise_repeat"] = bool(torch.equal(y1, y2))
            if row["rel_err"] <= TOL and row["bitwise_repeat"]:
                row["graph_us"] = round(time_graph(fn, sets).median_us, 3)
            else:
                row["error"] = f"wrong or not repeatable: rel err {row['rel_err']:.3g}, repeat {row['bitwise_repeat']}"
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
    cub = rows[0]["graph_us"]
    for row in rows:
        if row.get("graph_us"):
            row["x_cublas"] = round(row["graph_us"] / cub, 3)
    del sets
    torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--cases", default=None, help="K,N,r,M,adapters;… (default: CASES, session 18's six cells)")
    args = ap.parse_args(argv)
    cases = CASES if args.cases is None else [tuple(int(v) for v in c.split(",")) for c in args.cases.split(";")]
    args.out.mkdir(parents=True, exist_ok=True)
    meta, rows, skipped, t0 = device_meta(), [], [], time.time()
    for case in cases:
        if time.time() - t0 > args.budget_s:
            skipped.append(case)
            continue
        got = probe_case(*case)
        rows += got
        print(f"[{time.time() - t0:6.1f}s] K,N,r,M,a={case}: " +
              " ".join(f"{x['impl']}={x.get('x_cublas', x.get('error', '?'))}" for x in got), flush=True)
        (args.out / "probe_multilora_unseen.json").write_text(json.dumps({"meta": meta, "rows": rows,
                                                                          "skipped": skipped}, indent=1))
    labels = ["shrink_expand", "heur", "st4", "bn256", "bn128", "fused128", "sk2", "sr4w8", "sr8w8", "sr4w8_st4",
              "sr8w8_st4", "rows32", "rows32_sr4w8"]
    table = []
    for case in dict.fromkeys((x["K"], x["N"], x["r"], x["M"], x["adapters"]) for x in rows):
        rs = {x["impl"]: x for x in rows if (x["K"], x["N"], x["r"], x["M"], x["adapters"]) == case}
        table.append([*case, rs["cublas_base"]["graph_us"]] +
                     [rs[lb].get("x_cublas", rs[lb].get("error", "err")) if lb in rs else "-" for lb in labels])
    md = (f"# multi-LoRA heuristic variants on untuned shapes\n\n{json.dumps(meta)}\n\n(× cuBLAS without the branch, "
          f"CUDA-graph medians; skipped: {skipped})\n\n" +
          markdown_table(["K", "N", "r", "M", "adapters", "cuBLAS µs"] + labels, table))
    (args.out / "probe_multilora_unseen.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
