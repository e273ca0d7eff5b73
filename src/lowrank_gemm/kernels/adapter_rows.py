"""Per-row adapter ids inside a kernel: the pieces the multi-LoRA kernel and the single-adapter kernels' bank
mode share.

A batch row picks its adapter by id (``−1`` = base only). Ids outside ``[0, L)`` read as ``−1`` and ranks are
clamped to ``[0, R_MAX]``, so a bad id or rank never reads out of bounds.

Bank mode (:func:`bank_pick`, :func:`bank_stragglers`) runs the single-adapter kernels (``lora_main_kernel``,
``lora_down_kernel``, ``lora_persistent_kernel``) on an adapter bank when the caller knows a batch holds at most one distinct adapter: every
program reads all M ≤ ``ID_BLOCK`` ids and serves the largest valid one, ``cur``, through the kernel's own data
path (A rows ``cur·R_MAX …`` by TMA, B at ``cur``'s slot, ``scale[cur]``, ``rank[cur]``; rows of other ids get a
zero S). A hint that was wrong costs speed, not exactness: rows holding another adapter are finished after the
tile's store by :func:`bank_stragglers`, which recomputes their S over K by pointer loads and adds their branch to
the stored rows.

Stacked bank mode (:func:`stack_pick`, :func:`stacked_b`) carries the same data path to a few adapters: the caller
says a batch holds at most D distinct adapters, and every program serves the batch's D largest valid ids as one
stacked rank of D·R_MAX (column q of S belongs to the (q // R_MAX)-th of them): their A rows gathered into one
[D·R_MAX, BK] tile per K step, S masked per (row, column) to the row's own adapter, one stacked B tile and one MMA
in the epilogue. Rows of any smaller valid id (more adapters than the hint said) are stragglers, finished as above.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .epilogue import lowrank_up


@triton.jit
def safe_ids(ids_ptr, rows, valid, L):
    """Adapter id per row; anything outside [0, L) (−1, stale, corrupt) reads as −1 = base only."""
    ids = tl.load(ids_ptr + rows, mask=valid, other=-1).to(tl.int32)
    return tl.where((ids >= 0) & (ids < L), ids, -1)


@triton.jit
def distinct(ids, BM: tl.constexpr):
    """First-occurrence marks of the valid ids of a row block and their order among distinct ids.

    Returns (first [BM] bool, order [BM] int32, count): the j-th distinct adapter of the block is
    ``max(where(first & (order == j), ids, -1))``; no sort, one [BM, BM] comparison.
    """
    ar = tl.arange(0, BM)
    seen_before = (ids[:, None] == ids[None, :]) & (ar[None, :] < ar[:, None])
    dup = tl.max(seen_before.to(tl.int32), axis=1)
    first = (ids >= 0) & (dup == 0)
    order = tl.cumsum(first.to(tl.int32), axis=0) - 1
    return first, order, tl.sum(first.to(tl.int32), axis=0)


@triton.jit
def late_adapter(acc, j, first, order, ids, x_ptrs, stride_xk, a_ptr, stride_al, stride_ar, stride_ak,
                 b_ptr, stride_bl, stride_bn, stride_br, scales_ptr, ranks_ptr, R_MAX, offs_n, N, K,
                 BM: tl.constexpr, BK: tl.constexpr, BLOCK_R: tl.constexpr):
    """acc += scale·(X·A_jᵀ)·B_jᵀ for the rows of the j-th distinct adapter of ``ids``, S recomputed over all
    of K (the exact, slow path for adapters a plan did not provide for)."""
    cur = tl.max(tl.where(first & (order == j), ids, -1), axis=0)
    return adapter_rows_up(acc, cur, ids == cur, x_ptrs, stride_xk, a_ptr, stride_al, stride_ar, stride_ak, b_ptr,
                           stride_bl, stride_bn, stride_br, scales_ptr, ranks_ptr, R_MAX, offs_n, N, K, BM, BK,
                           BLOCK_R)


@triton.jit
def adapter_rows_up(acc, cur, sel, x_ptrs, stride_xk, a_ptr, stride_al, stride_ar, stride_ak, b_ptr, stride_bl,
                    stride_bn, stride_br, scales_ptr, ranks_ptr, R_MAX, offs_n, N, K,
                    BM: tl.constexpr, BK: tl.constexpr, BLOCK_R: tl.constexpr):
    """acc += scale[cur]·(X·A_curᵀ)·B_curᵀ on the rows ``sel`` (x_ptrs: their row pointers), by pointer loads."""
    rank = tl.minimum(tl.maximum(tl.load(ranks_ptr + cur), 0), R_MAX)
    s = adapter_rows_s(cur, sel, x_ptrs, stride_xk, a_ptr, stride_al, stride_ar, stride_ak, scales_ptr, rank, K,
                       BM, BK, BLOCK_R)
    return lowrank_up(acc, s, b_ptr + cur.to(tl.int64) * stride_bl, stride_bn, stride_br, offs_n, N, rank, BLOCK_R)


@triton.jit
def adapter_rows_s(cur, sel, x_ptrs, stride_xk, a_ptr, stride_al, stride_ar, stride_ak, scales_ptr, rank, K,
                   BM: tl.constexpr, BK: tl.constexpr, BLOCK_R: tl.constexpr):
    """scale[cur]·X·A_curᵀ [BM, BLOCK_R] on the rows ``sel`` (0 elsewhere and at ranks ≥ ``rank``), over all of K by
    pointer loads."""
    offs_r = tl.arange(0, BLOCK_R)
    a_rows = a_ptr + cur.to(tl.int64) * stride_al + offs_r * stride_ar
    s = tl.zeros((BM, BLOCK_R), tl.float32)
    for k in range(0, K, BK):
        offs_k = k + tl.arange(0, BK)
        xt = tl.load(x_ptrs + offs_k[None, :] * stride_xk, mask=sel[:, None] & (offs_k[None, :] < K), other=0.0)
        at = tl.load(a_rows[:, None] + offs_k[None, :] * stride_ak,
                     mask=(offs_r[:, None] < rank) & (offs_k[None, :] < K), other=0.0)
        s = tl.dot(xt, at.T, s)
    return tl.where(sel[:, None], s * tl.load(scales_ptr + cur), 0.0)


@triton.jit
def bank_pick(ids_ptr, ranks_ptr, scales_ptr, M, L, R_MAX, ID_BLOCK: tl.constexpr):
    """(cur, slot, rank, scale, mixed) of a bank-mode launch: cur = the largest valid id of the whole batch
    (M ≤ ID_BLOCK; −1 when every row is base only), slot = max(cur, 0) for addressing, cur's rank and scale (0 and
    0.0 when cur is −1, so nothing of slot 0 is added), and mixed = some valid id is not cur (the one-adapter hint
    was wrong: only then do the tiles look for rows to finish, :func:`bank_stragglers`). Every program computes the
    same values from one load of the ids."""
    offs = tl.arange(0, ID_BLOCK)
    ids = safe_ids(ids_ptr, offs, offs < M, L)
    cur = tl.max(ids, axis=0)
    lowest = tl.min(tl.where(ids >= 0, ids, cur), axis=0)
    slot = tl.maximum(cur, 0)
    live = cur >= 0
    rank = tl.where(live, tl.minimum(tl.maximum(tl.load(ranks_ptr + slot), 0), R_MAX), 0)
    scale = tl.where(live, tl.load(scales_ptr + slot).to(tl.float32), 0.0)
    return cur, slot, rank, scale, lowest != cur


@triton.jit
def bank_rows(ids_ptr, offs_m, M, L, cur):
    """[BM] bool: the rows of ``offs_m`` that hold ``cur`` (their S comes from the kernel's own path)."""
    return safe_ids(ids_ptr, offs_m, offs_m < M, L) == cur


@triton.jit
def bank_has_stragglers(ids_rows, floor):
    """Scalar: does a row of ``ids_rows`` (safe ids of a tile's rows) hold a valid adapter below ``floor`` (the
    smallest served id: ``cur`` of one-adapter bank mode, which is the batch's largest)?"""
    return tl.max(tl.where(ids_rows < floor, ids_rows, -1), axis=0) >= 0


@triton.jit
def bank_stragglers(y_ptr, stride_ym, stride_yn, x_ptr, stride_xm, a_ptr, stride_al, stride_ar, b_ptr, stride_bl,
                    stride_bn, stride_br, ids_ptr, ranks_ptr, scales_ptr, M, N, K, L, R_MAX, floor, off_m, off_n,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BLOCK_R: tl.constexpr):
    """Y[tile] += the branch of every row whose valid id is below ``floor``, the smallest id the kernel served (a
    wrong hint: more adapters than served; in one-adapter bank mode every valid id but ``cur``), after the tile
    was stored: per such adapter (decreasing id: deterministic) its rows' S over K, then Y read back, the branch
    added in fp32 and stored, in column chunks of ≤ 64 (one more rounding to Y's dtype per adapter, for those rows
    only). Called after the tile's store, when the kernel's accumulators are dead, so the path (never taken when
    the hint holds) costs the hot loop no registers; the caller puts a CTA barrier between its stores of the tile
    and these loads."""
    CN: tl.constexpr = min(BN, 32)
    offs_m = off_m + tl.arange(0, BM)
    ids = safe_ids(ids_ptr, offs_m, offs_m < M, L)
    other = tl.where(ids < floor, ids, -1)
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    nxt = tl.max(other, axis=0)
    while nxt >= 0:
        sel = other == nxt
        rank = tl.minimum(tl.maximum(tl.load(ranks_ptr + nxt), 0), R_MAX)
        s = adapter_rows_s(nxt, sel, x_ptrs, 1, a_ptr, stride_al, stride_ar, 1, scales_ptr, rank, K, BM, BK, BLOCK_R)
        b_slot = b_ptr + nxt.to(tl.int64) * stride_bl
        for n0 in range(0, BN, CN):
            offs_n = off_n + n0 + tl.arange(0, CN)
            y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :] * stride_yn
            mask = sel[:, None] & (offs_n[None, :] < N)
            y = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
            y = lowrank_up(y, s, b_slot, stride_bn, stride_br, offs_n, N, rank, BLOCK_R)
            tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)
        tl.debug_barrier()      # the next adapter's rows are others, but keep the read-back ordered anyway
        other = tl.where(sel, -1, other)
        nxt = tl.max(other, axis=0)


@triton.jit
def stack_pick(ids_ptr, ranks_ptr, scales_ptr, M, L, offs_q, ID_BLOCK: tl.constexpr, D: tl.constexpr,
               RB: tl.constexpr):
    """Stacked bank mode's columns: the batch's D largest valid ids c_0 > c_1 > … (M ≤ ID_BLOCK), column q of the
    stacked rank (``offs_q``) belonging to c_(q // RB) at rank index q % RB (RB = the bank's R_MAX). Returns
    (slot_q, rr_q, live_q, scale_q, floor, mixed): slot_q = −1 past the batch's distinct ids (and for q ≥ D·RB);
    live_q = slot valid and rank index below its rank; scale_q = its scale (0.0 where the slot is −1); floor = the
    smallest served id (−1 when fewer than D are present); mixed = a valid id below floor exists (the hint was
    wrong: only then do tiles look for stragglers). Every program computes the same values from one load of the
    ids: D ≤ 4 by D max-reductions (the measured path), more by :func:`stack_order` (three, whatever D)."""
    if D <= 4:
        offs = tl.arange(0, ID_BLOCK)
        ids = safe_ids(ids_ptr, offs, offs < M, L)
        jq = offs_q // RB
        slot_q = tl.zeros_like(offs_q) - 1
        c = tl.max(ids, axis=0)
        floor = c
        for j in tl.static_range(D):
            slot_q = tl.where(jq == j, c, slot_q)
            floor = c
            c = tl.max(tl.where(ids < c, ids, -1), axis=0)
        slot_q, rr_q, live_q, scale_q = _stack_slots(slot_q, ranks_ptr, scales_ptr, offs_q, RB)
        return slot_q, rr_q, live_q, scale_q, floor, c >= 0
    ids, first, desc, floor, mixed = stack_order(ids_ptr, M, L, ID_BLOCK, D)
    slot_q, rr_q, live_q, scale_q = stack_cols(ids, first, desc, ranks_ptr, scales_ptr, offs_q, D, RB)
    return slot_q, rr_q, live_q, scale_q, floor, mixed


@triton.jit
def stack_order(ids_ptr, M, L, ID_BLOCK: tl.constexpr, D: tl.constexpr):
    """The batch's distinct valid ids in descending order without a loop over them: (ids [ID_BLOCK] safe ids, first
    [ID_BLOCK] first-occurrence marks, desc [ID_BLOCK] each row's id's place among the distinct ids — 0 for the
    largest —, floor = the D-th largest (−1 when fewer), mixed = more than D present). Two [ID_BLOCK, ID_BLOCK]
    comparisons, then :func:`stack_cols` maps any stacked columns to their slots."""
    offs = tl.arange(0, ID_BLOCK)
    ids = safe_ids(ids_ptr, offs, offs < M, L)
    first, _order, _count = distinct(ids, ID_BLOCK)
    above = first[None, :] & (ids[None, :] > ids[:, None])          # [i, j]: j holds a larger distinct id than i
    desc = tl.sum(above.to(tl.int32), axis=1)
    floor = tl.max(tl.where(first & (desc == D - 1), ids, -1), axis=0)
    mixed = tl.max((first & (desc >= D)).to(tl.int32), axis=0) > 0
    return ids, first, desc, floor, mixed


@triton.jit
def stack_cols(ids, first, desc, ranks_ptr, scales_ptr, offs_q, D: tl.constexpr, RB: tl.constexpr):
    """(slot_q, rr_q, live_q, scale_q) of stacked columns ``offs_q`` from :func:`stack_order`'s values: column q
    belongs to the (q // RB)-th largest distinct id (−1 for q ≥ D·RB or past the ids present)."""
    jq = offs_q // RB
    hit = first[:, None] & (desc[:, None] == jq[None, :]) & (jq < D)[None, :]
    slot_q = tl.max(tl.where(hit, ids[:, None], -1), axis=0)
    return _stack_slots(slot_q, ranks_ptr, scales_ptr, offs_q, RB)


@triton.jit
def _stack_slots(slot_q, ranks_ptr, scales_ptr, offs_q, RB: tl.constexpr):
    has = slot_q >= 0
    safe = tl.maximum(slot_q, 0)
    rank_q = tl.where(has, tl.minimum(tl.maximum(tl.load(ranks_ptr + safe), 0), RB), 0)
    scale_q = tl.where(has, tl.load(scales_ptr + safe).to(tl.float32), 0.0)
    rr_q = offs_q % RB
    return slot_q, rr_q, has & (rr_q < rank_q), scale_q


@triton.jit
def stacked_b(slot_q, rr, live_q, b_ptr, stride_bl, stride_bn, stride_br, offs_n, N,
              BLOCK_R: tl.constexpr, B_VEC: tl.constexpr):
    """Stacked B tile [DQ, BN]: row q is B[slot_q, offs_n, rr_q] (0 where not ``live_q``), DQ = D·BLOCK_R rows of D
    adapters. B_VEC (host-checked: stride_br == 1, stride_bl % 8 == 0 and R_MAX == BLOCK_R) tells the compiler each
    BLOCK_R run of rows is one adapter's contiguous, 16-B aligned rank vector, so the gather becomes 16-B vector
    loads instead of one 2-B load per element. A vector needs one mask bit for all its lanes: the load is masked
    per adapter (whole run) and the rank mask is applied after it (slots past a rank lie inside the R_MAX row, in
    bounds, and may hold garbage, hence the where)."""
    nmask = offs_n[None, :] < N
    if B_VEC:
        q_off = tl.max_contiguous(tl.multiple_of(slot_q.to(tl.int64) * stride_bl + rr, 8), BLOCK_R)
        has_q = tl.max_constancy(slot_q >= 0, BLOCK_R)
        b_t = tl.load(b_ptr + q_off[:, None] + offs_n[None, :] * stride_bn, mask=has_q[:, None] & nmask,
                      other=0.0)
        return tl.where(live_q[:, None], b_t, 0.0)
    q_off = slot_q.to(tl.int64) * stride_bl + rr * stride_br
    return tl.load(b_ptr + q_off[:, None] + offs_n[None, :] * stride_bn, mask=live_q[:, None] & nmask,
                   other=0.0)
