"""Probe: where the fused multi-LoRA GEMM's time goes on the issue-5 cells that sit just above 1.10× cuBLAS.

    PYTHONPATH=src python scripts/probe_multilora_parts.py --out DIR [--cases 16x28672x16x1,...]

Per case (bf16, K = 4096, a bank of 64 slots, random ids; MxNxRxadapters), one process, CUDA-graph replay
medians with the bench's rotated input sets: ``cublas_base``; ``fused`` (what ``bench multilora`` times: tuned
plan, gather mode); ``fused_base`` (the same plan with ``has_lora=False``: the main kernel's base product alone,
no shrink launch); ``lora_single`` (one adapter only: the single-adapter ``lora_linear`` with that adapter's A, B
and scale — what the same bytes cost through the LoRA kernel). Writes DIR/probe_multilora_parts.{json,md}.

``--configs`` adds main-loop candidates that fit two CTAs per SM (ncu, session 14: with the branch the main kernel
runs 5–6 µs longer than without it, and today's plans hold 185–214 KB of SMEM, one CTA per SM over 224 tiles, so
every tile's epilogue sits on the critical path twice): the tuned plan (expand, shrink, fuse_d kept) with BK = 64
and 6 (M ≤ 16) or 4 stages, with BK = 64 and 3 stages, with BN = 64 (BK kept, or 64 with 6 stages), and (M ≤ 16,
when today's plan is not swap-AB) the single-adapter kernel's swap-AB config with either expand. Every fused row is
checked against the float64 reference before it is timed.

``--rows`` (session 27) adds the tuned plan with ``expand="rows"`` (each row's branch on the CUDA cores,
:func:`multilora_gemm.rows_expand`) at 8 / 16 / 32 rows per chunk (≤ block_m), and with split-K doubled, and times
``shrink_expand`` (the bench's Punica-style baseline) beside them: the issue's "faster than shrink + expand" cells.

``--mains BMxBNxBKxSTAGESxSPLIT,...`` (session 27) adds, per main-loop config, the case's plan on it with the
appended expand (the tuned appended flags, or the heuristic's) and with the rows expand at 16 and 64 rows per chunk
(capped by ``multilora_gemm.rows_chunk``); configs the ledger rejects or whose BM exceeds 2·M are skipped.
``--shrink-splits 4,8`` adds each --mains candidate again with the shrink launch's K slices set to each value (ncu,
session 27: at M = 256, 64 adapters, the shrink alone took 13.9 µs over its 2 slices, the main kernel 31.9).

``--shrink-rows 4,8`` (session 27) adds the case's tuned plan with the shrink launch by row
(``MultiLoRAPlan.shrink_rows``) at each number of K slices.

``--pin-from JSON`` (CPU, no GPU needed): merge a --configs run's winners into the shipped tuned table
(``plan/tuned/multilora_h200.json``) — a candidate replaces the case's plan only if it was at least ``--min-gain``
(3 %) faster than ``fused`` (today's plan) in that run. ``--mode segment`` runs every fused row in segment mode (the
sort included) and pins its winners as the case's segment entries (``tuned_key(..., "segment")``). ``--table PATH``
writes another GPU's table instead (e.g. ``plan/tuned/multilora_h100.json``; a new one holds only its own entries and
``extends`` the shipped one).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

DEFAULT_CASES = ("16x28672x16x1,16x28672x16x4,16x28672x64x1,16x28672x64x4,64x28672x16x1,64x28672x16x4,"
                 "64x28672x64x4,16x28672x16x16,16x4096x16x1")


def config_candidates(plan, M):
    """Main-loop variants of one case's plan that leave room for two CTAs per SM (ledger-checked)."""
    import dataclasses
    from lowrank_gemm.kernels import multilora_gemm as mg
    main = plan.main
    cands = {"k64s6" if M <= 16 else "k64s4": main.replace(block_k=64, num_stages=6 if M <= 16 else 4),
             "k64s3": main.replace(block_k=64, num_stages=3),
             "n64": main.replace(block_n=64, num_stages=min(main.num_stages, 4)),
             "n64k64": main.replace(block_n=64, block_k=64, num_stages=6)}
    plans = {name: dataclasses.replace(plan, main=cfg) for name, cfg in cands.items()}
    if M <= 16 and not main.swap_ab:       # the single-adapter kernel's swap-AB config (shrink launch, PDL)
        swap = main.replace(block_m=16, block_n=128, block_k=64, num_stages=6, swap_ab=True, num_warps=4)
        for expand in ("epilogue", "appended"):
            plans[f"swap_k64s6_{expand[:3]}"] = dataclasses.replace(plan, main=swap, fuse_d=0, expand=expand,
                                                                    s_unroll=True, x_tma=False)
    out = {}
    for name, p in plans.items():
        cfg = p.main
        if mg.can_implement(cfg, fuse_d=p.fuse_d, epi_d=p.epi_d, epi_pipe=p.epi_pipe, b_vec=p.b_vec,
                            append_stages=p.append_stages if p.expand == "appended" else 0, append_d=p.append_d):
            out[name] = p
    return out


def rows_candidates(plan, M):
    """The case's plan with the rows expand (shrink launch, S summed unrolled), chunk sizes and one deeper split."""
    import dataclasses
    from lowrank_gemm.kernels import multilora_gemm as mg
    rows = dataclasses.replace(plan, fuse_d=0, expand="rows", s_unroll=True, x_tma=False)
    out = {}
    for rc in (8, 16, 32):
        if rc <= plan.main.block_m:
            out[f"rows_c{rc}"] = dataclasses.replace(rows, rows_chunk=rc)
    split = plan.main.split_k
    if split < 8:
        out[f"rows_c16_s{2 * split}"] = dataclasses.replace(rows, rows_chunk=16,
                                                              main=plan.main.replace(split_k=2 * split))
    return {n: p for n, p in out.items() if mg.can_implement(p.main)}


def main_candidates(plan, M, specs, shrink_splits=(), shrink_rows=()):
    """The case's plan on each main-loop config of ``specs`` with the appended and the rows expand (and each of
    those with the shrink split into each of ``shrink_splits`` K slices)."""
    import dataclasses
    from lowrank_gemm.kernels import multilora_gemm as mg
    out = {}
    for spec in specs:
        bm, bn, bk, st, sp = (int(v) for v in spec.split("x"))
        if bm > 2 * max(M, 16):
            continue
        main = plan.main.replace(block_m=bm, block_n=bn, block_k=bk, num_stages=st, split_k=sp, swap_ab=False,
                                 num_warps=8 if bm >= 128 else 4)
        app = dataclasses.replace(plan, main=main, fuse_d=0, expand="appended", s_unroll=True, x_tma=False,
                                  append_stages=plan.append_stages or 3)
        rows = dataclasses.replace(app, expand="rows")
        for name, p in ((f"{spec}_app", app), (f"{spec}_rows16", dataclasses.replace(rows, rows_chunk=16)),
                        (f"{spec}_rows64", dataclasses.replace(rows, rows_chunk=64))):
            stages = p.append_stages if p.expand == "appended" else 0
            if mg.can_implement(p.main, append_stages=stages):
                out[name] = p
                for ss in shrink_splits:
                    out[f"{name}_ss{ss}"] = dataclasses.replace(p, shrink=p.shrink.replace(split_k=ss))
                for ss in shrink_rows:        # with --shrink-rows: the shrink by row as well
                    out[f"{name}_sr{ss}"] = dataclasses.replace(p, shrink_rows=True,
                                                                shrink=p.shrink.replace(split_k=ss))
    return out


def shrink_rows_candidates(plan, splits):
    """The case's plan with the shrink by row (shrink launch needed: fused-shrink plans move to the appended expand)."""
    import dataclasses
    base = plan if plan.fuse_d == 0 else dataclasses.replace(plan, fuse_d=0, expand="appended", s_unroll=True,
                                                                 x_tma=False)
    return {f"tuned_sr{ss}": dataclasses.replace(base, shrink_rows=True, shrink=base.shrink.replace(split_k=ss))
            for ss in splits}


def edit_candidates(plan, spec):
    """``--edits``: named copies of the case's plan with fields set (session 28); ledger-rejected ones are skipped."""
    import dataclasses
    from lowrank_gemm.kernels import multilora_gemm as mg

    def value(v):
        return {"true": True, "false": False}.get(v.lower(), int(v) if v.lstrip("-").isdigit() else v)
    out = {}
    for item in filter(None, spec.split(";")):
        name, _, fields = item.partition(":")
        p = plan
        for f in filter(None, fields.split(",")):
            key, _, v = f.partition("=")
            if key.startswith(("main.", "shrink.")):
                part, _, field = key.partition(".")
                p = dataclasses.replace(p, **{part: getattr(p, part).replace(**{field: value(v)})})
            else:
                p = dataclasses.replace(p, **{key: value(v)})
        if mg.can_implement(p.main, fuse_d=p.fuse_d, epi_d=p.epi_d, epi_pipe=p.epi_pipe, b_vec=p.b_vec,
                            append_stages=p.append_stages if p.expand == "appended" else 0, append_d=p.append_d):
            out[name] = p
        else:
            print(f"edit {name}: the ledger rejects {p.main}", flush=True)
    return out


def case_inputs(M, N, r, adapters, dev):
    """(the batch's distinct adapter slots, rotated input sets (x, W, the bench's 64-slot bank, ids)) of one case,
    seeded by the case: the bench's inputs (``bench.multilora``), the same in every probe that asks for the case."""
    from lowrank_gemm.bench.multilora import K, _bank, _ids, floor_bytes
    from lowrank_gemm.bench.common import rotation_count
    gen_cpu = torch.Generator().manual_seed(M * 131 + N + r * 7 + adapters)
    gen = torch.Generator(device=dev).manual_seed(M * 131 + N + r * 7 + adapters)
    ids, distinct = _ids(M, adapters, dev, gen_cpu)
    sets = []
    for _ in range(rotation_count(floor_bytes(M, N, r, len(distinct)))):
        x = torch.randn(M, K, device=dev, generator=gen).to(torch.bfloat16)
        w = (torch.randn(N, K, device=dev, generator=gen) / math.sqrt(K)).to(torch.bfloat16)
        sets.append((x, w, _bank(N, r, dev, gen), ids))
    return distinct, sets


BASELINES = ("cublas_base", "fused", "fused_base", "fused_gather", "lora_single", "shrink_expand")


def pin_winners(path, min_gain, table_path=None, label="session 14: scripts/probe_multilora_parts.py --configs"):
    """Winners of a --configs run into the tuned table (default: the shipped one; keys: multilora_gemm.tuned_key, as
    choose_plan reads them). Returns the pinned cases."""
    from lowrank_gemm.bench.multilora import K
    from lowrank_gemm.kernels import multilora_gemm as mg
    run = json.loads(Path(path).read_text())
    table_path = Path(table_path or mg.TUNED_PATH)
    table = (json.loads(table_path.read_text()) if table_path.exists() else    # a new GPU's table: its own entries
             {"version": 1, "extends": Path(mg.TUNED_PATH).name, "plans": {}})   # over the shipped one
    by_case = {}
    for rw in run["rows"]:
        by_case.setdefault((rw["M"], rw["N"], rw["r"], rw["adapters"]), {})[rw["impl"]] = rw
    pinned = []
    for (M, N, r, nd), impls in sorted(by_case.items()):
        today = impls.get("fused")
        cands = [rw for name, rw in impls.items() if name not in BASELINES]
        if not today or not cands:
            continue
        best = min(cands, key=lambda rw: rw["graph_us"])
        if best["graph_us"] <= (1 - min_gain) * today["graph_us"]:
            table["plans"][mg.tuned_key(M, N, K, r, nd, today.get("mode", "gather"))] = best["plan"]
            pinned.append(f"{M}x{N}x{r}x{nd}: {best['impl']} {best['graph_us']} µs (today {today['graph_us']})")
    if pinned:
        src = (f"{label} ({run['meta'].get('date', '?')}): "
               f"{len(pinned)} winners ≥ {min_gain:.0%} faster than the plan they replace")
        table["sources"] = [*table.get("sources", []), src]
        table_path.write_text(json.dumps(table, indent=1))
    print("\n".join(pinned) or "nothing pinned")
    return pinned


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--configs", action="store_true")
    ap.add_argument("--rows", action="store_true")
    ap.add_argument("--mains", default="")
    ap.add_argument("--shrink-splits", default="")
    ap.add_argument("--shrink-rows", default="")
    ap.add_argument("--edits", default="", help="NAME:field=v,field=v;… — the case's tuned plan with those fields set "
                                                "(main.<f> / shrink.<f> for the two configs, else the plan's own)")
    ap.add_argument("--label", default="session 14: scripts/probe_multilora_parts.py --configs")
    ap.add_argument("--pin-from", default="")
    ap.add_argument("--min-gain", type=float, default=0.03)
    ap.add_argument("--mode", default="gather", choices=("gather", "segment"),
                    help="the mode every fused row runs (segment: the rows sorted by adapter, the sort included; "
                         "pinned as the case's segment entry)")
    ap.add_argument("--table", default="", help="--pin-from: the tuned table to write (default: the shipped H200 "
                                                 "one; e.g. plan/tuned/multilora_h100.json, created from it)")
    args = ap.parse_args(argv)
    if args.pin_from:
        return pin_winners(args.pin_from, args.min_gain, table_path=args.table or None, label=args.label)
    from lowrank_gemm.bench.common import device_meta, markdown_table, time_impl
    from lowrank_gemm.bench.multilora import K, SLOTS
    from lowrank_gemm.kernels import multilora_gemm as mg
    from lowrank_gemm.kernels._multilora_baselines import shrink_expand
    from lowrank_gemm.kernels.lora_gemm import lora_linear
    dev = torch.device("cuda")
    rows = []
    for case in args.cases.split(","):
        M, N, r, adapters = (int(v) for v in case.split("x"))
        distinct, sets = case_inputs(M, N, r, adapters, dev)
        nd = len(distinct)
        plan = mg.choose_plan(M, N, K, r, SLOTS, args.mode, dev, adapters=nd)

        def fused(x, w, bk, i, has_lora=True, p=None, mode=args.mode):
            return mg.multi_lora_gemm(x, w, bk.bank_a, bk.bank_b, bk.ranks, bk.scales, i, mode=mode,
                                      validate=False, adapters=nd, b_clean=bk.B_ZERO_PADDED, has_lora=has_lora,
                                      plan=p)
        impls = {"cublas_base": lambda x, w, bk, i: torch.nn.functional.linear(x, w),
                 "fused": fused,
                 "fused_base": lambda x, w, bk, i: fused(x, w, bk, i, has_lora=False)}
        if args.mode == "segment":     # the gather plan in gather mode beside it: what mode="auto" chooses between
            impls["fused_gather"] = lambda x, w, bk, i: fused(x, w, bk, i, mode="gather")
        plans = {}
        if args.configs:
            plans.update(config_candidates(plan, M))
        if args.shrink_rows:
            plans.update(shrink_rows_candidates(plan, [int(v) for v in args.shrink_rows.split(",")]))
        if args.rows or args.mains or args.shrink_rows or args.edits:
            impls["shrink_expand"] = lambda x, w, bk, i: shrink_expand(x, w, bk.bank_a, bk.bank_b, bk.ranks, bk.scales,
                                                                       i)
        if args.rows:
            plans.update(rows_candidates(plan, M))
        if args.edits:
            plans.update(edit_candidates(plan, args.edits))
        if args.mains:
            splits = [int(v) for v in args.shrink_splits.split(",") if v]
            srows = [int(v) for v in args.shrink_rows.split(",") if v]
            plans.update(main_candidates(plan, M, args.mains.split(","), splits, srows))
        for name, p in plans.items():
            impls[name] = lambda x, w, bk, i, p=p: fused(x, w, bk, i, p=p)
        if nd == 1:
            a0 = distinct[0]
            impls["lora_single"] = lambda x, w, bk, i: lora_linear(x, w, bk.bank_a[a0], bk.bank_b[a0], 0.5)
        x, w, bk, i = sets[0]
        ref = (torch.nn.functional.linear(x.double(), w.double()))
        errs = {}
        for name in ("fused", "fused_gather", "lora_single", *plans):
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
            rows.append({"M": M, "N": N, "r": r, "adapters": nd, "mode": args.mode, "impl": name,
                         "graph_us": round(us, 2),
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
