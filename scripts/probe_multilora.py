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

``--pdl`` also times swap-AB candidates at M ≤ 64 (session 6, ``swap_*`` rows: ``KernelConfig.swap_ab`` main loops,
shrink launch + PDL + unrolled S sum).

``--pdl`` (session 5, one GPU call ≤ 4 min; ``--cases`` reads MxNxRxadapters): the issue grid M ∈ {16,
64, 256} × N ∈ {4096, 28672} × r ∈ {16, 64} × adapters ∈ {1, 4, 16, 64}, most telling cases first
(PDL_CASES; the budget, 200 s by default, drops the tail). First ``--jobs`` child processes compile
every kernel the grid needs (killed after ``--warm-s``; the timing process compiles anything they
missed), then a small ragged case gates correctness (float64 reference, NaN-poisoned outputs and
workspaces, −1 rows equal to the base, repeats and CUDA-graph replays bit-identical, PDL and
``s_unroll`` bit-identical to PDL off; a kind that fails is not timed). Per case: cublas_base,
shrink_expand, ``fused`` (today's call: tuned table / heuristic, PDL off), ``fused_pdl``,
``fused_pdl_sum`` (+ the unrolled S sum) and plan candidates with both (see :func:`pdl_impls`); each
row is checked before it is timed (float64 reference within 2× the unfused torch path's error + 1e-3,
bit-identity to its PDL-off row, graph replay == eager for PDL rows). Writes DIR/probe_multilora_pdl.json
/ .md and DIR/multilora_h200_pdl.json (the fastest correct plan per case among the PDL rows);
``--write-tuned`` merges those into the shipped table (right only once PDL is turned on).
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


def make_sets(M, N, adapters, dev, seed, r=R, max_sets=None):
    from lowrank_gemm.bench.common import rotation_count
    from lowrank_gemm.bench.multilora import _bank, _ids, floor_bytes
    gen_cpu = torch.Generator().manual_seed(seed)
    gen = torch.Generator(device=dev).manual_seed(seed)
    ids, distinct = _ids(M, adapters, dev, gen_cpu)
    n_sets = min(rotation_count(floor_bytes(M, N, r, len(distinct))), max_sets or 64)
    sets = []
    for _ in range(n_sets):
        x = torch.randn(M, K, device=dev, generator=gen).to(torch.bfloat16)
        w = (torch.randn(N, K, device=dev, generator=gen) / math.sqrt(K)).to(torch.bfloat16)
        sets.append((x, w, _bank(N, r, dev, gen), ids))
    return sets, distinct


# ----------------------------------------------------------------------------------------------
# --pdl (session 5): PDL between the shrink and the main kernel + the unrolled S sum, issue grid
# ----------------------------------------------------------------------------------------------

# (M, N, r, adapters), most telling first (the budget guard drops the tail): the N=4096 M ≤ 64 cases
# (furthest from cuBLAS), N=28672 r16, r64, M=256; last the plans that fuse the shrink into the
# K loop (1 adapter; M=16 r16 4 adapters): one launch, nothing for PDL to hide
PDL_CASES = ([(M, 4096, 16, a) for M in (64, 16) for a in (4, 16, 64)]
             + [(64, 28672, 16, a) for a in (4, 16, 64)] + [(16, 28672, 16, a) for a in (16, 64)]
             + [(M, N, 64, a) for N in (4096, 28672) for M in (64, 16) for a in (4, 16, 64)]
             + [(256, N, r, a) for r in (16, 64) for N in (4096, 28672) for a in (4, 16, 64)]
             + [(M, N, r, 1) for M in (64, 16, 256) for N in (4096, 28672) for r in (16, 64)]
             + [(16, 28672, 16, 4)])
# swap-AB candidates (BN, BK, split) at M ≤ 64: 64-wide K steps keep two 128-row CTAs per SM (all 224 tiles of
# N=28672 resident at once; LoRA's swap winner there), 256-wide ones suit 64-row tiles at N=4096 (probe_box.md)
SWAP_TILES_WIDE_N = ((128, 64, 1), (128, 128, 1), (64, 128, 1), (64, 256, 1))
SWAP_TILES_NARROW_N = ((64, 256, 1), (64, 128, 1), (64, 128, 2), (128, 128, 4))
PDL_SMALL = (77, 3000, 1000, 9, 24)      # M, N, K, slots, r_max: ragged tiles, BLOCK_R 32 > r_max, −1 rows
SMALL_DTYPE = torch.bfloat16             # (the CPU dry-run test uses fp16: bf16 dots are wrong in the interpreter)


def pdl_impls(mg, M, N, r, adapters, dev):
    """name → spec of the fused rows of one case. ``fused`` is today's call (``choose_plan``: tuned
    table, else heuristic; PDL off); ``fused_pdl`` the same plan with PDL; ``fused_pdl_sum`` + the
    unrolled S sum (plan ``s_unroll``); plan candidates with both: fewer shrink K slices
    (``fused_pdl_sum_ss1`` at N=28672; ``_ss4`` at N=4096, with a 2-stage shrink), the appended expand
    where the plan still uses the epilogue one (untuned M=256 r=64), BN 64 split 2 / BN 32 no split at N=4096
    M ≤ 64 (the split-K fixup costs ~4 µs there: base 19 µs split 4 vs 15 µs BN 32), 128×256 tiles at
    M=256 N=28672, and segment mode at M > 64 (what ``mode="auto"`` runs; the id sort is in the call).
    ``same_as``: the row whose output this one must equal bit for bit; ``pin``: may win the table."""
    from dataclasses import replace

    def spec(plan, mode="gather", pdl=False, same_as=None, pin=False):
        return dict(plan=plan, mode=mode, pdl=pdl, same_as=same_as, pin=pin)

    def candidate(name, make_plan, **kw):
        try:        # a candidate that cannot be built (no pipeline depth fits) becomes an ERROR row
            out[name] = spec(make_plan(), **kw)
        except Exception as exc:
            out[name] = dict(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")

    p = mg.choose_plan(M, N, K, r, SLOTS, "gather", dev, adapters=adapters)
    out = {"fused": spec(p)}
    if M <= 64:
        # session 6: swap-AB main loops (W·Xᵀ; 16/64 tokens on the wgmma N) with the shrink launch, PDL and the
        # unrolled S sum; from the fused-shrink plans too (swap needs fuse_d = 0)
        sw = p if not p.fuse_d else replace(p, fuse_d=0, epi_d=max(p.epi_d, 64 // p.main.block_r))
        sw = replace(sw, s_unroll=True)
        for bn, bk, split in (SWAP_TILES_WIDE_N if N >= 16384 else SWAP_TILES_NARROW_N):
            candidate(f"swap_bn{bn}k{bk}s{split}_pdl_sum", lambda bn=bn, bk=bk, split=split: restage(mg, replace(
                sw, main=sw.main.replace(swap_ab=True, block_m=16 if M <= 16 else 64, block_n=bn, block_k=bk,
                                         split_k=split, num_warps=4))), pdl=True, pin=True)
    if p.fuse_d:        # no shrink launch: PDL and s_unroll change nothing
        return out
    su = replace(p, s_unroll=True)
    out["fused_pdl"] = spec(p, pdl=True, same_as="fused", pin=True)
    out["fused_pdl_sum"] = spec(su, pdl=True, same_as="fused", pin=True)
    # with the shrink hidden behind the K loop its own length stops mattering while it is shorter than
    # the loop (~35 µs per tile wave at N=28672, ~10 at N=4096): fewer K slices → fewer S loads on every
    # main program's tail, and fewer live shrink programs. Those compete with the main CTAs for SMEM: a
    # 197 KB main CTA leaves room for two 16 KB (3-stage) shrink programs on its SM, or three 8 KB
    # (2-stage) ones; at N=4096 (one wave of main CTAs) one delayed main CTA delays the whole call
    few, stages = (1, su.shrink.num_stages) if N >= 16384 else (4, 2)
    if p.shrink.split_k > few:
        candidate(f"fused_pdl_sum_ss{few}", lambda: replace(
            su, shrink=su.shrink.replace(split_k=few, num_stages=stages)), pdl=True, pin=True)
    if p.expand == "epilogue":
        candidate("app_pdl_sum", lambda: restage(mg, replace(su, expand="appended", append_stages=3,
                                                             append_rowsel=False, append_d=1)), pdl=True, pin=True)
    elif M <= 64 and N <= 4096:
        for bn, split in ((64, 2), (32, 1)):
            candidate(f"bn{bn}s{split}_pdl_sum", lambda bn=bn, split=split: restage(mg, replace(
                su, main=su.main.replace(block_n=bn, split_k=split))), pdl=True, pin=True)
    appended = out["app_pdl_sum"]["plan"] if "plan" in out.get("app_pdl_sum", {}) else su
    if M > 64 and N >= 16384 and appended.expand == "appended" and appended.main.block_n < 256:
        # M=256: 128×128 tiles re-read x N/128 times and W twice from L2 (~0.94 GB at N=28672, 3.4 waves
        # of CTAs); 128×256 tiles: ~0.70 GB, 1.7 waves (ptxas: 255 registers, no spill at r16)
        candidate("bn256_pdl_sum", lambda: restage(mg, replace(appended, main=appended.main.replace(
            block_n=256, split_k=1))), pdl=True, pin=True)
    if M > 64:
        out["seg"] = spec(p, mode="segment")
        out["seg_pdl_sum"] = spec(su, mode="segment", pdl=True, same_as="seg")
        if appended is not su:
            out["app_seg_pdl_sum"] = spec(appended, mode="segment", pdl=True)
    return out


def _pdl_call(mg, sp):
    """(x, w, bank, ids, poison=False) → y through multi_lora_gemm with the spec's plan/mode/PDL."""
    def call(x, w, bk, i, poison=False):
        return mg.multi_lora_gemm(x, w, bk.bank_a, bk.bank_b, bk.ranks, bk.scales, i, mode=sp["mode"],
                                  plan=sp["plan"], validate=False, b_clean=bk.B_ZERO_PADDED, pdl=sp["pdl"],
                                  poison_workspace=poison, has_lora=sp.get("has_lora", True))
    return call


def _graph_replays_equal(call, expect, reps=3):
    """One call captured in a CUDA graph (its workspaces NaN-poisoned inside the graph, so a read of S
    before the shrink wrote it shows up), output NaN-filled before each replay: every replay == expect."""
    from lowrank_gemm.bench.common import capture_graph
    _, g, y = capture_graph(call)
    ok = True
    for _ in range(reps):
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ok = ok and torch.equal(y, expect)
    del g
    return ok


def _nerr(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


def pdl_small_gate(mg, dev, dtype=torch.bfloat16):
    """Correctness before any timing, on one small ragged case (float64 reference, NaN-poisoned
    outputs and workspaces): each plan kind × mode with PDL off / on / on + s_unroll. Returns
    (rows, failed kinds ⊆ {"pdl", "sum"}): a failed kind is not timed on the grid."""
    from dataclasses import replace

    from lowrank_gemm.nn.multilora import AdapterBank
    from lowrank_gemm.reference import multi_lora_linear_ref
    M, N, Ks, L, r_max = PDL_SMALL
    g = torch.Generator(device=dev).manual_seed(5)
    x = torch.randn(M, Ks, device=dev, generator=g).to(dtype)
    w = (torch.randn(N, Ks, device=dev, generator=g) / math.sqrt(Ks)).to(dtype)
    bank = AdapterBank(L, r_max, Ks, N, dtype=dtype, device=dev)
    for l in range(L):
        rk = max(1, r_max - (5 * l) % r_max)          # mixed ranks, r_max for slot 0
        bank.set_adapter(l, (torch.randn(rk, Ks, device=dev, generator=g) / math.sqrt(Ks)).to(dtype),
                         (torch.randn(N, rk, device=dev, generator=g) / math.sqrt(rk)).to(dtype), 0.5 + l / L)
    ids = torch.randint(-1, L, (M,), device=dev, generator=g, dtype=torch.int32)
    ids[::7] = -1
    ref = multi_lora_linear_ref(x, w, bank.bank_a, bank.bank_b, ids, bank.scales, bank.ranks)
    rounding = _nerr((x.float() @ w.float().T).to(dtype), x.double() @ w.double().T)
    tol = 4 * rounding + 2e-3
    h = mg.heuristic_plan(M, N, Ks, r_max, L, "gather", mg.num_sms(dev), adapters=L)
    plans = {"epilogue": (h, ("gather",)),
             "appended_split2": (restage(mg, replace(h, fuse_d=0, expand="appended", main=h.main.replace(split_k=2))),
                                 ("gather", "segment")),
             "appended": (restage(mg, replace(h, fuse_d=0, expand="appended", main=h.main.replace(split_k=1))),
                          ("gather",))}
    rows, failed = [], set()
    base_rows = ids == -1
    for pname, (plan, modes) in plans.items():
        for mode in modes:
            first = None
            for kind, sp in (("off", dict(plan=plan, pdl=False)), ("pdl", dict(plan=plan, pdl=True)),
                             ("sum", dict(plan=replace(plan, s_unroll=True), pdl=True))):
                sp = dict(sp, mode=mode)
                call = _pdl_call(mg, sp)
                row = {"plan": pname, "mode": mode, "variant": kind}
                try:
                    y = call(x, w, bank, ids, poison=True)
                    y2 = call(x, w, bank, ids, poison=True)
                    base = _pdl_call(mg, dict(sp, has_lora=False))(x, w, bank, ids, poison=True)
                    err = _nerr(y, ref)
                    checks = {"ref": err <= tol, "repeat": torch.equal(y, y2),
                              "base_rows": torch.equal(y[base_rows], base[base_rows]),
                              "no_nan": not torch.isnan(y).any().item()}
                    if first is not None:
                        checks["same_as_off"] = torch.equal(y, first)
                    if kind != "off":
                        checks["graph"] = _graph_replays_equal(lambda: call(x, w, bank, ids, poison=True), y)
                    first = y if first is None else first
                    row.update(rel_err=float(f"{err:.3g}"), tol=float(f"{tol:.3g}"), checks=checks,
                               ok=all(checks.values()))
                except Exception as exc:      # report, never fatal
                    first_line = str(exc).splitlines()[0][:160] if str(exc) else ""
                    row.update(ok=False, error=f"{type(exc).__name__}: {first_line}")
                    traceback.print_exc(limit=3, file=sys.stderr)
                if not row["ok"]:
                    failed.add("pdl" if kind == "pdl" else "sum" if kind == "sum" else "off")
                rows.append(row)
    if "off" in failed:         # the reference plan itself is wrong here: nothing to compare against
        failed |= {"pdl", "sum"}
    return rows, failed


def _pdl_case_row_check(y, ref, tol, same):
    """Status of one eager, NaN-poisoned call: WRONG unless within tol of the float64 reference and,
    for a variant of another row's plan, bit-identical to that row's output."""
    if torch.isnan(y).any().item():
        return "WRONG (NaN: unwritten output or a poisoned workspace read)"
    err = _nerr(y, ref)
    if not err <= tol:
        return f"WRONG (rel err {err:.3g} > {tol:.3g})"
    if same is not None and not torch.equal(y, same):
        return "WRONG (not bit-identical to its PDL-off row)"
    return "ok"


def pdl_warm_worker(task_file, dev=None):
    """Child process of --pdl: compile (run once) every kernel one share of the grid needs, so the
    timing process finds them in Triton's on-disk cache. Nothing is timed or checked here."""
    from lowrank_gemm.kernels import multilora_gemm as mg
    from lowrank_gemm.kernels._multilora_baselines import shrink_expand
    dev = dev or torch.device("cuda")
    tasks = json.loads(Path(task_file).read_text())
    done = []
    for task in tasks:
        t = time.time()
        try:
            if task == "small":
                pdl_small_gate(mg, dev, SMALL_DTYPE)
            else:
                M, N, r, a = task
                sets, distinct = make_sets(M, N, a, dev, seed=M * 131 + N + r * 7 + a, r=r, max_sets=1)
                x, w, bk, ids = sets[0]
                shrink_expand(x, w, bk.bank_a, bk.bank_b, bk.ranks, bk.scales, ids)
                for sp in pdl_impls(mg, M, N, r, len(distinct), dev).values():
                    if "error" not in sp:
                        _pdl_call(mg, sp)(x, w, bk, ids)
                del sets
            torch.cuda.synchronize()
            done.append({"task": task, "s": round(time.time() - t, 1)})
        except Exception as exc:
            done.append({"task": task, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    Path(task_file + ".done.json").write_text(json.dumps(done))


def warm_shares(cases, jobs):
    """The compile children's shares: the small gate, then the cases grouped by (M, N, r) (a group
    shares most kernels), each group to the share with the fewest cases so far."""
    groups = {}
    for c in cases:
        groups.setdefault(tuple(c[:3]), []).append(list(c))
    shares = [["small"]] + [[] for _ in range(jobs - 1)]
    for grp in sorted(groups.values(), key=len, reverse=True):
        min(shares, key=len).extend(grp)
    return [sh for sh in shares if sh]


def pdl_warm(cases, out, jobs, limit_s):
    """Compile the grid's kernels in ``jobs`` child processes (:func:`warm_shares`); children still
    running after ``limit_s`` are killed (the timing process then compiles what is missing itself).
    Returns a summary for the JSON."""
    import subprocess
    if jobs <= 0:
        return {"jobs": 0}
    t0 = time.time()
    shares = warm_shares(cases, jobs)
    wdir = Path(out) / "_warm"
    wdir.mkdir(parents=True, exist_ok=True)
    procs = []
    for i, share in enumerate(shares):
        f = wdir / f"share{i}.json"
        f.write_text(json.dumps(share))
        log = open(wdir / f"share{i}.log", "w")
        procs.append((subprocess.Popen([sys.executable, __file__, "--pdl-warm", str(f), "--out", str(out)],
                                       stdout=log, stderr=subprocess.STDOUT), f, log))
    killed = 0
    for proc, _, log in procs:
        try:
            proc.wait(timeout=max(1.0, limit_s - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            killed += 1
        log.close()
    errors, unfinished = [], 0
    for _, f, _ in procs:
        done = Path(str(f) + ".done.json")
        if done.exists():
            errors += [d for d in json.loads(done.read_text()) if "error" in d]
        else:           # killed or crashed: its log (DIR/_warm/share*.log) says which
            unfinished += 1
    return {"jobs": len(procs), "s": round(time.time() - t0, 1), "killed": killed, "unfinished": unfinished,
            "errors": errors[:20]}


def pdl_main(args, dev=None):
    from lowrank_gemm.bench.common import device_meta, measure_copy_tbps, time_graph
    from lowrank_gemm.bench.multilora import floor_bytes
    from lowrank_gemm.kernels import multilora_gemm as mg
    from lowrank_gemm.kernels._multilora_baselines import shrink_expand, torch_loop
    from lowrank_gemm.kernels.pdl import pdl_enabled
    from lowrank_gemm.reference import multi_lora_linear_ref

    t0 = time.time()
    dev = dev or torch.device("cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parse = lambda c: tuple(int(v) for v in c.split("x"))  # noqa: E731
    cases = [parse(c) for c in args.cases.split(",")] if args.cases else PDL_CASES
    warm = pdl_warm(cases, out, args.jobs, args.warm_s)
    print(f"[{time.time() - t0:5.1f}s] warm-up: {warm}", flush=True)
    copy = measure_copy_tbps(2**30)
    gate_rows, failed = pdl_small_gate(mg, dev, SMALL_DTYPE)
    print(f"[{time.time() - t0:5.1f}s] small-case gate: {sum(r_['ok'] for r_ in gate_rows)}/{len(gate_rows)} ok"
          f"{'; NOT timed: ' + ','.join(sorted(failed)) if failed else ''}", flush=True)

    rows, winners, skipped = [], {}, []

    def write_json(partial):
        meta = device_meta(copy) | {"K": K, "slots": SLOTS, "mode": "pdl", "pdl_enabled_default": pdl_enabled(dev),
                                    "elapsed_s": round(time.time() - t0, 1), "skipped_cases": skipped,
                                    "partial": partial, "warm": warm, "small_gate": gate_rows,
                                    "gate_failed": sorted(failed)}
        (out / "probe_multilora_pdl.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        (out / "probe_multilora_pdl.md").write_text(pdl_markdown(meta, rows))
        return meta

    for M, N, r, adapters in cases:
        if time.time() - t0 > args.budget_s:
            skipped.append(f"{M}x{N}x{r}x{adapters}")
            continue
        try:
            sets, distinct = make_sets(M, N, adapters, dev, seed=M * 131 + N + r * 7 + adapters, r=r)
            x, w, bk, ids = sets[0]
            ref = multi_lora_linear_ref(x, w, bk.bank_a, bk.bank_b, ids, bk.scales, bk.ranks)
            e_torch = _nerr(torch_loop(x, w, bk.bank_a, bk.bank_b, [r] * SLOTS, bk.scales, ids, distinct), ref)
        except Exception as exc:        # e.g. out of memory: report the case, go on
            skipped.append(f"{M}x{N}x{r}x{adapters} ({type(exc).__name__})")
            continue
        nd = len(distinct)
        tol = 2 * e_torch + 1e-3        # as the GPU tests: at most 2× PyTorch's own bf16 path (+ a floor)
        floor_us = floor_bytes(M, N, r, nd) / (copy * 1e12) * 1e6
        specs = {"cublas_base": dict(fn=lambda x, w, bk, i, poison=False: torch.nn.functional.linear(x, w)),
                 "shrink_expand": dict(fn=lambda x, w, bk, i, poison=False: shrink_expand(
                     x, w, bk.bank_a, bk.bank_b, bk.ranks, bk.scales, i))}
        for name, sp in pdl_impls(mg, M, N, r, nd, dev).items():
            specs[name] = dict(sp, fn=_pdl_call(mg, sp)) if "error" not in sp else sp
        outs, case_rows = {}, []
        for name, sp in specs.items():
            plan = sp.get("plan")
            row = {"M": M, "N": N, "K": K, "r": r, "adapters": nd, "impl": name, "floor_us": round(floor_us, 2),
                   "mode": sp.get("mode"), "pdl": sp.get("pdl"), "plan": plan.to_dict() if plan else None}
            kind = "sum" if plan is not None and plan.s_unroll else "pdl" if sp.get("pdl") else None
            if "error" in sp:
                row["status"] = f"ERROR (plan) {sp['error']}"
            elif kind in failed or (kind == "sum" and "pdl" in failed):
                row["status"] = "skipped (small-case gate failed)"
            elif time.time() - t0 > args.budget_s:
                row["status"] = "skipped (budget)"
            else:
                try:
                    y = sp["fn"](*sets[0], poison=True)
                    if name == "cublas_base":
                        status = "ok"
                    else:
                        same = outs.get(sp.get("same_as"))
                        if sp.get("same_as") and same is None:
                            status = f"skipped ({sp['same_as']} failed)"
                        else:
                            status = _pdl_case_row_check(y, ref, tol, same)
                        row["rel_err"] = float(f"{_nerr(y, ref):.3g}")
                    if status == "ok" and sp.get("pdl"):
                        call = (lambda fn: lambda: fn(*sets[0], poison=True))(sp["fn"])
                        if not _graph_replays_equal(call, y):
                            status = "WRONG (CUDA-graph replay differs from the eager call)"
                    row["status"] = status
                    if status == "ok":
                        outs[name] = y
                        g = time_graph(sp["fn"], sets)
                        row.update(graph_us=round(g.median_us, 2), p20_us=round(g.p20_us, 2),
                                   p80_us=round(g.p80_us, 2), pct_floor=round(100 * floor_us / g.median_us, 1))
                except Exception as exc:      # a candidate that cannot compile or run is reported, not fatal
                    row["status"] = f"ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                    traceback.print_exc(limit=3, file=sys.stderr)
            case_rows.append(row)
        base = next((r_["graph_us"] for r_ in case_rows if r_["impl"] == "cublas_base" and "graph_us" in r_), None)
        se = next((r_["graph_us"] for r_ in case_rows if r_["impl"] == "shrink_expand" and "graph_us" in r_), None)
        for r_ in case_rows:
            if "graph_us" in r_:
                r_["vs_cublas"] = round(r_["graph_us"] / base, 3) if base else None
                r_["vs_se"] = round(r_["graph_us"] / se, 3) if se else None
        pinnable = [r_ for r_ in case_rows if specs[r_["impl"]].get("pin") and "graph_us" in r_]
        timed = {r_["impl"]: r_["graph_us"] for r_ in case_rows if "graph_us" in r_}
        today = timed.get("fused_pdl", timed.get("fused"))      # what the op runs now (PDL is on by default)
        if pinnable:
            best = min(pinnable, key=lambda r_: r_["graph_us"])
            if today is None or best["graph_us"] <= today:      # never pin a plan slower than today's call
                best["winner"] = True
                winners[mg.tuned_key(M, N, K, r, nd)] = best["plan"]
        rows += case_rows
        del sets, outs
        torch.cuda.empty_cache()
        print(f"[{time.time() - t0:5.1f}s] M={M} N={N} r={r} a={nd}  " + "  ".join(
            f"{r_['impl']}={r_.get('graph_us', r_.get('status'))}" for r_ in case_rows), flush=True)
        write_json(partial=True)        # rows measured so far survive an outer time limit

    meta = write_json(partial=False)
    table = {"version": 1, "note": "written by scripts/probe_multilora.py --pdl: fastest correct plan per case "
             "with PDL on (PDL is a call flag, not a plan field); keys from multilora_gemm.tuned_key", "plans": winners}
    (out / "multilora_h200_pdl.json").write_text(json.dumps(table, indent=1) + "\n")
    if args.write_tuned and winners:
        old = json.loads(mg.TUNED_PATH.read_text()) if mg.TUNED_PATH.exists() else {"version": 1, "plans": {}}
        mg.TUNED_PATH.write_text(json.dumps(dict(old, plans={**old.get("plans", {}), **winners}), indent=1) + "\n")
    print(pdl_markdown(meta, rows))
    print(f"wrote {out / 'probe_multilora_pdl.json'}, .md and {out / 'multilora_h200_pdl.json'}"
          f"{' and ' + str(mg.TUNED_PATH) if args.write_tuned and winners else ''}; {time.time() - t0:.1f}s"
          f"{'; skipped ' + ','.join(skipped) if skipped else ''}")


def pdl_markdown(meta, rows):
    """Summary per case (today's fused, +PDL, +PDL+sum, the best row) and every row."""
    lines = [f"# multi-LoRA PDL probe ({meta.get('device')}, {meta.get('date')}, commit {meta.get('commit')}, "
             f"copy {meta.get('copy_tbps')} TB/s, {meta.get('elapsed_s')} s"
             f"{', PARTIAL' if meta.get('partial') else ''})\n",
             f"Small-case gate: {sum(r_['ok'] for r_ in meta['small_gate'])}/{len(meta['small_gate'])} ok"
             f"{'; failed kinds (not timed): ' + ', '.join(meta['gate_failed']) if meta['gate_failed'] else ''}. "
             f"Warm-up: {meta['warm']}. Skipped cases: {', '.join(meta['skipped_cases']) or 'none'}.\n",
             f"CUDA-graph replay medians (µs), bf16, K={meta['K']}, {meta['slots']} slots, ids random; ×cuBLAS = "
             "time / cuBLAS base GEMM without LoRA; %floor = byte floor / time; best = fastest correct fused row; "
             "winners (**win**) are among the PDL rows only.\n",
             "| M | N | r | a | cuBLAS | SE | fused | +pdl | +pdl+sum | best (impl) | best ×cuBLAS | best %floor "
             "| best < SE |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    cases = []
    for r_ in rows:
        c = (r_["M"], r_["N"], r_["r"], r_["adapters"])
        if c not in cases:
            cases.append(c)
    for c in cases:
        by = {r_["impl"]: r_ for r_ in rows if (r_["M"], r_["N"], r_["r"], r_["adapters"]) == c}
        t = {k: v.get("graph_us") for k, v in by.items()}
        fused = [v for k, v in by.items() if v.get("plan") and "graph_us" in v]
        best = min(fused, key=lambda v: v["graph_us"]) if fused else None
        cell = lambda k: t[k] if t.get(k) is not None else (by[k]["status"][:12] if k in by else "—")  # noqa: E731
        if best:
            best_cells = (f"{best['graph_us']} ({best['impl']}) | {best.get('vs_cublas')} | {best.get('pct_floor')} "
                          f"| {'yes' if best.get('vs_se') and best['vs_se'] < 1 else 'no'}")
        else:
            best_cells = "— | — | — | —"
        lines.append(f"| {c[0]} | {c[1]} | {c[2]} | {c[3]} | {cell('cublas_base')} | {cell('shrink_expand')} "
                     f"| {cell('fused')} | {cell('fused_pdl')} | {cell('fused_pdl_sum')} | {best_cells} |")
    lines += ["", "| M | N | r | a | impl | mode | pdl | graph µs | p20–p80 | ×cuBLAS | ×SE | %floor | rel err "
              "| status |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r_ in rows:
        lines.append(f"| {r_['M']} | {r_['N']} | {r_['r']} | {r_['adapters']} | {r_['impl']}"
                     f"{' **win**' if r_.get('winner') else ''} | {r_.get('mode') or ''} | {r_.get('pdl') or ''} "
                     f"| {r_.get('graph_us', '')} | {r_.get('p20_us', '')}–{r_.get('p80_us', '')} "
                     f"| {r_.get('vs_cublas', '')} | {r_.get('vs_se', '')} | {r_.get('pct_floor', '')} "
                     f"| {r_.get('rel_err', '')} | {r_.get('status', '')} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--write-tuned", action="store_true",
                    help="also write the winners into src/lowrank_gemm/plan/tuned/multilora_h200.json")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting new timings after this (default 105 s; --pdl: 200 s, compile children "
                         "included)")
    ap.add_argument("--cases", default="", help="subset, e.g. '64x4096x1,256x28672x16' (MxNxadapters)")
    ap.add_argument("--epi-only", action="store_true",
                    help="only the epilogue candidates (and baselines) on the ≥ 16-adapter cases")
    ap.add_argument("--appended-only", action="store_true",
                    help="old heuristic vs the appended expand (expand='appended') on the issue-5 grid, "
                         "r ∈ {16, 64}; --cases then reads MxNxRxadapters")
    ap.add_argument("--round2", action="store_true",
                    help="round 2: app3 (round 1) vs stacked appended steps (append_d 2/4, ± clean bank, "
                         "stages, split) on the cases round 1 lost; --cases then reads MxNxRxadapters")
    ap.add_argument("--pdl", action="store_true",
                    help="session 5: today's fused vs + PDL vs + PDL + unrolled S sum (and plan candidates) on "
                         "the issue grid, correctness first; --cases then reads MxNxRxadapters")
    ap.add_argument("--jobs", type=int, default=12, help="--pdl: child processes that compile the kernels first")
    ap.add_argument("--warm-s", type=float, default=100.0, help="--pdl: time limit of the compile children")
    ap.add_argument("--pdl-warm", default="", help=argparse.SUPPRESS)     # a compile child's share
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the probe needs a CUDA GPU")
    if args.pdl_warm:
        return pdl_warm_worker(args.pdl_warm)
    if args.pdl:
        args.budget_s = 200.0 if args.budget_s is None else args.budget_s
        return pdl_main(args)
    args.budget_s = 105.0 if args.budget_s is None else args.budget_s
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

    def write_json(partial):
        meta = device_meta(copy) | {"K": K, "slots": SLOTS, "mode": "pdl", "pdl_enabled_default": pdl_enabled(dev),
                                    "elapsed_s": round(time.time() - t0, 1), "skipped_cases": skipped,
                                    "partial": partial, "warm": warm, "small_gate": gate_rows,
                                    "gate_failed": sorted(failed)}
        (out / "probe_multilora_pdl.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        (out / "probe_multilora_pdl.md").write_text(pdl_markdown(meta, rows))
        return meta

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
