"""Probe: fused multi-LoRA GEMM plan variants vs cuBLAS and shrink_expand, one process, ≤ 120 s.

    PYTHONPATH=src python scripts/probe_multilora.py --out DIR [--write-tuned] [--budget-s 105]
                                                     [--epi-only | --appended-only]

Cases: bf16, K=4096, r=16, a bank of 64 slots, M ∈ {64, 256} × N ∈ {28672, 4096} × adapters
∈ {1, 4, 16, 64} (random ids). Per case: cublas_base, shrink_expand, the old default plan
(``legacy``: BN shrunk to 32, two launches, one adapter per epilogue MMA), the new heuristic
(``heur``) and a few one-knob variants of it (fuse_d / epi_d / split_k / x_tma / BN), plus both
plans with ``has_lora=False`` (``*_base``: the base GEMM alone, to separate base efficiency from
branch cost). Every candidate is checked against the float64 reference (rel err) before timing;
one that fails to compile, raises or is wrong is reported and skipped. Times: CUDA-graph replay
medians (µs), inputs rotated past the L2. No candidate can block: split-K uses arrival tickets,
never waits on another program.

Epilogue candidates (``epi_*`` rows, cases with ≥ 16 adapters on the shrink-workspace path): the
heuristic plan with ``b_vec`` (16-B vector B gather), ``epi_pipe`` 1 (next group's B loaded before
the current MMA), ``epi_pipe`` 2/3 (compiler-pipelined group loop, cp.async ring) and combinations.
``--epi-only``: just those cases (M ∈ {64, 256} × N ∈ {28672, 4096} × adapters ∈ {16, 64}) with
cublas_base, shrink_expand, heur and the epilogue candidates (fits the 120 s budget on its own).

``--appended-only`` (issue 5): bf16, K=4096, 64 slots, the grid M ∈ {64, 16, 256} × N ∈ {28672, 4096}
× r ∈ {16, 64} × adapters ∈ {64, 16, 4} (M=256 only r=16; M=16 only 4/16 adapters), most telling
cases first so the budget drops the tail: cublas_base, shrink_expand, ``heur`` (the shipped plan,
epilogue expand) vs ``app3`` (expand="appended", 3-deep B ring, A operand S⊙rowmask), ``app3_rs`` /
``app4_rs`` (whole-S MMA, rows selected on the fp32 result), ``app3_rs_clean`` (M=64: bank known
zero-padded, no rank mask on B; never a table winner) and, at N=4096 M≤64 without split-K, a split-2
variant; plus one base-part case (M=64, N=4096, 1 adapter: BN 32/64/128 × split-K with the fused
shrink). Writes DIR/probe_multilora_appended.json and DIR/multilora_h200_appended.json (winners in
the tuned-table format; ``--write-tuned`` merges them into the shipped table).

``--round2``: the cases round 1 lost to shrink_expand and the 16-adapter M ≤ 64 cases (ROUND2_CASES):
cublas_base, shrink_expand, ``app3`` (round 1), ``st2`` / ``st4`` (append_d: 2 or 4 adapters stacked into
one [BN, d·r] step, 16-B cp.async gather), ``*_clean`` (zero-padded bank, no B rank mask: what an
AdapterBank allows; never a table winner), ``st*_s4`` (4-deep ring) and at split-K cases a half-split
variant. Writes DIR/probe_multilora_round2.json and DIR/multilora_h200_round2.json (winners).

Writes DIR/probe_multilora.json (all rows) and DIR/multilora_h200.json (the fastest correct fused
plan per case, in the tuned-table format read by ``multilora_gemm.choose_plan``); with
``--write-tuned`` also into ``src/lowrank_gemm/plan/tuned/multilora_h200.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

import torch

K, R, SLOTS = 4096, 16, 64
CASES = [(M, N, a) for M in (64, 256) for N in (4096, 28672) for a in (1, 4, 16, 64)]   # M=64 first
EPI_CASES = [(M, N, a) for a in (16, 64) for M in (64, 256) for N in (28672, 4096)]
REL_TOL = 1e-2      # bf16 output rounding is ~3e-3 relative; a wrong tile is O(1)


def legacy_plan(mg, M, N, r_max, L, sms):
    """The plan shipped before this probe (BN shrunk to 32 for small N, shrink launch, EPI_D 1)."""
    p = mg.heuristic_plan(M, N, K, r_max, L, "gather", sms)
    block_m = p.main.block_m
    block_n = 128
    while block_n > 32 and math.ceil(M / block_m) * math.ceil(N / block_n) < 0.9 * sms:
        block_n //= 2
    base = p.main.replace(block_n=block_n, split_k=1)
    stages, _, _ = mg.solve_stages(lambda s, _l: mg.main_ledger(base.replace(num_stages=s)), min_main=2, max_main=5)
    return mg.MultiLoRAPlan(main=base.replace(num_stages=stages), shrink=p.shrink)


def restage(mg, plan):
    """Deepest pipeline that fits for this plan's fuse_d / epi_d / epilogue ring."""
    stages, _, _ = mg.solve_stages(
        lambda s, _l: mg.main_ledger(plan.main.replace(num_stages=s), fuse_d=plan.fuse_d, epi_d=plan.epi_d,
                                     epi_pipe=plan.epi_pipe, b_vec=plan.b_vec,
                                     append_stages=plan.append_stages if plan.expand == "appended" else 0,
                                     append_d=plan.append_d),
        min_main=2, max_main=5)
    return mg.MultiLoRAPlan(**{**plan.__dict__, "main": plan.main.replace(num_stages=stages)})


def epi_candidates(mg, h):
    """Epilogue plan candidates on top of the heuristic plan ``h`` (shrink-workspace path only)."""
    if h.fuse_d:
        return {}
    var = lambda **kw: restage(mg, mg.MultiLoRAPlan(**{**h.__dict__, **kw}))  # noqa: E731
    return {"epi_bvec": (var(b_vec=True), True),
            "epi_pipe1": (var(epi_pipe=1), True),
            "epi_pipe1_bvec": (var(epi_pipe=1, b_vec=True), True),
            "epi_pipe2_bvec": (var(epi_pipe=2, b_vec=True), True),
            "epi_pipe3_bvec": (var(epi_pipe=3, b_vec=True), True),
            "epi_pipe1_bvec_d8": (var(epi_pipe=1, b_vec=True, epi_d=8), True)}


def candidates(mg, M, N, adapters, sms, epi_only=False):
    """name → (plan, has_lora). One knob changed per variant, so each row reads as a delta."""
    h = mg.heuristic_plan(M, N, K, R, SLOTS, "gather", sms, adapters=adapters)
    if epi_only:
        return {"heur": (h, True), **epi_candidates(mg, h)}
    old = legacy_plan(mg, M, N, R, SLOTS, sms)
    var = lambda **kw: restage(mg, mg.MultiLoRAPlan(**{**h.__dict__, **kw}))  # noqa: E731
    out = {"legacy": (old, True), "legacy_base": (old, False), "heur": (h, True), "heur_base": (h, False),
           "heur_x_tma": (var(x_tma=True), True)}
    d = 1 << max(0, (min(adapters, h.main.block_m) - 1).bit_length())
    if h.fuse_d:
        out["heur_fuse0_epi4"] = (var(fuse_d=0, epi_d=4), True)
    elif d * R <= 64:
        out[f"heur_fuse{d}"] = (var(fuse_d=d), True)
    if not h.fuse_d and adapters > 1:
        out["heur_epi1"] = (var(epi_d=1), True)
        out["heur_epi8"] = (var(epi_d=8), True)
    s = h.main.split_k
    tiles = math.ceil(M / h.main.block_m) * math.ceil(N / h.main.block_n)
    if s > 1:
        out[f"heur_split{s // 2}"] = (var(main=h.main.replace(split_k=s // 2)), True)
    if tiles < 2 * sms:
        out[f"heur_split{2 * s}"] = (var(main=h.main.replace(split_k=2 * s)), True)
    bn64_split = max(1, min(sms // (2 * tiles), 8))
    out["heur_bn64"] = (var(main=h.main.replace(block_n=64, split_k=bn64_split)), True)
    if adapters >= 16:
        out.update(epi_candidates(mg, h))
    return out


# --appended-only: (M, N, r, adapters), most informative first (the budget guard drops the tail)
APPEND_CASES = ([(64, N, r, a) for r in (16, 64) for N in (28672, 4096) for a in (64, 16, 4)]
                + [(16, N, r, a) for r in (16, 64) for N in (28672, 4096) for a in (16, 4)]
                + [(256, N, 16, a) for N in (28672, 4096) for a in (64, 16, 4)])
BASE_CASE = (64, 4096, 16, 1)       # 1 adapter at N=4096: which tile/split the base part wants


def appended_candidates(mg, M, N, r, adapters, sms):
    """name → (plan, has_lora, b_clean): old heuristic (epilogue expand) vs the appended expand."""
    h = mg.heuristic_plan(M, N, K, r, SLOTS, "gather", sms, adapters=adapters)
    if (M, N, r, adapters) == BASE_CASE:
        var = lambda **kw: restage(mg, mg.MultiLoRAPlan(**{**h.__dict__, **kw}))  # noqa: E731
        return {"heur": (h, True, False), "heur_base": (h, False, False),
                "bn32_fuse1": (var(fuse_d=1, main=h.main.replace(block_n=32, split_k=1)), True, False),
                "bn32_fuse1_base": (var(fuse_d=1, main=h.main.replace(block_n=32, split_k=1)), False, False),
                "bn64_split2_fuse1": (var(fuse_d=1, main=h.main.replace(block_n=64, split_k=2)), True, False),
                "bn128_split2_fuse1": (var(fuse_d=1, main=h.main.replace(split_k=2)), True, False)}
    # appended needs the shrink workspace (fuse_d 0); the ring reuses the dead K-loop buffers
    a = mg.MultiLoRAPlan(**{**h.__dict__, "fuse_d": 0, "expand": "appended"})
    app = lambda **kw: restage(mg, mg.MultiLoRAPlan(**{**a.__dict__, **kw}))  # noqa: E731
    out = {"heur": (h, True, False),
           "app3": (app(append_stages=3), True, False),
           "app3_rs": (app(append_stages=3, append_rowsel=True), True, False),
           "app4_rs": (app(append_stages=4, append_rowsel=True), True, False)}
    if M == 64:
        out["app3_rs_clean"] = (app(append_stages=3, append_rowsel=True), True, True)
    if a.main.split_k == 1 and M * N <= 64 * 4096:       # small N without split: more programs for the adapters
        out["app3_rs_split2"] = (app(append_rowsel=True, main=a.main.replace(split_k=2)), True, False)
    return out


# --round2: the cases round 1 lost to shrink_expand + the 16-adapter M ≤ 64 cases, (M, N, r, adapters)
ROUND2_CASES = [(64, 28672, 16, 16), (64, 28672, 16, 64), (64, 4096, 16, 64), (64, 4096, 16, 16),
                (16, 28672, 16, 16), (16, 4096, 16, 16), (64, 28672, 64, 64), (256, 4096, 16, 64),
                (64, 4096, 64, 64), (16, 4096, 16, 4), (256, 4096, 16, 16)]


def round2_candidates(mg, M, N, r, adapters, sms):
    """name → (plan, has_lora, b_clean): round-1 ``app3`` vs stacked appended steps (``append_d``)."""
    h = mg.heuristic_plan(M, N, K, r, SLOTS, "gather", sms, adapters=adapters)
    a = mg.MultiLoRAPlan(**{**h.__dict__, "fuse_d": 0, "expand": "appended"})
    app = lambda **kw: restage(mg, mg.MultiLoRAPlan(**{**a.__dict__, **kw}))  # noqa: E731
    out = {"app3": (app(append_stages=3), True, False),
           "app3_clean": (app(append_stages=3), True, True)}
    ds = (2, 4) if r <= 16 else (2,)
    for d in ds:
        out[f"st{d}"] = (app(append_d=d, append_stages=3), True, False)
        out[f"st{d}_clean"] = (app(append_d=d, append_stages=3), True, True)
    out[f"st{ds[-1]}_s4"] = (app(append_d=ds[-1], append_stages=4), True, False)
    if a.main.split_k > 1:      # N=4096: fewer split programs → more adapters per program, fewer tickets
        out[f"st{ds[-1]}_split{a.main.split_k // 2}"] = (
            app(append_d=ds[-1], main=a.main.replace(split_k=a.main.split_k // 2)), True, False)
    return out


def make_sets(M, N, adapters, dev, seed, r=R):
    from lowrank_gemm.bench.common import rotation_count
    from lowrank_gemm.bench.multilora import _bank, _ids, floor_bytes
    gen_cpu = torch.Generator().manual_seed(seed)
    gen = torch.Generator(device=dev).manual_seed(seed)
    ids, distinct = _ids(M, adapters, dev, gen_cpu)
    n_sets = rotation_count(floor_bytes(M, N, r, len(distinct)))
    sets = []
    for _ in range(n_sets):
        x = torch.randn(M, K, device=dev, generator=gen).to(torch.bfloat16)
        w = (torch.randn(N, K, device=dev, generator=gen) / math.sqrt(K)).to(torch.bfloat16)
        sets.append((x, w, _bank(N, r, dev, gen), ids))
    return sets, distinct


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--write-tuned", action="store_true",
                    help="also write the winners into src/lowrank_gemm/plan/tuned/multilora_h200.json")
    ap.add_argument("--budget-s", type=float, default=105.0, help="stop starting new timings after this")
    ap.add_argument("--cases", default="", help="subset, e.g. '64x4096x1,256x28672x16' (MxNxadapters)")
    ap.add_argument("--epi-only", action="store_true",
                    help="only the epilogue candidates (and baselines) on the ≥ 16-adapter cases")
    ap.add_argument("--appended-only", action="store_true",
                    help="old heuristic vs the appended expand (expand='appended') on the issue-5 grid, "
                         "r ∈ {16, 64}; --cases then reads MxNxRxadapters")
    ap.add_argument("--round2", action="store_true",
                    help="round 2: app3 (round 1) vs stacked appended steps (append_d 2/4, ± clean bank, "
                         "stages, split) on the cases round 1 lost; --cases then reads MxNxRxadapters")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the probe needs a CUDA GPU")
    from lowrank_gemm.bench.common import device_meta, measure_copy_tbps, time_graph
    from lowrank_gemm.bench.multilora import floor_bytes
    from lowrank_gemm.kernels import multilora_gemm as mg
    from lowrank_gemm.kernels._multilora_baselines import shrink_expand
    from lowrank_gemm.reference import multi_lora_linear_ref

    t0 = time.time()
    dev = torch.device("cuda")
    sms = mg.num_sms(dev)
    copy = measure_copy_tbps(2**30)
    parse = lambda c: tuple(int(v) for v in c.split("x"))  # noqa: E731
    if args.round2:
        cases = ROUND2_CASES if not args.cases else [parse(c) for c in args.cases.split(",")]
    elif args.appended_only:
        cases = [BASE_CASE] + APPEND_CASES if not args.cases else [parse(c) for c in args.cases.split(",")]
    else:
        cases = CASES if not args.cases else [parse(c) for c in args.cases.split(",")]
        if args.epi_only and not args.cases:
            cases = EPI_CASES
        cases = [(M, N, R, a) for M, N, a in cases]
    rows, winners, skipped = [], {}, []
    for M, N, r, adapters in cases:
        if time.time() - t0 > args.budget_s:
            skipped.append(f"{M}x{N}x{r}x{adapters}")
            continue
        try:
            sets, distinct = make_sets(M, N, adapters, dev, seed=M * 131 + N + r * 7 + adapters, r=r)
        except Exception as exc:     # e.g. out of memory: report the case, go on
            skipped.append(f"{M}x{N}x{r}x{adapters} ({type(exc).__name__})")
            continue
        x, w, bk, ids = sets[0]
        ref = multi_lora_linear_ref(x, w, bk.bank_a, bk.bank_b, ids, bk.scales, bk.ranks)
        ref_base = x.double() @ w.double().T
        floor_us = floor_bytes(M, N, r, len(distinct)) / (copy * 1e12) * 1e6
        impls = {"cublas_base": (lambda x, w, bk, i: torch.nn.functional.linear(x, w), None, False),
                 "shrink_expand": (lambda x, w, bk, i: shrink_expand(x, w, bk.bank_a, bk.bank_b, bk.ranks,
                                                                     bk.scales, i), None, True)}
        if args.round2:
            cands = round2_candidates(mg, M, N, r, adapters, sms)
        elif args.appended_only:
            cands = appended_candidates(mg, M, N, r, adapters, sms)
        else:
            cands = {k: (p, hl, False) for k, (p, hl) in candidates(mg, M, N, adapters, sms, args.epi_only).items()}
        for name, (plan, has_lora, b_clean) in cands.items():
            fn = (lambda p, hl, bc: lambda x, w, bk, i: mg.multi_lora_gemm(
                x, w, bk.bank_a, bk.bank_b, bk.ranks, bk.scales, i, mode="gather", plan=p, has_lora=hl,
                validate=False, b_clean=bc))(plan, has_lora, b_clean)
            impls[name] = (fn, plan, has_lora)
        case_rows = []
        for name, (fn, plan, has_lora) in impls.items():
            row = {"M": M, "N": N, "K": K, "r": r, "adapters": len(distinct), "impl": name,
                   "floor_us": round(floor_us, 2), "plan": plan.to_dict() if plan else None}
            if time.time() - t0 > args.budget_s:
                row["status"] = "skipped (budget)"
                case_rows.append(row)
                continue
            try:
                y = fn(*sets[0]).double()
                want = ref if has_lora else ref_base
                err = ((y - want).norm() / want.norm()).item()
                row["rel_err"] = float(f"{err:.3g}")
                if not math.isfinite(err) or err > REL_TOL:
                    row["status"] = "WRONG"
                else:
                    g = time_graph(fn, sets)
                    row.update(status="ok", graph_us=round(g.median_us, 2), p20_us=round(g.p20_us, 2),
                               p80_us=round(g.p80_us, 2), pct_floor=round(100 * floor_us / g.median_us, 1))
            except Exception as exc:  # a candidate that cannot compile or run is reported, not fatal
                row["status"] = f"ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                traceback.print_exc(limit=2, file=sys.stderr)
            case_rows.append(row)
        base = next((r_["graph_us"] for r_ in case_rows if r_["impl"] == "cublas_base" and "graph_us" in r_), None)
        for r_ in case_rows:
            if base and "graph_us" in r_:
                r_["vs_cublas"] = round(r_["graph_us"] / base, 3)
        # *_clean rows assume a zero-padded bank (b_clean): not a plan property, never a table winner
        fused_ok = [r_ for r_ in case_rows if r_.get("plan") and r_["impl"] != "legacy_base"
                    and not r_["impl"].endswith(("_base", "_clean")) and r_.get("status") == "ok"]
        if fused_ok:
            best = min(fused_ok, key=lambda r_: r_["graph_us"])
            best["winner"] = True
            winners[mg.tuned_key(M, N, K, r, len(distinct))] = best["plan"]
        rows += case_rows
        del sets
        torch.cuda.empty_cache()
        print(f"[{time.time() - t0:5.1f}s] M={M} N={N} r={r} a={len(distinct)}  " + "  ".join(
            f"{r_['impl']}={r_.get('graph_us', r_.get('status'))}" for r_ in case_rows), flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mode = ("round2" if args.round2 else "appended-only" if args.appended_only
            else "epi-only" if args.epi_only else "all")
    meta = device_meta(copy) | {"K": K, "r": R if mode in ("all", "epi-only") else "per row", "slots": SLOTS,
                                "mode": mode,
                                "elapsed_s": round(time.time() - t0, 1), "skipped_cases": skipped}
    suffix = "_round2" if args.round2 else "_appended" if args.appended_only else ""
    (out / f"probe_multilora{suffix}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    table = {"version": 1, "note": "written by scripts/probe_multilora.py: fastest correct fused plan per "
             "case; keys from multilora_gemm.tuned_key(M, N, K, r_max, distinct adapters)", "plans": winners}
    table_path = out / f"multilora_h200{suffix}.json"
    table_path.write_text(json.dumps(table, indent=1) + "\n")
    if args.write_tuned:
        mg.TUNED_PATH.parent.mkdir(parents=True, exist_ok=True)
        if (args.appended_only or args.round2) and mg.TUNED_PATH.exists():   # partial grid: merge, keep the rest
            old = json.loads(mg.TUNED_PATH.read_text())
            table = dict(old, plans={**old.get("plans", {}), **winners})
        mg.TUNED_PATH.write_text(json.dumps(table, indent=1) + "\n")

    print("\n| M | N | r | a | floor | impl | graph µs | ×cuBLAS | %floor | rel err | status |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r_ in rows:
        print(f"| {r_['M']} | {r_['N']} | {r_['r']} | {r_['adapters']} | {r_['floor_us']} | {r_['impl']}{' **win**' if r_.get('winner') else ''} "
              f"| {r_.get('graph_us', '')} | {r_.get('vs_cublas', '')} | {r_.get('pct_floor', '')} "
              f"| {r_.get('rel_err', '')} | {r_.get('status', '')} |")
    print(f"\nwrote {out / f'probe_multilora{suffix}.json'} and {table_path}"
          f"{' and ' + str(mg.TUNED_PATH) if args.write_tuned else ''}; {time.time() - t0:.1f}s"
          f"{'; skipped ' + ','.join(skipped) if skipped else ''}")


if __name__ == "__main__":
    main()
