"""Triton kernels of the single-adapter LoRA GEMM (launchers and op: :mod:`.lora_gemm`).

    Y = X·Wᵀ + (scale · X·Aᵀ)·Bᵀ + bias        X [M, K], W [N, K], A [R, K], B [N, R]

X, W and A are read through TMA tensor descriptors (host ``TensorDescriptor``; out-of-bounds
boxes are zero-filled, which is what makes ragged M/N/K and ranks below ``BLOCK_R`` exact). B and
the fp32 S / workspace buffers are read with plain pointer loads: they are small, and S·Bᵀ is
one rank-sized MMA on the finished accumulator (``epilogue.lowrank_up``).

Kernels:
- ``lora_main_kernel``: grouped-order tiles, optional deterministic split-K, either ``PARTIAL``
  (raw fp32 partials to a workspace, epilogue in ``lora_reduce_kernel``: 2 launches) or ``FIXUP``
  (one launch: partials parked, the tile's last arriving split sums them in split order and runs
  the epilogue in row chunks of ``EPI_M``; ticket protocol in :mod:`.splitk`). ``HYBRID`` (a FIXUP
  1-D grid): the first ``DP_TILES`` tiles — the whole waves — run unsplit, only the rest are cut in
  ``SPLIT_K`` pieces. ``LOWRANK`` selects the branch: NONE (plain GEMM), KLOOP (S accumulated from
  the X tiles already in SMEM), GLOBAL (S read from an fp32 [S_SPLITS, M, R] buffer of K-slice
  partials written by ``lora_down_kernel``, summed in slice order in the epilogue). ``PDL``: the
  programmatic dependent of the down kernel, waiting for it after the K loop; ``EPI_PREFETCH``:
  the epilogue's B tile / bias / S rows are loaded before the K loop.
- ``lora_down_kernel``: S = scale · X·Aᵀ, fp32 [S_SPLITS, M, R] (grid over M, R and K slices);
  ``PDL``: lets its dependent (the main kernel) be scheduled at once.
- ``lora_reduce_kernel``: sums split-K partials in a fixed order, adds S·Bᵀ and bias, stores.
- ``lora_persistent_kernel``: two-phase persistent grid; tasks 0..num_pid_m-1 produce S blocks and
  raise a per-M-block flag, the remaining tasks are main tiles in grouped order whose epilogue
  waits on that flag. Static stripes or a dynamic atomic *work* counter (results never go through
  atomics, so output bits do not depend on the schedule).
- ``lora_streamk_kernel``: Stream-K. A persistent grid of P programs splits the whole work (tiles ×
  K steps, grouped tile order) into P contiguous, equal ranges. Whole tiles go straight through
  the epilogue; a tile cut by range boundaries is finished by whichever of its segment owners
  arrives last (per-tile arrival ticket), which sums the fp32 partials (and partial S) of all
  segments in segment order — who sums varies, the sum order does not, so bits are
  deterministic. No program ever waits on another (no residency assumption, no spin).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .adapter_rows import (bank_has_stragglers, bank_pick, bank_rows, bank_stragglers, safe_ids, stack_cols, stack_order,
                           stack_pick, stacked_b)
from .epilogue import add_bias, lowrank_up, store_tile, store_y
from .schedule import grouped_tile
from .pdl import gdc_launch_dependents, gdc_wait
from .splitk import splitk_arrive, splitk_reset, splitk_store, splitk_sum

# LOWRANK modes of lora_main_kernel
LOWRANK_NONE = 0
LOWRANK_KLOOP = 1
LOWRANK_GLOBAL = 2


@triton.jit
def _main_loop(x_desc, w_desc, a_desc, off_m, off_n, k_lo, k_hi,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               BLOCK_R: tl.constexpr, KLOOP: tl.constexpr, SWAP_AB: tl.constexpr = False, a_row0=0,
               a_rows=0, K=0, A_GATHER: tl.constexpr = False, a_ok=0, ws_ptr=None, N=0, xs_ptr=None, M=0,
               X_TERMS: tl.constexpr = 1):
    """acc [BM, BN] = X[off_m:, k]·W[off_n:, k]ᵀ over K tiles [k_lo, k_hi); with KLOOP also
    s [BM, BLOCK_R] = X·A[a_row0 : a_row0 + BLOCK_R, k]ᵀ from the same X tile (unscaled; a_row0 > 0: an
    adapter's rows in a bank viewed [L·R_MAX, K]).

    SWAP_AB (decode-sized M): the MMA computes accᵀ [BN, BM] = W·Xᵀ, so the weight rows fill the
    wgmma's M (≥ 64) and the few tokens its N (≥ 8): BM = 16 instead of a 64-row X tile that is
    mostly TMA zero fill. KLOOP likewise accumulates sᵀ [BR, BM] = A·Xᵀ, BR ≥ 64 rows of A — a
    wgmma too: an mma.sync of BM rows in this loop makes ptxas serialize every wgmma (C7515). (Ranks
    ≥ R are TMA zero fill, which is slow: r16 18.7 vs r64 11.95 µs at 4096²,
    probes/s6/probe_lora_branch.md.) The transposes back are layout conversions after the loop;
    everything after it (split-K fixup, epilogue) sees the usual [BM, BN] / [BM, BR] tiles.

    A_GATHER (stacked bank mode): A's BR rows are not adjacent in the bank (D adapters' slots), so the A tile is
    a pointer gather from ``a_rows`` [BR] (each row's first element; K contiguous), K ≥ ``K`` and rows not
    ``a_ok`` (past an adapter's rank or past the batch's adapters) reading 0 without a memory access.

    A W of another dtype than X (fp8 e4m3 weights) is widened to X's dtype tile by tile, in registers, and ``ws_ptr``
    (fp32 [N], its per-output-channel scale) scales the main product's columns at the end: a column scale commutes
    with the K sum, so split-K partials carry it and the branch, the bias and the fixups stay as they are. With X in
    fp8 too (``xs_ptr``: fp32 [M], its per-token scale; the branch's S then comes from the 16-bit X elsewhere) both
    operands feed the fp8 wgmma as they are and the row scale joins the column scale. X_TERMS = 2: fp8 X holds two
    terms per token on one row scale (rows [0, M): x's e4m3 codes, rows [M, 2M): its residual's; ``xs_ptr`` [M];
    :func:`row_quant.fp8_rows` with ``terms=2``), both multiplied into the one accumulator — about 16-bit x's
    precision on the fp8 tensor cores, twice their work, no widening and no second accumulator (two spilled the
    prefill tiles: 4.4 ms against one term's 0.25 at M = 1024, N = 28672, session 35). The price: the product's error
    against the exact fp8-weight product went 2.3e-3 → 2.8e-3 on the H200 (twice as many fp8 wgmma accumulations
    into one accumulator, which keeps fewer bits than fp32; NOTES.md, session 35)."""
    acc = tl.zeros((BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, BLOCK_N), dtype=tl.float32)
    # the swapped decode tiles (BM ≤ 64 tokens) have registers for the residual's own accumulator: it keeps the small
    # products' bits that the shared fp8 accumulator drops (session 35)
    LO_ACC: tl.constexpr = X_TERMS == 2 and SWAP_AB
    if LO_ACC:
        acc_lo = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    s = tl.zeros((BLOCK_R, BLOCK_M) if SWAP_AB else (BLOCK_M, BLOCK_R), dtype=tl.float32)
    for kt in tl.range(k_lo, k_hi):
        k = kt * BLOCK_K
        x = x_desc.load([off_m, k])                      # [BM, BK]
        w = w_desc.load([off_n, k])                      # [BN, BK]
        if w.dtype != x.dtype:
            w = w.to(x.dtype)
        if SWAP_AB:
            acc = tl.dot(w, x.T, acc)
        else:
            acc = tl.dot(x, w.T, acc)
        if X_TERMS == 2:
            # the residual's rows (past 2M: TMA zero fill). Rows ≥ M of either load belong to no token of this
            # tile's output, and those rows are never stored.
            x_lo = x_desc.load([off_m + M, k])
            if LO_ACC:
                acc_lo = tl.dot(w, x_lo.T, acc_lo)
            else:
                acc = tl.dot(x_lo, w.T, acc)
        if KLOOP:
            if A_GATHER:
                offs_k = k + tl.arange(0, BLOCK_K)
                a = tl.load(a_rows[:, None] + offs_k[None, :], mask=a_ok[:, None] & (offs_k[None, :] < K),
                            other=0.0)
            else:
                a = a_desc.load([a_row0, k])             # [BR, BK]
            if SWAP_AB:
                s = tl.dot(a, x.T, s)
            else:
                s = tl.dot(x, a.T, s)
    if LO_ACC:
        acc += acc_lo
    if SWAP_AB:
        acc = tl.trans(acc)
        s = tl.trans(s)
    if ws_ptr is not None:
        offs_n = off_n + tl.arange(0, BLOCK_N)
        acc = acc * tl.load(ws_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
    if xs_ptr is not None:
        offs_m = off_m + tl.arange(0, BLOCK_M)
        acc = acc * tl.load(xs_ptr + offs_m, mask=offs_m < M, other=0.0)[:, None]
    return acc, s


@triton.jit
def _down_loop(x_desc, a_desc, off_m, off_r, k_lo, k_hi,
               BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
               a_rows=0, K=0, A_GATHER: tl.constexpr = False, a_ok=0, STAGES: tl.constexpr = None):
    """s [BM, BR] = X[off_m:, k]·A[off_r:, k]ᵀ over K tiles [k_lo, k_hi) (unscaled, fp32); A_GATHER: A's rows from
    ``a_rows`` where ``a_ok`` (:func:`_main_loop`); STAGES: its own pipeline depth (None: the kernel's)."""
    s = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for kt in tl.range(k_lo, k_hi, num_stages=STAGES):
        x = x_desc.load([off_m, kt * BLOCK_K])
        if A_GATHER:
            offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
            a = tl.load(a_rows[:, None] + offs_k[None, :], mask=a_ok[:, None] & (offs_k[None, :] < K), other=0.0)
        else:
            a = a_desc.load([off_r, kt * BLOCK_K])
        s = tl.dot(x, a.T, s)
    return s


@triton.jit
def _down_slice(x_desc, a_desc, s_ptr, off_m, off_r, slice_id, slices, M, K, R, scale, stride_sk, stride_sm,
                stride_sr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                BANK: tl.constexpr = False, ids_ptr=None, cur=-1, L=0, a_row0=0, rank=0,
                ranks_ptr=None, scales_ptr=None, bank_a_ptr=None, stride_al=0, stride_ar=0, ID_BLOCK: tl.constexpr = 16,
                STACK_D: tl.constexpr = 0, STACK_R: tl.constexpr = 16, WORDS: tl.constexpr = False, epoch=0):
    """S[slice_id, off_m:, off_r:] = scale · X·Aᵀ over the slice-th of ``slices`` near-equal K-tile ranges,
    rows ≥ M and ranks ≥ R not stored: the down kernel's program, and an in-grid S producer's. BANK: A's rows
    start at ``a_row0``, and zeros are stored for rows whose id is not ``cur`` and for ranks ≥ ``rank``
    (:mod:`.adapter_rows`). STACK_D > 0 (stacked bank mode, :func:`~.adapter_rows.stack_pick`): columns off_r …
    of the stacked rank, A's rows gathered from the bank, each column scaled by its adapter's scale and zero for
    rows of other ids (``scale`` unused). WORDS: S is stored as int64 words (:func:`_s_word`) stamped ``epoch``."""
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, slices)
    k_lo = slice_id * per_split
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_r = off_r + tl.arange(0, BLOCK_R)
    if STACK_D > 0:
        slot_q, rr_q, live_q, scale_q, _floor, _mixed = stack_pick(ids_ptr, ranks_ptr, scales_ptr, M, L, offs_r,
                                                                  ID_BLOCK, STACK_D, STACK_R)
        a_rows = bank_a_ptr + tl.maximum(slot_q, 0).to(tl.int64) * stride_al + rr_q * stride_ar
        s = _down_loop(x_desc, a_desc, off_m, 0, k_lo, tl.minimum(k_lo + per_split, k_tiles),
                       BLOCK_M, BLOCK_R, BLOCK_K, a_rows, K, True, live_q)
        ids_rows = safe_ids(ids_ptr, offs_m, offs_m < M, L)
        s = tl.where((ids_rows[:, None] == slot_q[None, :]) & live_q[None, :], s * scale_q[None, :], 0.0)
    else:
        s = _down_loop(x_desc, a_desc, off_m, a_row0 + off_r, k_lo, tl.minimum(k_lo + per_split, k_tiles),
                       BLOCK_M, BLOCK_R, BLOCK_K)
        if BANK:
            s = tl.where(bank_rows(ids_ptr, offs_m, M, L, cur)[:, None] & (offs_r < rank)[None, :], s, 0.0)
        s = s * scale
    if WORDS:
        s = _s_word(s, epoch)
    tl.store(s_ptr + slice_id * stride_sk + offs_m[:, None] * stride_sm + offs_r[None, :] * stride_sr,
             s, mask=(offs_m[:, None] < M) & (offs_r[None, :] < R))


# S as words (``S_WORDS``, LoraOptions.s_words): an in-grid producer stores each fp32 value of S together with the
# launch's epoch in one aligned 8-byte word (the value's bits low, the epoch high). An 8-byte store is seen whole or not
# at all, so a main tile that finds its epoch in every word of its S rows has them — its S loads are its
# synchronization (NCCL's LL protocol): one round trip after the K loop instead of an acquire and then the loads
# behind it (session 29, probes/s29/call16: 4096² M = 1 / 16, 14.7 → 13.8 / 13.9 µs in the probe kernel). The
# epochs come from two monotonic int64 counters (main tiles', producers'), each program reading its own once; word
# buffers persist per plan (lora_gemm._SWords), so a stale word carries an older epoch; nothing is ever reset.
@triton.jit
def _s_word(v, epoch):
    """fp32 ``v`` stamped with ``epoch`` (int64) modulo 2^32: its low 32 bits << 32 | v's bits. Every launch rewrites
    every word its main tiles read, so a stale word is one epoch old (or never written: 0) — modulo 2^32 it can never
    match, however long the counters run."""
    return ((epoch & 0xFFFFFFFF) << 32) | (v.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF)


@triton.jit
def _s_stale(word, epoch):
    return ((word >> 32) & 0xFFFFFFFF) != (epoch & 0xFFFFFFFF)


@triton.jit
def _s_value(word):
    return (word & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _s_missing(w0, w1, w2, w3, mask, epoch, SLICES: tl.constexpr):
    """How many words of the S rows (inside ``mask``, of the first SLICES slices) lack ``epoch``."""
    miss = (mask & _s_stale(w0, epoch)).to(tl.int32)
    if SLICES > 1:
        miss += (mask & _s_stale(w1, epoch)).to(tl.int32)
    if SLICES > 2:
        miss += (mask & _s_stale(w2, epoch)).to(tl.int32)
    if SLICES > 3:
        miss += (mask & _s_stale(w3, epoch)).to(tl.int32)
    return tl.sum(tl.sum(miss, 1), 0)


@triton.jit
def _s_words_load(ptrs, stride_sk, mask, SLICES: tl.constexpr):
    """The words of the first SLICES slices at ``ptrs`` (volatile: a retry must see the producers' stores); the
    slices past SLICES read as 0."""
    w0 = tl.load(ptrs, mask=mask, other=0, volatile=True)
    w1 = tl.load(ptrs + stride_sk, mask=mask & (SLICES > 1), other=0, volatile=True)
    w2 = tl.load(ptrs + 2 * stride_sk, mask=mask & (SLICES > 2), other=0, volatile=True)
    w3 = tl.load(ptrs + 3 * stride_sk, mask=mask & (SLICES > 3), other=0, volatile=True)
    return w0, w1, w2, w3


@triton.jit
def _s_rows_words(s_ptr, stride_sk, stride_sm, stride_sr, offs_m, M, R, epoch,
                  SLICES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr):
    """:func:`_s_rows` over S words (SLICES ≤ 4 producers): every slice's words in one round trip, read again only
    while a word of this launch's ``epoch`` is missing; the values summed in slice order as _s_rows does (the same
    fp32 result). Rows ≥ M and ranks ≥ R read as a stamped 0."""
    tl.static_assert(SLICES >= 1 and SLICES <= 4, "S words: one to four S producers")
    offs_r = tl.arange(0, BLOCK_R)
    mask = (offs_m[:, None] < M) & (offs_r[None, :] < R)
    ptrs = s_ptr + offs_m[:, None] * stride_sm + offs_r[None, :] * stride_sr
    w0, w1, w2, w3 = _s_words_load(ptrs, stride_sk, mask, SLICES)
    missing = _s_missing(w0, w1, w2, w3, mask, epoch, SLICES)
    while missing > 0:       # a producer still running: rare at decode sizes
        w0, w1, w2, w3 = _s_words_load(ptrs, stride_sk, mask, SLICES)
        missing = _s_missing(w0, w1, w2, w3, mask, epoch, SLICES)
    s = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    return (((s + _s_value(w0)) + _s_value(w1)) + _s_value(w2)) + _s_value(w3)


@triton.jit
def _lowrank_from_buffer(acc, s_ptr, stride_sk, stride_sm, stride_sr, S_SPLITS, s_scale,
                         b_ptr, stride_bn, stride_br, offs_m, offs_n, M, N, R,
                         BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, EPI_STAGES: tl.constexpr = None):
    """acc += (s_scale · Σ_k S[k, offs_m, :R])·B[offs_n, :R]ᵀ, rank in BLOCK_R chunks, splits
    summed in index order (deterministic). S is fp32 [S_SPLITS, M, ≥R]. EPI_STAGES: software-pipeline depth of
    the chunk loop (None: the compiler's, i.e. the kernel's num_stages — it then multi-buffers S and B in shared
    memory even when the loop runs once; ``KernelConfig.epi_stages``)."""
    for r0 in tl.range(0, R, BLOCK_R, num_stages=EPI_STAGES):
        offs_r = r0 + tl.arange(0, BLOCK_R)
        mask = (offs_m[:, None] < M) & (offs_r[None, :] < R)
        ptrs = s_ptr + offs_m[:, None] * stride_sm + offs_r[None, :] * stride_sr
        s = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        for k in range(S_SPLITS):
            s += tl.load(ptrs + k * stride_sk, mask=mask, other=0.0, cache_modifier=".cg")
        acc = lowrank_up(acc, s * s_scale, b_ptr + r0 * stride_br, stride_bn, stride_br,
                         offs_n, N, R - r0, BLOCK_R)
    return acc


@triton.jit
def _s_rows(s_ptr, stride_sk, stride_sm, stride_sr, S_SPLITS, offs_m, M, r0, R,
            BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr):
    """Σ_k S[k, offs_m, r0 : r0 + BLOCK_R] (fp32 [BLOCK_M, BLOCK_R]; K slices in index order,
    rows ≥ M and ranks ≥ R read 0)."""
    offs_r = r0 + tl.arange(0, BLOCK_R)
    mask = (offs_m[:, None] < M) & (offs_r[None, :] < R)
    ptrs = s_ptr + offs_m[:, None] * stride_sm + offs_r[None, :] * stride_sr
    s = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    # four slices' loads are issued before the first add (one round trip, not S_SPLITS: after the K
    # loop this is exposed latency); the adds keep index order, and masked slices add exact zeros
    for k0 in range(0, S_SPLITS, 4):
        p0 = tl.load(ptrs + k0 * stride_sk, mask=mask, other=0.0, cache_modifier=".cg")
        p1 = tl.load(ptrs + (k0 + 1) * stride_sk, mask=mask & (k0 + 1 < S_SPLITS), other=0.0, cache_modifier=".cg")
        p2 = tl.load(ptrs + (k0 + 2) * stride_sk, mask=mask & (k0 + 2 < S_SPLITS), other=0.0, cache_modifier=".cg")
        p3 = tl.load(ptrs + (k0 + 3) * stride_sk, mask=mask & (k0 + 3 < S_SPLITS), other=0.0, cache_modifier=".cg")
        s = (((s + p0) + p1) + p2) + p3
    return s


@triton.jit
def _lowrank_from_slices(acc, s_ptr, stride_sk, stride_sm, stride_sr, S_SPLITS,
                         b_ptr, stride_bn, stride_br, offs_m, offs_n, M, N, R,
                         BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, R_CHUNKS: tl.constexpr):
    """As :func:`_lowrank_from_buffer` (scale already in S) with a compile-time number of rank
    chunks: unrolled, so the [BM, BN] accumulator is not carried through a runtime loop (ptxas
    then keeps extra copies of it: 128×256 fp32 over 8 warps went to 255 regs + spills)."""
    for c in tl.static_range(R_CHUNKS):
        s = _s_rows(s_ptr, stride_sk, stride_sm, stride_sr, S_SPLITS, offs_m, M, c * BLOCK_R, R,
                    BLOCK_M, BLOCK_R)
        acc = lowrank_up(acc, s, b_ptr + c * BLOCK_R * stride_br, stride_bn, stride_br,
                         offs_n, N, R - c * BLOCK_R, BLOCK_R)
    return acc


@triton.jit
def _b_tile(b_ptr, stride_bn, stride_br, offs_n, N, R, BLOCK_R: tl.constexpr):
    """B[offs_n, :BLOCK_R]ᵀ as [BLOCK_R, BN] (ranks ≥ R, columns ≥ N read 0): the operand
    :func:`epilogue.lowrank_up` loads, loaded on its own so it can be issued before the K loop."""
    offs_r = tl.arange(0, BLOCK_R)
    return tl.load(b_ptr + offs_r[:, None] * stride_br + offs_n[None, :] * stride_bn,
                   mask=(offs_r[:, None] < R) & (offs_n[None, :] < N), other=0.0)


@triton.jit
def _bank_setup(ids_ptr, ranks_ptr, scales_ptr, M, L, R_MAX, R, scale, b_ptr, stride_bl,
                BANK: tl.constexpr, ID_BLOCK: tl.constexpr, B_CLEAN: tl.constexpr):
    """(cur, slot, rank, mixed, R, scale, a_row0, b_ptr) a kernel runs with: under BANK the picked adapter
    (:func:`~.adapter_rows.bank_pick`), its first A row in the bank viewed [L·R_MAX, K] and its B slot, with R the
    mask bound (the rank, or the launch's R_MAX when B_CLEAN); otherwise the launch's own R, scale and B."""
    cur = -1
    slot = 0
    rank = 0
    mixed = False
    a_row0 = 0
    if BANK:
        cur, slot, rank, scale, mixed = bank_pick(ids_ptr, ranks_ptr, scales_ptr, M, L, R_MAX, ID_BLOCK)
        if not B_CLEAN:
            R = rank
        a_row0 = slot * R_MAX
        b_ptr += slot.to(tl.int64) * stride_bl
    return cur, slot, rank, mixed, R, scale, a_row0, b_ptr


@triton.jit
def lora_main_kernel(
    x_desc,             # X [M, K], box [BM, BK]
    w_desc,             # W [N, K], box [BN, BK]
    a_desc,             # A [R, K], box [BR, BK]          (KLOOP)
    s_ptr,              # S [S_SPLITS, M, R] fp32 partials, already scaled (GLOBAL)
    b_ptr,              # B [N, R]
    bias_ptr,           # bias [N]                         (HAS_BIAS)
    y_ptr,              # Y [M, N]; PARTIAL: workspace [SPLIT_K, M, N] fp32
    sws_ptr,            # KLOOP S partials, fp32: PARTIAL [SPLIT_K, M, BR]; FIXUP [SPLIT_K, n tiles, M, BR]
    ws_ptr,             # FIXUP: partials [SPLIT_K, M, N] fp32
    cnt_ptr,            # FIXUP: int32 [tiles] arrival tickets, zero on entry, left zero on exit
    M, N, K, R, scale, SPLIT_K, S_SPLITS, DP_TILES,
    stride_sk, stride_sm, stride_sr, stride_bn, stride_br,
    stride_yk, stride_ym, stride_yn,
    stride_swk, stride_swn, stride_swm, stride_swr,
    stride_wk, stride_wm, stride_wn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
    GROUP_M: tl.constexpr, LOWRANK: tl.constexpr,
    HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, R_CHUNKS: tl.constexpr = 1,
    FIXUP: tl.constexpr = False, EPI_M: tl.constexpr = 64, IN_FLIGHT: tl.constexpr = 1,
    EPI_CHUNKS: tl.constexpr = 1, HYBRID: tl.constexpr = False, PDL: tl.constexpr = False,
    EPI_PREFETCH: tl.constexpr = False, SWAP_AB: tl.constexpr = False, S_PRODUCERS: tl.constexpr = 0,
    ids_ptr=None, ranks_ptr=None, scales_ptr=None, x_ptr=None, bank_a_ptr=None, L=0, R_MAX=0,    # BANK
    stride_xm=0, stride_al=0, stride_ar=0, stride_bl=0,
    BANK: tl.constexpr = False, ID_BLOCK: tl.constexpr = 16, B_CLEAN: tl.constexpr = False,
    STACK_D: tl.constexpr = 0, STACK_R: tl.constexpr = 16, B_VEC: tl.constexpr = False,    # stacked BANK
    S_WORDS: tl.constexpr = False,
    wscale_ptr=None,    # fp32 [N]: the per-output-channel scale of fp8 weights (None: 16-bit W)
    xscale_ptr=None,    # fp32 [M]: the per-token scale of fp8 X (None: 16-bit X); GLOBAL S only
    X_TERMS: tl.constexpr = 1,   # 2: fp8 X as two e4m3 terms per token on xscale_ptr's [M] scales (_main_loop)
):
    # R_CHUNKS (GLOBAL): cdiv(R, BLOCK_R), rank chunks of the epilogue, unrolled
    # SPLIT_K / S_SPLITS are runtime values: one compile serves every split of a tile config
    # PARTIAL: raw partials out, epilogue in lora_reduce_kernel (2 launches); FIXUP: split-K in
    # this launch, the tile's last arriving split sums the partials in split order (splitk.py);
    # EPI_M × EPI_CHUNKS (FIXUP): rows of the reduction/epilogue, walked in EPI_CHUNKS row chunks of
    # EPI_M (BLOCK_M, or when M < BLOCK_M ≥ M); IN_FLIGHT (FIXUP): partial loads in flight per step
    # HYBRID (FIXUP, 1-D grid): the first DP_TILES tiles (grouped order) run whole, unsplit; the
    # remaining tiles are cut into SPLIT_K pieces each (the split-K of the last, partial wave only)
    # PDL: launched as the dependent of lora_down_kernel; waits for it after the K loop
    # EPI_PREFETCH: the epilogue's B tile, bias (and, GLOBAL without PDL, S rows) load before the
    # K loop instead of after it (R_CHUNKS == 1 for GLOBAL)
    # SWAP_AB: the K loop's MMA is W·Xᵀ (weights as the wgmma M, tokens as its N: decode-sized M)
    # S_PRODUCERS (GLOBAL, one launch): programs 0 .. S_PRODUCERS−1 compute S's K slices (the down
    # kernel's work, :func:`_produce_s_slice`), the others are the main tiles and wait for all of them
    # after their K loop (cnt_ptr[0]); the last main program to finish resets the counters (cnt_ptr[1]).
    # S_WORDS (S_PRODUCERS ≤ 4, the S rows held for the epilogue): S travels as stamped words (_s_rows_words), s_ptr is
    # int64, cnt_ptr two monotonic int64 counters (main tiles', producers'); no wait on a counter, no ticket.
    # BANK (a batch of ≤ ID_BLOCK rows of one adapter bank, the caller's hint: one distinct adapter): a_desc is
    # the bank's A viewed [L·R_MAX, K], b_ptr its slot 0 ([N, R_MAX] strides), R the bank's R_MAX; every program
    # serves the batch's largest valid id (adapter_rows.bank_pick) — its A rows, B slot, rank and scale — rows of
    # other ids get a zero S, and rows holding yet another adapter (a wrong hint) are added by whoever stored the
    # tile, out of line (adapter_rows.bank_stragglers, from x_ptr / bank_a_ptr by pointer loads). B_CLEAN (the bank
    # keeps B zero past each rank, as AdapterBank does): loads stay masked by the launch's R (R_MAX, which the
    # compiler may know to be a multiple of 16: vector loads of B) and the picked rank only zeroes S; otherwise the
    # rank masks the loads (past it a bank may hold anything, NaN included).
    # STACK_D > 0 (stacked BANK, a hint of ≤ STACK_D adapters; adapter_rows.stack_pick): R = STACK_D·R_MAX ≤ BLOCK_R
    # columns, column q of the batch's (q // R_MAX)-th largest valid id (STACK_R = R_MAX); A's rows gathered from
    # bank_a_ptr in the K loop (KLOOP) or by the down kernel / S producers (GLOBAL, S arrives masked and scaled);
    # one stacked B tile (adapter_rows.stacked_b, B_VEC: its vector form) and one MMA; scale must be 1.0; rows of
    # smaller ids are stragglers as above. Whole tiles only (no split-K). A stacked rank above BLOCK_R (R_CHUNKS > 1:
    # GLOBAL, no prefetch, no S producers) takes the epilogue in rank chunks, each its own columns' B tile
    # (_stacked_chunks).
    tl.static_assert(not (BANK and (PARTIAL or LOWRANK == 0)), "BANK: a low-rank branch, whole or FIXUP tiles")
    tl.static_assert(not (STACK_D > 0 and (not BANK or FIXUP)), "STACK_D: a BANK launch of whole tiles")
    tl.static_assert(not (STACK_D > 0 and R_CHUNKS > 1 and (LOWRANK != 2 or EPI_PREFETCH or S_PRODUCERS > 0)),
                     "STACK_D in rank chunks: GLOBAL S from the down kernel, no prefetch")
    STACK_ONE: tl.constexpr = STACK_D > 0 and R_CHUNKS == 1    # the stacked rank in one chunk
    PRE: tl.constexpr = EPI_PREFETCH or STACK_ONE       # the epilogue's B tile (and bias, S rows) held in registers
    tl.static_assert(not (S_PRODUCERS > 0 and (LOWRANK != 2 or PARTIAL or FIXUP or PDL)),
                     "S_PRODUCERS: GLOBAL S in one unsplit launch, no PDL")
    tl.static_assert(not S_WORDS or (S_PRODUCERS > 0 and S_PRODUCERS <= 4 and PRE),
                     "S_WORDS: one to four S producers, the S rows held for the epilogue (prefetch or stacked)")
    tl.static_assert(not (EPI_PREFETCH and PARTIAL), "PARTIAL has no epilogue to prefetch for")
    tl.static_assert(not (EPI_PREFETCH and LOWRANK == 2 and R_CHUNKS > 1),
                     "EPI_PREFETCH holds one rank chunk of S and B")
    tl.static_assert(not (HYBRID and not FIXUP), "HYBRID is a FIXUP grid")
    pid = tl.program_id(0)
    b_bank = b_ptr      # slot 0 of the bank (BANK): the wrong-hint path reads other slots from it
    a_rows = 0
    a_ok = 0
    if STACK_D > 0 and R_CHUNKS > 1:
        ids_all, first, desc, cur, mixed = stack_order(ids_ptr, M, L, ID_BLOCK, STACK_D)
        a_row0 = 0
        rank = 0
    elif STACK_D > 0:
        slot_q, rr_q, live_q, scale_q, cur, mixed = stack_pick(ids_ptr, ranks_ptr, scales_ptr, M, L,
                                                               tl.arange(0, BLOCK_R), ID_BLOCK, STACK_D, STACK_R)
        a_rows = bank_a_ptr + tl.maximum(slot_q, 0).to(tl.int64) * stride_al + rr_q * stride_ar
        a_ok = live_q       # rows past a rank or past the batch's adapters: no traffic (their S is zeroed anyway)
        a_row0 = 0
        rank = 0
    else:
        cur, slot, rank, mixed, R, scale, a_row0, b_ptr = _bank_setup(ids_ptr, ranks_ptr, scales_ptr, M, L, R_MAX,
                                                                      R, scale, b_ptr, stride_bl, BANK, ID_BLOCK,
                                                                      B_CLEAN)
    if S_PRODUCERS > 0:
        if pid < S_PRODUCERS:
            _produce_s_slice(x_desc, a_desc, s_ptr, cnt_ptr, pid, S_PRODUCERS, M, K, R, scale, stride_sk,
                             stride_sm, stride_sr, BLOCK_M, BLOCK_R, BLOCK_K, BANK, ids_ptr, cur, L, a_row0,
                             rank, ranks_ptr, scales_ptr, bank_a_ptr, stride_al, stride_ar, ID_BLOCK, STACK_D,
                             STACK_R, S_WORDS)
            return
        pid -= S_PRODUCERS
        if S_WORDS:
            # this tile's epoch from one lane's atomic, kept in that lane until after the K loop (a scalar atomic's
            # result is broadcast behind a CTA barrier, which would hold the K loop for its round trip)
            lane = tl.arange(0, 32)
            counted = tl.atomic_add(cnt_ptr + lane * 0, tl.where(lane == 0, 1, 0).to(tl.int64), mask=lane == 0,
                                    sem="relaxed", scope="gpu")
            lane_epoch = tl.where(lane == 0, counted // (tl.num_programs(0) - S_PRODUCERS) + 1, 0)
    pid_k = tl.program_id(1)
    n_split = SPLIT_K
    whole = False           # a tile computed unsplit in a FIXUP launch (HYBRID: a runtime value)
    tile = pid
    if HYBRID:
        whole = pid < DP_TILES
        piece = tl.maximum(pid - DP_TILES, 0)
        tile = tl.where(whole, pid, DP_TILES + piece // SPLIT_K)
        pid_k = tl.where(whole, 0, piece % SPLIT_K)
        n_split = tl.where(whole, 1, SPLIT_K)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, n_split)
    k_lo = pid_k * per_split
    k_hi = tl.minimum(k_lo + per_split, k_tiles)
    ids_rows = cur
    if BANK:    # the tile's ids, consumed after the K loop: their load overlaps it
        ids_rows = safe_ids(ids_ptr, off_m + tl.arange(0, BLOCK_M), off_m + tl.arange(0, BLOCK_M) < M, L)

    # epilogue operands that do not depend on the K loop: with EPI_PREFETCH their loads are in
    # flight during the pipeline fill instead of on the critical path after the last MMA
    b_pre = 0.0
    bias_pre = 0.0
    s_pre = 0.0
    if EPI_PREFETCH:
        pre_n = off_n + tl.arange(0, BLOCK_N)
        if LOWRANK != 0:
            if STACK_D > 0:
                b_pre = stacked_b(slot_q, rr_q, live_q, b_ptr, stride_bl, stride_bn, stride_br, pre_n, N, STACK_R,
                                  B_VEC)
            else:
                b_pre = _b_tile(b_ptr, stride_bn, stride_br, pre_n, N, R, BLOCK_R)
        if HAS_BIAS:
            bias_pre = tl.load(bias_ptr + pre_n, mask=pre_n < N, other=0.0).to(tl.float32)
        if LOWRANK == 2 and not PDL and S_PRODUCERS == 0:
            s_pre = _s_rows(s_ptr, stride_sk, stride_sm, stride_sr, S_SPLITS,
                            off_m + tl.arange(0, BLOCK_M), M, 0, R, BLOCK_M, BLOCK_R)
    acc, s = _main_loop(x_desc, w_desc, a_desc, off_m, off_n, k_lo, k_hi,
                        BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_R, LOWRANK == 1, SWAP_AB, a_row0, a_rows, K, STACK_D > 0,
                        a_ok, wscale_ptr, N, xscale_ptr, M, X_TERMS)
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    if BANK and LOWRANK == 1:
        if STACK_D > 0:
            s = tl.where((ids_rows[:, None] == slot_q[None, :]) & live_q[None, :], s * scale_q[None, :], 0.0)
        else:
            s = tl.where((ids_rows == cur)[:, None] & (tl.arange(0, BLOCK_R) < rank)[None, :], s, 0.0)
    if STACK_ONE and not EPI_PREFETCH:    # the stacked B tile (and bias) after the loop, as a prefetch would hold them
        b_pre = stacked_b(slot_q, rr_q, live_q, b_ptr, stride_bl, stride_bn, stride_br, offs_n, N, STACK_R, B_VEC)
        if HAS_BIAS:
            bias_pre = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    if S_PRODUCERS > 0 and not S_WORDS:
        # every producer's S slice is stored and released (they are the lowest program ids: dispatched
        # first, and they wait for nothing, so they are resident or done while anyone spins here)
        while tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu") < S_PRODUCERS:
            pass
    if PDL:
        gdc_wait()      # S (lora_down_kernel's output) is complete and visible from here on
    if S_WORDS:
        s_pre = _s_rows_words(s_ptr, stride_sk, stride_sm, stride_sr, offs_m, M, R, tl.max(lane_epoch, 0),
                              S_PRODUCERS, BLOCK_M, BLOCK_R)
    elif LOWRANK == 2 and ((EPI_PREFETCH and (PDL or S_PRODUCERS > 0)) or (STACK_ONE and not EPI_PREFETCH)):
        # S rows as soon as S is complete
        s_pre = _s_rows(s_ptr, stride_sk, stride_sm, stride_sr, S_SPLITS, offs_m, M, 0, R, BLOCK_M, BLOCK_R)
    if LOWRANK == 2 and PRE:
        s = s_pre           # the whole-tile epilogue's S rows (GLOBAL)
    stored = pid >= 0      # this program stores its tile (a FIXUP piece: only when it arrives last)
    if PARTIAL:
        store_tile(y_ptr + pid_k * stride_yk, acc, offs_m, offs_n, M, N, stride_ym, stride_yn)
        if LOWRANK == 1:
            if pid_n == 0:  # S of an M-block is the same for every N-tile: one copy per split
                offs_r = tl.arange(0, BLOCK_R)
                tl.store(sws_ptr + pid_k * stride_swk + offs_m[:, None] * stride_swm
                         + offs_r[None, :] * stride_swr, s, mask=offs_m[:, None] < M)
    elif FIXUP and not whole:
        stored = _fixup_tile(acc, s, tile, pid_k, n_split, off_m, offs_m, offs_n, M, N, R, scale,
                    s_ptr, stride_sk, stride_sm, stride_sr, S_SPLITS, b_ptr, stride_bn,
                    stride_br, bias_ptr, y_ptr, stride_ym, stride_yn, sws_ptr, stride_swk,
                    stride_swn, stride_swm, stride_swr, ws_ptr, cnt_ptr, stride_wk,
                    stride_wm, stride_wn, pid_n, b_pre, bias_pre, BLOCK_N, BLOCK_R, LOWRANK,
                    HAS_BIAS, R_CHUNKS, EPI_M, IN_FLIGHT, EPI_CHUNKS, EPI_PREFETCH)
    elif STACK_D > 0 and R_CHUNKS > 1:
        acc = _stacked_chunks(acc, ids_all, first, desc, ranks_ptr, scales_ptr, s_ptr, stride_sk, stride_sm,
                              stride_sr, S_SPLITS, b_ptr, stride_bl, stride_bn, stride_br, offs_m, offs_n, M, N, R,
                              BLOCK_M, BLOCK_R, R_CHUNKS, STACK_D, STACK_R, B_VEC)
        _epilogue(acc, s, offs_m, offs_n, M, N, R, scale, s_ptr, stride_sk, stride_sm, stride_sr,
                  S_SPLITS, b_ptr, stride_bn, stride_br, bias_ptr, y_ptr, stride_ym, stride_yn,
                  b_pre, bias_pre, BLOCK_M, BLOCK_R, 0, HAS_BIAS, R_CHUNKS, False)
    else:
        _epilogue(acc, s, offs_m, offs_n, M, N, R, scale, s_ptr, stride_sk, stride_sm, stride_sr,
                  S_SPLITS, b_ptr, stride_bn, stride_br, bias_ptr, y_ptr, stride_ym, stride_yn,
                  b_pre, bias_pre, BLOCK_M, BLOCK_R, LOWRANK, HAS_BIAS, R_CHUNKS, PRE)
    if BANK:
        if mixed:   # the hint was wrong somewhere in the batch (a scalar every program holds): look at this tile
            if stored & bank_has_stragglers(ids_rows, cur):
                tl.debug_barrier()      # this CTA's stores of the tile before its loads of it
                bank_stragglers(y_ptr, stride_ym, stride_yn, x_ptr, stride_xm, bank_a_ptr, stride_al, stride_ar,
                                b_bank, stride_bl, stride_bn, stride_br, ids_ptr,
                                ranks_ptr, scales_ptr, M, N, K, L, R_MAX, cur, off_m, off_n, BLOCK_M, BLOCK_N, 32,
                                BLOCK_R)
    if S_PRODUCERS > 0 and not S_WORDS:
        # S is read (the epilogue's loads precede the ticket); the last main program leaves both
        # counters at zero for the next launch on this stream / the next graph replay
        if splitk_arrive(cnt_ptr + 1, num_pid_m * num_pid_n):
            splitk_reset(cnt_ptr)
            splitk_reset(cnt_ptr + 1)


@triton.jit
def _stacked_chunks(acc, ids_all, first, desc, ranks_ptr, scales_ptr, s_ptr, stride_sk, stride_sm, stride_sr, S_SPLITS,
                    b_ptr, stride_bl, stride_bn, stride_br, offs_m, offs_n, M, N, R, BLOCK_M: tl.constexpr,
                    BLOCK_R: tl.constexpr, R_CHUNKS: tl.constexpr, D: tl.constexpr, RB: tl.constexpr,
                    B_VEC: tl.constexpr):
    """acc += S·B_stackᵀ over a stacked rank of R_CHUNKS chunks of BLOCK_R columns (S from the down kernel, already
    masked per row and scaled), each chunk's B rows gathered for the adapters its columns belong to
    (:func:`~.adapter_rows.stack_cols` on :func:`~.adapter_rows.stack_order`'s values)."""
    for c in tl.static_range(R_CHUNKS):
        offs_q = c * BLOCK_R + tl.arange(0, BLOCK_R)
        slot_q, rr_q, live_q, _scale_q = stack_cols(ids_all, first, desc, ranks_ptr, scales_ptr, offs_q, D, RB)
        s = _s_rows(s_ptr, stride_sk, stride_sm, stride_sr, S_SPLITS, offs_m, M, c * BLOCK_R, R, BLOCK_M, BLOCK_R)
        b = stacked_b(slot_q, rr_q, live_q, b_ptr, stride_bl, stride_bn, stride_br, offs_n, N, RB, B_VEC)
        acc = tl.dot(s.to(b.dtype), b, acc)
    return acc


@triton.jit
def _produce_s_slice(x_desc, a_desc, s_ptr, cnt_ptr, slice_id, SLICES, M, K, R, scale, stride_sk, stride_sm,
                     stride_sr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                     BANK: tl.constexpr = False, ids_ptr=None, cur=-1, L=0, a_row0=0, rank=0,
                     ranks_ptr=None, scales_ptr=None, bank_a_ptr=None, stride_al=0, stride_ar=0,
                     ID_BLOCK: tl.constexpr = 16, STACK_D: tl.constexpr = 0, STACK_R: tl.constexpr = 16,
                     WORDS: tl.constexpr = False):
    """An S producer of an S_PRODUCERS launch: S[slice_id] for every row block (R ≤ BLOCK_R; at decode M one
    block), then released. WORDS: stamped words (:func:`_s_word`) of the epoch this producer counts itself into
    (cnt_ptr[1], int64), no release."""
    epoch = 0
    if WORDS:
        epoch = tl.atomic_add(cnt_ptr + 1, 1, sem="relaxed", scope="gpu") // SLICES + 1
    for m0 in range(0, M, BLOCK_M):
        _down_slice(x_desc, a_desc, s_ptr, m0, 0, slice_id, SLICES, M, K, R, scale, stride_sk, stride_sm, stride_sr,
                    BLOCK_M, BLOCK_R, BLOCK_K, BANK, ids_ptr, cur, L, a_row0, rank, ranks_ptr, scales_ptr,
                    bank_a_ptr, stride_al, stride_ar, ID_BLOCK, STACK_D, STACK_R, WORDS, epoch)
    if not WORDS:
        tl.debug_barrier()      # all threads' S stores precede the (one-thread) release
        tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _fixup_tile(acc, s, tile, pid_k, n_split, off_m, offs_m, offs_n, M, N, R, scale,
                s_ptr, stride_sk, stride_sm, stride_sr, S_SPLITS, b_ptr, stride_bn, stride_br,
                bias_ptr, y_ptr, stride_ym, stride_yn, sws_ptr, stride_swk, stride_swn, stride_swm,
                stride_swr, ws_ptr, cnt_ptr, stride_wk, stride_wm, stride_wn, pid_n, b_pre, bias_pre,
                BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, LOWRANK: tl.constexpr,
                HAS_BIAS: tl.constexpr, R_CHUNKS: tl.constexpr, EPI_M: tl.constexpr,
                IN_FLIGHT: tl.constexpr, EPI_CHUNKS: tl.constexpr, PREFETCHED: tl.constexpr):
    """One split piece of a FIXUP tile: park this piece's partials (rows ≥ M are neither parked nor
    read: decode M=1 moves one row per split, not BLOCK_M), take the tile's ticket; the last of
    ``n_split`` arrivals sums the partials in split order and runs the epilogue. Returns whether this piece stored
    the tile (it was the last)."""
    splitk_store(ws_ptr, offs_m[:, None] * stride_wm + offs_n[None, :] * stride_wn, stride_wk,
                 pid_k, acc, (offs_m[:, None] < M) & (offs_n[None, :] < N))
    if LOWRANK == 1:
        # S of an M-block is the same for every N-tile, but only this tile's splits are
        # ordered by its ticket: each tile parks its own copy
        splitk_store(sws_ptr + pid_n * stride_swn,
                     offs_m[:, None] * stride_swm + tl.arange(0, BLOCK_R)[None, :] * stride_swr,
                     stride_swk, pid_k, s, offs_m[:, None] < M)
    last = splitk_arrive(cnt_ptr + tile, n_split)
    if last:
        # the reduction + epilogue run on EPI_CHUNKS chunks of EPI_M rows: one summed tile and
        # one loaded partial of EPI_M rows live at a time, not two whole 128-row tiles, and at
        # decode M only the EPI_M ≥ M rows that exist (16 instead of 64)
        for c in tl.static_range(EPI_CHUNKS):
            e_m = off_m + c * EPI_M + tl.arange(0, EPI_M)
            t_mask = (e_m[:, None] < M) & (offs_n[None, :] < N)
            acc2 = splitk_sum(ws_ptr, e_m[:, None] * stride_wm + offs_n[None, :] * stride_wn,
                              stride_wk, t_mask, n_split,
                              tl.zeros((EPI_M, BLOCK_N), dtype=tl.float32), IN_FLIGHT)
            s2 = tl.zeros((EPI_M, BLOCK_R), dtype=tl.float32)
            if LOWRANK == 1:
                s2 = splitk_sum(sws_ptr + pid_n * stride_swn,
                                e_m[:, None] * stride_swm + tl.arange(0, BLOCK_R)[None, :] * stride_swr,
                                stride_swk, e_m[:, None] < M, n_split, s2, IN_FLIGHT)
            if LOWRANK == 2 and PREFETCHED:
                s2 = _s_rows(s_ptr, stride_sk, stride_sm, stride_sr, S_SPLITS, e_m, M, 0, R,
                             EPI_M, BLOCK_R)
            if c == EPI_CHUNKS - 1:     # every read of this launch's partials is issued
                splitk_reset(cnt_ptr + tile)
            _epilogue(acc2, s2, e_m, offs_n, M, N, R, scale, s_ptr, stride_sk, stride_sm, stride_sr,
                      S_SPLITS, b_ptr, stride_bn, stride_br, bias_ptr, y_ptr, stride_ym, stride_yn,
                      b_pre, bias_pre, EPI_M, BLOCK_R, LOWRANK, HAS_BIAS, R_CHUNKS, PREFETCHED)
    return last


@triton.jit
def _epilogue(acc, s, offs_m, offs_n, M, N, R, scale, s_ptr, stride_sk, stride_sm, stride_sr,
              S_SPLITS, b_ptr, stride_bn, stride_br, bias_ptr, y_ptr, stride_ym, stride_yn,
              b_pre, bias_pre, ROWS: tl.constexpr, BLOCK_R: tl.constexpr, LOWRANK: tl.constexpr,
              HAS_BIAS: tl.constexpr, R_CHUNKS: tl.constexpr, PREFETCHED: tl.constexpr):
    """Y[offs_m, offs_n] = acc (+ low-rank term of mode LOWRANK) (+ bias); acc [ROWS, BN] fp32,
    s [ROWS, BLOCK_R]: the unscaled K-loop S (KLOOP), or with PREFETCHED the summed S rows
    (GLOBAL). PREFETCHED: B tile ``b_pre`` and bias row ``bias_pre`` were loaded by the caller."""
    if LOWRANK == 1:
        # rank slots ≥ R hold x·0 (zero-filled A rows), NaN where x is ±inf: zero them so
        # padding cannot leak into rows torch would keep finite
        s = tl.where(tl.arange(0, BLOCK_R)[None, :] < R, s * scale, 0.0)
        if PREFETCHED:
            acc = tl.dot(s.to(b_pre.dtype), b_pre, acc)      # = lowrank_up with the loaded B
        else:
            acc = lowrank_up(acc, s, b_ptr, stride_bn, stride_br, offs_n, N, R, BLOCK_R)
    if LOWRANK == 2:
        if PREFETCHED:
            acc = tl.dot(s.to(b_pre.dtype), b_pre, acc)
        else:
            acc = _lowrank_from_slices(acc, s_ptr, stride_sk, stride_sm, stride_sr, S_SPLITS,
                                       b_ptr, stride_bn, stride_br, offs_m, offs_n, M, N, R,
                                       ROWS, BLOCK_R, R_CHUNKS)
    if PREFETCHED:
        if HAS_BIAS:
            acc = acc + bias_pre[None, :]
    else:
        acc = add_bias(acc, offs_n, N, bias_ptr, HAS_BIAS)
    store_tile(y_ptr, acc, offs_m, offs_n, M, N, stride_ym, stride_yn)


@triton.jit
def lora_down_kernel(
    x_desc,             # X [M, K], box [BM, BK]
    a_desc,             # A [R, K], box [BR, BK]
    s_ptr,              # S [S_SPLITS, M, R] fp32 (out): scaled partial sums over K slices
    M, K, R, scale, stride_sk, stride_sm, stride_sr,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False,
    ids_ptr=None, ranks_ptr=None, scales_ptr=None, L=0, R_MAX=0,      # BANK (see lora_main_kernel)
    BANK: tl.constexpr = False, ID_BLOCK: tl.constexpr = 16, B_CLEAN: tl.constexpr = False,
    bank_a_ptr=None, stride_al=0, stride_ar=0, STACK_D: tl.constexpr = 0, STACK_R: tl.constexpr = 16,   # stacked
):
    # grid (M blocks, R blocks, K slices): a decode-sized M alone gives 1–2 CTAs, which would
    # walk all of K serially (latency-bound); slices are summed in order by the consumer
    # PDL: the main kernel (launched as this one's dependent) may be scheduled at once: it reads S
    # only after its griddepcontrol.wait, i.e. after this whole grid has finished
    if PDL:
        gdc_launch_dependents()
    if STACK_D > 0:
        cur = -1
        rank = 0
        a_row0 = 0
    else:
        cur, slot, rank, mixed, R, scale, a_row0, _b = _bank_setup(ids_ptr, ranks_ptr, scales_ptr, M, L, R_MAX, R,
                                                                   scale, s_ptr, 0, BANK, ID_BLOCK, B_CLEAN)
    _down_slice(x_desc, a_desc, s_ptr, tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_R, tl.program_id(2),
                tl.num_programs(2), M, K, R, scale, stride_sk, stride_sm, stride_sr, BLOCK_M, BLOCK_R, BLOCK_K,
                BANK, ids_ptr, cur, L, a_row0, rank, ranks_ptr, scales_ptr, bank_a_ptr, stride_al, stride_ar,
                ID_BLOCK, STACK_D, STACK_R)


@triton.jit
def lora_reduce_kernel(
    ws_ptr,             # partials [SPLITS, M, N] fp32
    s_ptr,              # S [S_SPLITS, M, ≥R] fp32 (partials or final)
    b_ptr,              # B [N, R]
    bias_ptr,           # bias [N]
    y_ptr,              # Y [M, N]
    M, N, R, s_scale, SPLITS, S_SPLITS,
    stride_wk, stride_wm, stride_wn, stride_sk, stride_sm, stride_sr,
    stride_bn, stride_br, stride_ym, stride_yn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
    HAS_LORA: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ptrs = ws_ptr + offs_m[:, None] * stride_wm + offs_n[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(SPLITS):
        acc += tl.load(ptrs + k * stride_wk, mask=mask, other=0.0)
    if HAS_LORA:
        acc = _lowrank_from_buffer(acc, s_ptr, stride_sk, stride_sm, stride_sr, S_SPLITS, s_scale,
                                   b_ptr, stride_bn, stride_br, offs_m, offs_n, M, N, R,
                                   BLOCK_M, BLOCK_R)
    acc = add_bias(acc, offs_n, N, bias_ptr, HAS_BIAS)
    store_tile(y_ptr, acc, offs_m, offs_n, M, N, stride_ym, stride_yn)


@triton.jit
def _lane_atomic_add(ptr, val, sem: tl.constexpr):
    """``atomic_add(ptr, val)`` by one lane of a 256-element tensor, ≥ one element per thread up to 8 warps, so the
    result has no replica to be broadcast to: it stays in that lane and nothing waits for the round trip until it is
    used (a scalar atomic's result is broadcast through shared memory behind a CTA barrier at once). Returns the lane
    indices and the result (valid where ``lane == 0``)."""
    lane = tl.arange(0, 256)
    return lane, tl.atomic_add(ptr + lane * 0, tl.where(lane == 0, val, 0), mask=lane == 0, sem=sem, scope="gpu")


@triton.jit
def _next_task(task, counter_ptr, DYNAMIC: tl.constexpr):
    if DYNAMIC:
        task = tl.atomic_add(counter_ptr, 1, sem="relaxed")
    else:
        task += tl.num_programs(0)
    return task


@triton.jit
def _globaltimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


# TRACE rows of lora_flat_kernel and lora_persistent_kernel (int64, one row per program): the global timer (ns) at the
# program's start, after its S tasks, after its first tile's K loop, past that tile's S wait, after its epilogue, at
# the program's end; slot 6 unused; slot 7 the SM it ran on. Slots a program never reaches stay as the host left them.
# A stamp orders against the program's own instructions, not against its asynchronous work: the K loop's last wgmma
# may still be in flight at slot 2 (it is waited for before the epilogue uses the accumulator).
TRACE_SLOTS = 8
TRACE_NAMES = ("start", "s_tasks", "k_loop_1", "s_wait", "epilogue_1", "end", "", "smid")


@triton.jit
def _stamp(trace_ptr, slot: tl.constexpr, TRACE: tl.constexpr):
    """TRACE: the global timer (ns) into this program's row of trace_ptr [programs, TRACE_SLOTS] int64."""
    if TRACE:
        tl.store(trace_ptr + tl.program_id(0) * 8 + slot, _globaltimer())


@triton.jit
def _stamp_first(trace_ptr, slot: tl.constexpr, tiles_done, TRACE: tl.constexpr):
    """TRACE: :func:`_stamp` in the program's first tile only (``tiles_done`` == 0)."""
    if TRACE:
        if tiles_done == 0:
            _stamp(trace_ptr, slot, TRACE)


@triton.jit
def _stamp_start(trace_ptr, TRACE: tl.constexpr):
    """TRACE: slot 0 (start) and slot 7 (the SM)."""
    if TRACE:
        _stamp(trace_ptr, 0, TRACE)
        tl.store(trace_ptr + tl.program_id(0) * 8 + 7, _smid().to(tl.int64))


@triton.jit
def lora_persistent_kernel(
    x_desc,             # X [M, K], box [BM, BK]
    w_desc,             # W [N, K], box [BN, BK]
    a_desc,             # A [R, K], box [BR, BK]
    s_ptr,              # S [M, R] fp32 scratch (written by S tasks)
    sync_ptr,           # int32 [2·num_pid_m + 1], zero on entry, left zero on exit: S-ready flags, the work
                        # counter, then per M block the count of its tiles past their wait
    b_ptr,              # B [N, R]
    bias_ptr,           # bias [N]
    y_ptr,              # Y [M, N]
    M, N, K, R, scale,
    stride_sm, stride_sr, stride_bn, stride_br, stride_ym, stride_yn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
    GROUP_M: tl.constexpr, DYNAMIC: tl.constexpr, HAS_BIAS: tl.constexpr,
    EPI_STAGES: tl.constexpr = None,    # KernelConfig.epi_stages (0 → None: the compiler's choice)
    ids_ptr=None, ranks_ptr=None, scales_ptr=None, x_ptr=None, bank_a_ptr=None, L=0, R_MAX=0,    # BANK
    stride_xm=0, stride_al=0, stride_ar=0, stride_bl=0,
    BANK: tl.constexpr = False, ID_BLOCK: tl.constexpr = 16, B_CLEAN: tl.constexpr = False,
    wscale_ptr=None,    # fp8 weights' per-output-channel scale (lora_main_kernel)
    READERS_LATE: tl.constexpr = True,
    y_desc=None,        # Y [M, N], box [BM, BN / Y_PIECES] (Y_TMA; not with BANK: its stragglers read the tile back)
    Y_TMA: tl.constexpr = False, Y_PIECES: tl.constexpr = 2,
    TRACE: tl.constexpr = False,        # timestamps per program (TRACE_SLOTS; the first tile's phases) into trace_ptr;
    trace_ptr=None,                     # never under the interpreter (inline PTX)
):
    # BANK, B_CLEAN: as lora_main_kernel's (one adapter of a bank, picked on the device; rows of other adapters finished
    # after their tile's store)
    # READERS_LATE (session 48): a tile counts itself past its wait with one lane's atomic and acts on the count only
    # after its store, so the atomic's round trip hides behind the epilogue; False is session 47's form (a scalar
    # atomic, whose result is broadcast behind a CTA barrier before the epilogue starts) for A/B probes.
    tl.static_assert(not (BANK and Y_TMA), "BANK reads the stored tile back: pointer stores only")
    b_bank = b_ptr
    cur, slot, rank, mixed, R, scale, a_row0, b_ptr = _bank_setup(ids_ptr, ranks_ptr, scales_ptr, M, L, R_MAX, R,
                                                                  scale, b_ptr, stride_bl, BANK, ID_BLOCK, B_CLEAN)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tasks = num_pid_m + num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    counter_ptr = sync_ptr + num_pid_m
    readers_ptr = counter_ptr + 1
    _stamp_start(trace_ptr, TRACE)
    tiles_done = 0
    if DYNAMIC:
        task = tl.atomic_add(counter_ptr, 1, sem="relaxed")
    else:
        task = tl.program_id(0)
    while task < num_tasks:
        if task < num_pid_m:
            # phase 1: S block of M-block `task`, then publish it (stores → CTA barrier → release)
            s = _down_loop(x_desc, a_desc, task * BLOCK_M, a_row0, 0, k_tiles, BLOCK_M, BLOCK_R, BLOCK_K)
            offs_m = task * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_r = tl.arange(0, BLOCK_R)
            if BANK:
                s = tl.where(bank_rows(ids_ptr, offs_m, M, L, cur)[:, None] & (offs_r < rank)[None, :], s, 0.0)
            tl.store(s_ptr + offs_m[:, None] * stride_sm + offs_r[None, :] * stride_sr, s * scale,
                     mask=(offs_m[:, None] < M) & (offs_r[None, :] < R))
            tl.debug_barrier()
            tl.atomic_xchg(sync_ptr + task, 1, sem="release", scope="gpu")
            _stamp(trace_ptr, 1, TRACE)
        else:
            pid_m, pid_n = grouped_tile(task - num_pid_m, num_pid_m, num_pid_n, GROUP_M)
            acc, _s = _main_loop(x_desc, w_desc, a_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, 0,
                                 k_tiles, BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_R, False, ws_ptr=wscale_ptr, N=N)
            _stamp_first(trace_ptr, 2, tiles_done, TRACE)
            # phase 2: the S block was produced by a task with a smaller id, already handed out
            while tl.atomic_add(sync_ptr + pid_m, 0, sem="acquire", scope="gpu") == 0:
                pass
            _stamp_first(trace_ptr, 3, tiles_done, TRACE)
            # the block's last tile past this wait puts its flag and count back to zero, so the next launch finds the
            # buffer as this one did (a persistent region shared by every launch on the stream: no memset per call)
            if READERS_LATE:
                lane, readers = _lane_atomic_add(readers_ptr + pid_m, 1, "relaxed")
            elif tl.atomic_add(readers_ptr + pid_m, 1, sem="relaxed", scope="gpu") == num_pid_n - 1:
                tl.atomic_xchg(sync_ptr + pid_m, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(readers_ptr + pid_m, 0, sem="relaxed", scope="gpu")
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = _lowrank_from_buffer(acc, s_ptr, 0, stride_sm, stride_sr, 1, 1.0, b_ptr,
                                       stride_bn, stride_br, offs_m, offs_n, M, N, R,
                                       BLOCK_M, BLOCK_R, EPI_STAGES)
            acc = add_bias(acc, offs_n, N, bias_ptr, HAS_BIAS)
            store_y(y_ptr, acc, offs_m, offs_n, M, N, stride_ym, stride_yn, y_desc, pid_m * BLOCK_M, pid_n * BLOCK_N,
                    BLOCK_M, BLOCK_N, Y_TMA, Y_PIECES)
            _stamp_first(trace_ptr, 4, tiles_done, TRACE)
            if TRACE:
                tiles_done += 1
            if READERS_LATE:
                last = (lane == 0) & (readers == num_pid_n - 1)
                tl.atomic_xchg(sync_ptr + pid_m + lane * 0, tl.zeros_like(lane), mask=last, sem="relaxed", scope="gpu")
                tl.atomic_xchg(readers_ptr + pid_m + lane * 0, tl.zeros_like(lane), mask=last, sem="relaxed",
                               scope="gpu")
            if BANK:
                if mixed:   # a wrong hint somewhere in the batch: look at this tile
                    if bank_has_stragglers(safe_ids(ids_ptr, offs_m, offs_m < M, L), cur):
                        tl.debug_barrier()      # this CTA's stores of the tile before its loads of it
                        bank_stragglers(y_ptr, stride_ym, stride_yn, x_ptr, stride_xm, bank_a_ptr, stride_al,
                                        stride_ar, b_bank, stride_bl, stride_bn,
                                        stride_br, ids_ptr, ranks_ptr, scales_ptr, M, N, K, L, R_MAX, cur,
                                        pid_m * BLOCK_M, pid_n * BLOCK_N, BLOCK_M, BLOCK_N, 16, BLOCK_R)
        task = _next_task(task, counter_ptr, DYNAMIC)
    _stamp(trace_ptr, 5, TRACE)
    if DYNAMIC:
        # every program's last draw is ≥ num_tasks, one per program: the draw num_tasks + grid − 1 is the counter's
        # last use in this launch, so its program resets it
        if task == num_tasks + tl.num_programs(0) - 1:
            tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def _flat_k_loop(x_desc, w_desc, pid_m, pid_n, k_tiles, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(k_tiles):
        x = x_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])
        w = w_desc.load([pid_n * BLOCK_N, kt * BLOCK_K])
        acc = tl.dot(x, w.T, acc)
    return acc


@triton.jit
def _flat_epilogue(acc, pid_m, pid_n, s_ptr, b_ptr, bias_ptr, y_ptr, s_desc, b_desc, M, N, R, stride_sm, stride_sr,
                   stride_bn, stride_br, stride_ym, stride_yn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_R: tl.constexpr, LOWRANK: tl.constexpr, HAS_BIAS: tl.constexpr, LORA_TMA: tl.constexpr,
                   S_SPLITS: tl.constexpr, y_desc=None, Y_TMA: tl.constexpr = False, Y_PIECES: tl.constexpr = 2):
    """acc + S[tile rows, :R]·B[tile columns, :R]ᵀ (S fp32, rounded to B's dtype first; the rank in one chunk) + bias
    → Y. LORA_TMA: S (its K slices summed in index order; s_desc views S [S_SPLITS, M, R], rows past M and ranks past
    R read 0) and B by TMA; else by masked pointer loads (one slice) — which in a flattened loop puts register writes
    inside the main MMA's pipeline stage: ptxas then serializes every wgmma (C7515, session 49)."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if LOWRANK:
        if LORA_TMA:
            s = s_desc.load([0, pid_m * BLOCK_M, 0]).reshape(BLOCK_M, BLOCK_R)
            for k in tl.static_range(1, S_SPLITS):
                s += s_desc.load([k, pid_m * BLOCK_M, 0]).reshape(BLOCK_M, BLOCK_R)
            b = b_desc.load([pid_n * BLOCK_N, 0])
            acc = tl.dot(s.to(b.dtype), b.T, acc)
        else:
            tl.static_assert(S_SPLITS == 1, "S in K slices: by TMA only")
            offs_r = tl.arange(0, BLOCK_R)
            s = tl.load(s_ptr + offs_m[:, None] * stride_sm + offs_r[None, :] * stride_sr,
                        mask=(offs_m[:, None] < M) & (offs_r[None, :] < R), other=0.0)
            acc = lowrank_up(acc, s, b_ptr, stride_bn, stride_br, offs_n, N, R, BLOCK_R)
    acc = add_bias(acc, offs_n, N, bias_ptr, HAS_BIAS)
    store_y(y_ptr, acc, offs_m, offs_n, M, N, stride_ym, stride_yn, y_desc, pid_m * BLOCK_M, pid_n * BLOCK_N,
            BLOCK_M, BLOCK_N, Y_TMA, Y_PIECES)


@triton.jit
def _fence_proxy_async():
    tl.inline_asm_elementwise("fence.proxy.async.global; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def lora_flat_kernel(
    x_desc,             # X [M, K], box [BM, BK]
    w_desc,             # W [N, K], box [BN, BK]
    a_desc,             # A [R, K], box [BR, BK] (IN_GRID)
    s_ptr,              # S [S_SPLITS, M, R] fp32, scaled: the down kernel's K slices, or (IN_GRID) written here
    sync_ptr,           # int32 [2 + blocks of M] (IN_GRID): S blocks done, programs past the wait, per block its
                        # S tasks' tickets (s_slices > 1); zero on entry, left zero
    b_ptr,              # B [N, R]
    bias_ptr,           # bias [N]
    y_ptr,              # Y [M, N]
    s_desc,             # S viewed [S_SPLITS, M, R], box [1, BM, BLOCK_R] (LORA_TMA)
    b_desc,             # B [N, R], box [BN, BLOCK_R] (LORA_TMA)
    M, N, K, R, scale,
    stride_sm, stride_sr, stride_bn, stride_br, stride_ym, stride_yn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
    GROUP_M: tl.constexpr, LOWRANK: tl.constexpr, HAS_BIAS: tl.constexpr, FLATTEN: tl.constexpr = True,
    LORA_TMA: tl.constexpr = True, S_SPLITS: tl.constexpr = 1, IN_GRID: tl.constexpr = False,
    PROXY_FENCE: tl.constexpr = True,
    ws_ptr=None, stride_wk=0, s_slices=1,   # IN_GRID: S tasks in K slices, partials [s_slices, M, R] fp32 at ws_ptr
    s_programs=0,       # IN_GRID: the programs 0 … s_programs − 1 run the S tasks (0: every program)
    S_STAGES: tl.constexpr = None,      # IN_GRID: the S tasks' pipeline depth (None: num_stages)
    y_desc=None,        # Y [M, N], box [BM, BN / Y_PIECES] (Y_TMA)
    Y_TMA: tl.constexpr = False, Y_PIECES: tl.constexpr = 2,
    TRACE: tl.constexpr = False,        # timestamps per program (TRACE_SLOTS) into trace_ptr; never under the
    trace_ptr=None,                     # interpreter (inline PTX)
):
    # Session 49: a persistent grid of plain tiles whose tile loop and K loop are one software-pipelined loop
    # (tl.range flatten): the next tile's first X / W loads are issued while this tile's epilogue runs, where
    # lora_persistent_kernel starts every tile's pipeline from empty. The loop nest may hold nothing but the K loop to
    # flatten, so no wait for S can sit inside it:
    # - IN_GRID False: S whole from the down kernel launched before (its K slices summed in the epilogue);
    # - IN_GRID True: programs first run the S tasks (task q by program q mod s_programs, the host's count of programs
    #   with slack: one tile fewer, or no tile where the grid is wider than the tiles): row block q // s_slices over the
    #   (q mod s_slices)-th near-equal range of K tiles. With one slice a task stores its block scaled; with more it
    #   parks its partial at ws_ptr and takes the block's ticket (sync_ptr[2 + block]), and the last of the block's
    #   tasks sums the partials in slice order (deterministic), stores the block scaled and resets the ticket. A
    #   finished block is counted by a release add on sync_ptr[0]. Every program holding a tile then runs its first
    #   tile's K loop outside the flattened loop, waits once for all S blocks, and runs the rest flattened; the last
    #   of them past the wait zeroes words 0 and 1 after its store (the ticket region's contract). Programs walk the
    #   tiles in reverse program order (program p starts at tile grid − 1 − p), so the programs with one tile fewer
    #   (or none) are the lowest ids; the host picks s_slices and s_programs (flat_s_tasks) so that the S tasks sit
    #   on that slack or, where it is too small, are short and spread over every program. Session 49's form (whole
    #   blocks on programs with a full share of tiles) put one block's K loop, ~0.4 of a tile's, on the critical path
    #   (1.44× cuBLAS at 1024×4096², one tile per program). Progress needs only the S programs resident together (a
    #   grid of at most one program per SM): they are the lowest ids, which the hardware dispatches first, and none
    #   waits before its own tasks are done (as in persistent_static).
    #   PROXY_FENCE: S is written by plain stores and read by TMA (the async proxy): a proxy fence after the stores
    #   and after the acquire (off only under the interpreter, which runs no inline PTX).
    # The flattened epilogue recomputes its tile from a second counter so that it does not depend on values the
    # pipeliner moved ahead.
    start = tl.program_id(0)
    step = tl.num_programs(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    first = start
    _stamp_start(trace_ptr, TRACE)
    if IN_GRID:
        tl.static_assert(LOWRANK and S_SPLITS == 1, "IN_GRID: S whole, in one slice")
        per_slice = tl.cdiv(k_tiles, s_slices)
        s_step = step if s_programs == 0 else s_programs
        s_end = tl.where(start < s_step, num_pid_m * s_slices, 0)
        for q in range(start, s_end, s_step):
            block = q // s_slices
            k_lo = (q % s_slices) * per_slice
            s = _down_loop(x_desc, a_desc, block * BLOCK_M, 0, k_lo, tl.minimum(k_lo + per_slice, k_tiles),
                           BLOCK_M, BLOCK_R, BLOCK_K, STAGES=S_STAGES)
            offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_r = tl.arange(0, BLOCK_R)
            s_offs = offs_m[:, None] * stride_sm + offs_r[None, :] * stride_sr
            s_mask = (offs_m[:, None] < M) & (offs_r[None, :] < R)
            whole = s_slices == 1
            if s_slices > 1:
                splitk_store(ws_ptr, s_offs, stride_wk, q % s_slices, s, s_mask)
                whole = splitk_arrive(sync_ptr + 2 + block, s_slices)
                if whole:
                    s = splitk_sum(ws_ptr, s_offs, stride_wk, s_mask, s_slices,
                                   tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32))
                    splitk_reset(sync_ptr + 2 + block)
            if whole:
                tl.store(s_ptr + s_offs, s * scale, mask=s_mask)
                if PROXY_FENCE:
                    _fence_proxy_async()
                tl.debug_barrier()      # every thread's stores of the block before the one release
                tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
        _stamp(trace_ptr, 1, TRACE)
        start = step - 1 - start    # reverse program order from here: the S tasks' programs get the fewer tiles
        if start < num_tiles:       # a grid wider than the tiles: its lowest programs hold S tasks only
            pid_m, pid_n = grouped_tile(start, num_pid_m, num_pid_n, GROUP_M)
            acc = _flat_k_loop(x_desc, w_desc, pid_m, pid_n, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K)
            _stamp(trace_ptr, 2, TRACE)
            while tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu") < num_pid_m:
                pass
            _stamp(trace_ptr, 3, TRACE)
            if PROXY_FENCE:
                _fence_proxy_async()
            lane, passed = _lane_atomic_add(sync_ptr + 1, 1, "relaxed")
            _flat_epilogue(acc, pid_m, pid_n, s_ptr, b_ptr, bias_ptr, y_ptr, s_desc, b_desc, M, N, R, stride_sm,
                           stride_sr, stride_bn, stride_br, stride_ym, stride_yn, BLOCK_M, BLOCK_N, BLOCK_R,
                           LOWRANK, HAS_BIAS, LORA_TMA, S_SPLITS, y_desc, Y_TMA, Y_PIECES)
            _stamp(trace_ptr, 4, TRACE)
            last = (lane == 0) & (passed == tl.minimum(step, num_tiles) - 1)
            tl.atomic_xchg(sync_ptr + lane * 0, tl.zeros_like(lane), mask=last, sem="relaxed", scope="gpu")
            tl.atomic_xchg(sync_ptr + 1 + lane * 0, tl.zeros_like(lane), mask=last, sem="relaxed", scope="gpu")
        first = start + step
    tile_c = first - step
    for tile in tl.range(first, num_tiles, step, flatten=FLATTEN):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = _flat_k_loop(x_desc, w_desc, pid_m, pid_n, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K)
        tile_c += step
        pid_m, pid_n = grouped_tile(tile_c, num_pid_m, num_pid_n, GROUP_M)
        _flat_epilogue(acc, pid_m, pid_n, s_ptr, b_ptr, bias_ptr, y_ptr, s_desc, b_desc, M, N, R, stride_sm,
                       stride_sr, stride_bn, stride_br, stride_ym, stride_yn, BLOCK_M, BLOCK_N, BLOCK_R, LOWRANK,
                       HAS_BIAS, LORA_TMA, S_SPLITS, y_desc, Y_TMA, Y_PIECES)
    _stamp(trace_ptr, 5, TRACE)


@triton.jit
def _streamk_owner(unit, P, total):
    """Program whose range [p·total//P, (p+1)·total//P) holds work unit ``unit`` (int64)."""
    return ((unit + 1) * P - 1) // total


@triton.jit
def lora_streamk_kernel(
    x_desc,             # X [M, K], box [BM, BK]
    w_desc,             # W [N, K], box [BN, BK]
    a_desc,             # A [R, K], box [BR, BK]
    b_ptr,              # B [N, R]
    bias_ptr,           # bias [N]                         (HAS_BIAS)
    y_ptr,              # Y [M, N]
    ws_ptr,             # fp32 [2·P, BM, BN] partial accumulators, slot 2·program + (0 first | 1 last piece)
    sws_ptr,            # fp32 [2·P, BM, BR] partial S, same slots
    cnt_ptr,            # int32 [tiles] arrival tickets, zero on entry, left zero on exit (the tile's last arrival)
    M, N, K, R, scale,
    stride_bn, stride_br, stride_ym, stride_yn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
    GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr,
    wscale_ptr=None,    # fp8 weights' per-output-channel scale (lora_main_kernel)
):
    # Only a program's first and last piece can be partial tiles, so 2 slots per program bound
    # the workspace by the grid (≤ 2·#SMs tiles), not by tiles × segments.
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    total = (num_pid_m * num_pid_n).to(tl.int64) * k_tiles
    lo = pid.to(tl.int64) * total // P
    hi = (pid + 1).to(tl.int64) * total // P
    ob = tl.arange(0, BLOCK_M)
    on = tl.arange(0, BLOCK_N)
    orr = tl.arange(0, BLOCK_R)
    u = lo
    while u < hi:
        tile = (u // k_tiles).to(tl.int32)
        tile_lo = tile.to(tl.int64) * k_tiles
        k_lo = (u - tile_lo).to(tl.int32)
        k_hi = tl.minimum(k_tiles, (k_lo + (hi - u)).to(tl.int32))
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        acc, s = _main_loop(x_desc, w_desc, a_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, k_lo, k_hi,
                            BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_R, True, ws_ptr=wscale_ptr, N=N)
        offs_m = pid_m * BLOCK_M + ob
        offs_n = pid_n * BLOCK_N + on
        is_last = (k_lo == 0) & (k_hi == k_tiles)
        if not is_last:
            # park the partial (rows ≥ M are never read: decode M writes 1 row, not BM)
            row_ok = offs_m[:, None] < M
            p_off = ob[:, None] * BLOCK_N + on[None, :]
            q_off = ob[:, None] * BLOCK_R + orr[None, :]
            mine = (2 * pid + (u != lo).to(tl.int32)).to(tl.int64)
            tl.store(ws_ptr + mine * (BLOCK_M * BLOCK_N) + p_off, acc, mask=row_ok)
            tl.store(sws_ptr + mine * (BLOCK_M * BLOCK_R) + q_off, s, mask=row_ok)
            tl.debug_barrier()      # every thread's partial stores precede the one-thread release
            first = _streamk_owner(tile_lo, P, total)
            n_seg = (_streamk_owner(tile_lo + k_tiles - 1, P, total) - first + 1).to(tl.int32)
            ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            is_last = ticket == n_seg - 1
            if is_last:
                # segment j belongs to program q = first + j: its first piece if q starts inside
                # this tile, else its last piece; summed from zero in j order whoever arrives last
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                s = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
                for j in range(n_seg):
                    q = first + j
                    slot = 2 * q + ((q * total // P) < tile_lo).to(tl.int64)
                    acc += tl.load(ws_ptr + slot * (BLOCK_M * BLOCK_N) + p_off, mask=row_ok,
                                   other=0.0, cache_modifier=".cg")
                    s += tl.load(sws_ptr + slot * (BLOCK_M * BLOCK_R) + q_off, mask=row_ok,
                                 other=0.0, cache_modifier=".cg")
                tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")     # ready for the next launch
        if is_last:
            s = tl.where(orr[None, :] < R, s * scale, 0.0)   # padding rank slots (see main kernel)
            acc = lowrank_up(acc, s, b_ptr, stride_bn, stride_br, offs_n, N, R, BLOCK_R)
            acc = add_bias(acc, offs_n, N, bias_ptr, HAS_BIAS)
            store_tile(y_ptr, acc, offs_m, offs_n, M, N, stride_ym, stride_yn)
        u += k_hi - k_lo


# ---------------------------------------------------------------------------------------------
# SMEM ledger (the only shared-memory arithmetic of this family)
# ---------------------------------------------------------------------------------------------

def smem_ledger(config, dtype_bits: int, strategy: str, prefetch: bool = False, y_pieces: int = 0):
    """Shared memory of the main kernel a strategy launches, term by term.

    Triton 3.6 allocates one buffer per pipeline stage for every TMA load of the K loop and one
    mbarrier per stage per TMA group (KLOOP's A tile gets its own group). Buffers whose live
    ranges do not overlap share memory, so the epilogue's operand tiles (B tile ``[BR, BN]``,
    S tile ``[BM, BR]`` for the rank-sized wgmma) and the persistent kernel's S-phase pipeline
    only cost what they need *beyond* the main pipeline (the ``*_extra`` terms, usually 0).
    ``prefetch`` (``LoraOptions.prefetch``, EPI_PREFETCH): the B tile loaded before the K loop
    gets its own buffer, live across the loop (+8 KB at 16×256 in the compiled kernels; where
    only the FIXUP finisher uses it Triton may place it after the loop: the term is an upper bound).
    ``y_pieces`` (Y_TMA, ``Y_PIECES``; 0: pointer stores): Y stored by TMA from one staging buffer of a 16-bit
    ``[BM, BN / y_pieces]`` piece; the persistent kernels lay it over their pipelines (AOT: no extra bytes), flat
    over half of its flattened region (below).
    """
    from ..plan.smem import SmemLedger, SmemTerm, barrier_bytes, tile_bytes

    c = config
    st = c.num_stages
    kloop = strategy in ("kloop", "streamk")   # streamk's K loop is kloop's (X, W and A tiles)
    persistent = strategy in ("persistent_static", "persistent_dynamic")
    lowrank = strategy in ("kloop", "split", "persistent_static", "persistent_dynamic", "streamk")
    x = tile_bytes(c.block_m, c.block_k, dtype_bits)
    w = tile_bytes(c.block_n, c.block_k, dtype_bits)
    a = tile_bytes(c.block_r, c.block_k, dtype_bits)
    pipeline = st * (x + w + (a if kloop else 0))
    terms = [SmemTerm("main X tile", x, st), SmemTerm("main W tile", w, st)]
    if strategy == "flat":
        # lora_flat_kernel (sm_90, Triton 3.6, compiled over 128×256 / 128×128 / 256×128 / 64×128 tiles, 3–4
        # stages, r 16 / 64; tests/test_lora_flat.py): flattening keeps a region of 512·warps² B live beside the
        # ring (32 KiB at 8 warps, 8 KiB at 4, branch or not); the branch's S (fp32) and B tiles by TMA take what
        # they need beyond that region (0 at r16 on 8 warps; an upper bound elsewhere, by up to 16 KiB)
        region = 512 * c.num_warps ** 2
        sb = tile_bytes(c.block_m, c.block_r, 32) + tile_bytes(c.block_n, c.block_r, dtype_bits)
        terms += [SmemTerm("flattened loop's region", region), SmemTerm("epilogue S/B TMA tiles extra",
                                                                         max(0, sb - region)),
                  SmemTerm("S-task pipeline extra", max(0, st * (x + a) - pipeline)),
                  SmemTerm("TMA barriers", barrier_bytes(1), st + 2)]
        if y_pieces:
            # pointer stores stage Y through a conversion scratch inside that region; the TMA piece replaces it and
            # takes what it needs beyond 256·warps² B (exact over the ledger test's eight configs in 1, 2 and 4
            # pieces at 64×128 / 128×128 on 4 warps and 256×128 on 8; at 128×256 an upper bound by up to 8 KiB)
            piece = tile_bytes(c.block_m, c.block_n // y_pieces, 16)
            terms.append(SmemTerm("Y staging piece beyond half the region", max(0, piece - region // 2)))
        return SmemLedger(tuple(terms), label=f"lora flat {c.block_m}x{c.block_n}x{c.block_k} r{c.block_r}")
    if kloop:
        terms.append(SmemTerm("lowrank A tile", a, st))
    if persistent:
        s_phase = st * (x + a)
        terms.append(SmemTerm("S-phase pipeline extra", max(0, s_phase - pipeline)))
        # Triton 3.6 software-pipelines the epilogue's rank-chunk loop (_lowrank_from_buffer) with the kernel's
        # num_stages, so S gets st − 1 fp32 [BM, BR] buffers and B st [BR, BN] ones (cp.async). They share memory
        # with both K pipelines (disjoint live ranges) but not with each other, so at BR=64 they outgrow them:
        # 256x128 r64 4 stages compiles to 256 KiB against a 192 KiB main pipeline (session 16: the launch failed
        # with OutOfResources on the H200 after this ledger, which then shared them like the other kernels'
        # epilogue tiles, let it through). ``epi_stages`` sets that depth instead (1: one S and one B buffer).
        es = c.epi_stages or st
        epi = (max(1, es - 1) * tile_bytes(c.block_m, c.block_r, 32)
               + es * tile_bytes(c.block_r, c.block_n, dtype_bits))
        terms.append(SmemTerm("epilogue S/B buffers extra", max(0, epi - max(pipeline, s_phase))))
    elif lowrank and (c.split_k == 1 or c.split_mode == "fixup"):   # epilogue in this kernel
        epi = tile_bytes(c.block_r, c.block_n, dtype_bits) + tile_bytes(c.block_m, c.block_r, dtype_bits)
        terms.append(SmemTerm("epilogue B/S tiles extra", max(0, epi - pipeline)))
    if prefetch and lowrank and not persistent and strategy != "streamk":
        terms.append(SmemTerm("prefetched B tile", tile_bytes(c.block_r, c.block_n, dtype_bits)))
    terms.append(SmemTerm("TMA barriers", barrier_bytes(2 if kloop else 1), st))
    return SmemLedger(tuple(terms), label=f"lora {strategy} {c.block_m}x{c.block_n}x{c.block_k} r{c.block_r}")
