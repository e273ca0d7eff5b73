"""Fused multi-LoRA GEMM: ``y[m] = x[m]·Wᵀ + scale[l]·(x[m]·A[l]ᵀ)·B[l]ᵀ + bias`` with ``l = ids[m]``.

Two launches, one pass over W and Y:

1. **shrink** (``_mlora_shrink_kernel``): ``S[m] = x[m]·A[ids[m]]ᵀ`` into an fp32 workspace
   ``[SPLIT_S, M, BLOCK_R]``. S depends on the row only, so it is computed once, not once per
   N-tile. A program owns (row block, j-th distinct adapter of that block, 16-wide rank slice,
   K slice): each (block, adapter) pair reads its A slice once, every row is written by exactly one
   program per K slice (no atomics), and the K slices are summed in a fixed order by the consumer.
2. **main** (``_mlora_main_kernel``): the base GEMM (W through TMA, ``wgmma``), then an epilogue
   that sums the S slices, applies ``scale[l]`` per row and loops over the *distinct* adapters of the
   tile: ``acc += where(ids == l, S, 0)·B[l, n_tile, :rank_l]ᵀ`` through the shared
   :func:`~lowrank_gemm.kernels.epilogue.lowrank_up`. Each distinct adapter's B tile is read once
   per N-tile, W once.

With ``pdl`` (programmatic dependent launch, off by default until measured) the two launches
overlap: the shrink lets the main kernel start at once, and the main kernel runs its whole base
K loop (x, W: nothing the shrink writes) before ``griddepcontrol.wait``; S and every global write
come after it. The shrink itself keeps an ordinary launch, so everything before it (the id sort of
segment mode included) has finished when the main kernel starts: both modes overlap the whole loop.

Modes: ``gather`` keeps rows in place (ids unsorted); ``segment`` walks rows through a permutation
sorting them by adapter (``row_order``, computed on device with ``torch.sort``, no host sync), so a
tile holds few distinct adapters and B is read ~once overall. Nothing is permuted in memory: x is
gathered and y scattered through the permutation.

Safety: ids outside ``[0, L)`` (including −1) mean "base only" inside the kernels, and ranks are
clamped to ``[0, r_max]``, so a bad id or rank can never read out of bounds. Host-side value checks
(ids range, ranks ≤ r_max) need a device sync: they run only when ``validate`` is true, which by
default means "not inside CUDA-graph capture and not compiling".

Rows with id −1 get exactly the base product: the masked low-rank terms add exact zeros.

A caller that knows the batch holds one adapter (M ≤ 256), or two to four of a rank-16/32 bank (M ≤ 64), gets the
single-adapter LoRA kernels on the bank instead (:func:`bank_route`, ``lora_gemm.run_bank``): bank mode picks the
adapter(s) on the device, so the same CUDA graph serves any ids.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import triton
import triton.language as tl

from lowrank_gemm.kernels.adapter_rows import (distinct as _distinct, late_adapter as _late_adapter, safe_ids as _safe_ids,
                                              stacked_b as _stacked_b)
from lowrank_gemm.kernels.epilogue import add_bias, rank_block, store_tile
from lowrank_gemm.kernels.launch import launch
from lowrank_gemm.kernels.env import env_on
from lowrank_gemm.kernels import lora_gemm as _lora_gemm
from lowrank_gemm.kernels.lora_gemm import (FP8_WEIGHTS, _act_terms, _direct_ok, _interpreting, _v2_choice, bank_plan,
                                            check_fp8_base, column_scale, run_bank, stack_plan)
from lowrank_gemm.kernels.row_quant import fp8_rows
from lowrank_gemm.kernels.tma import TMA_ALIGN
from lowrank_gemm.kernels.pdl import gdc_launch_dependents, gdc_wait, pdl_enabled, pdl_supported
from lowrank_gemm.kernels.schedule import cdiv, grouped_tile, next_pow2, num_sms
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.plan.planner import takes_wide_tiles
from lowrank_gemm.plan.smem import SmemLedger, SmemTerm, barrier_bytes, solve_stages, tile_bytes
from lowrank_gemm.plan.tuned import TUNED_DIR, table_entries, tuned_file

__all__ = ["MultiLoRAPlan", "auto_mode", "choose_plan", "heuristic_plan", "tuned_key", "TUNED_PATH", "main_ledger", "can_implement", "sort_rows",
           "multi_lora_linear", "multi_lora_gemm", "MODES",
           "EXPANDS"]

MODES = ("gather", "segment", "auto")
EXPANDS = ("epilogue", "appended", "rows")
SHRINK_RANK_BLOCK = 16      # rank slice one shrink program owns (MMA N granularity)


# ----------------------------------------------------------------------------------------------
# device helpers
# ----------------------------------------------------------------------------------------------

@triton.jit
def _block_rows(row_order_ptr, offs, M, HAS_ORDER: tl.constexpr):
    """Physical rows of a (possibly sorted) row block; invalid slots map to row M (masked)."""
    valid = offs < M
    if HAS_ORDER:
        rows = tl.load(row_order_ptr + offs, mask=valid, other=M).to(tl.int32)
    else:
        rows = offs
    return rows, valid


@triton.jit
def _stacked_slots(first, order, ids, j0, DQ: tl.constexpr, BLOCK_R: tl.constexpr):
    """Adapter slot of each row q of a stacked rank tile [DQ = D·BLOCK_R]: row q belongs to the
    (j0 + q // BLOCK_R)-th distinct adapter of the row block (−1 past the last one)."""
    jq = j0 + tl.arange(0, DQ) // BLOCK_R
    hit = first[:, None] & (order[:, None] == jq[None, :])                    # [BM, DQ]
    return tl.max(tl.where(hit, ids[:, None], -1), axis=0)                   # [DQ]


@triton.jit
def _stacked_rows(slot_q, ranks_ptr, R_MAX, DQ: tl.constexpr, BLOCK_R: tl.constexpr):
    """(rank index, live) of each stacked row: live = slot ≥ 0 and rank index < that slot's rank."""
    rr = tl.arange(0, DQ) % BLOCK_R
    rank = tl.load(ranks_ptr + slot_q, mask=slot_q >= 0, other=0)
    rank = tl.minimum(tl.maximum(rank, 0), R_MAX)
    return rr, (slot_q >= 0) & (rr < rank)


@triton.jit
def _stacked_up(acc, s, ids, slot_q, live_q, rr, b_ptr, stride_bl, stride_bn, stride_br, offs_n, N):
    """acc [BM, BN] += where(ids == slot_q, s, 0) [BM, DQ] · B_stack [DQ, BN]: D adapters' B tiles
    in ONE gathered load and ONE MMA (instead of D dependent load → MMA round trips)."""
    s_x = tl.where((ids[:, None] == slot_q[None, :]) & live_q[None, :], s, 0.0)
    b_rows = b_ptr + slot_q.to(tl.int64) * stride_bl + rr * stride_br
    b_t = tl.load(b_rows[:, None] + offs_n[None, :] * stride_bn,
                  mask=live_q[:, None] & (offs_n[None, :] < N), other=0.0)        # [DQ, BN]
    return tl.dot(s_x.to(b_t.dtype), b_t, acc)


@triton.jit
def _scaled_s(rows, has, ids, s_ptr, stride_ss, stride_sm, SPLIT_S, scales_ptr,
              BM: tl.constexpr, BLOCK_R: tl.constexpr, DQ: tl.constexpr, S_SLICES: tl.constexpr = 0):
    """scale[ids]·S[rows] [BM, DQ]: the shrink workspace summed over its K slices in order, its
    columns repeated DQ / BLOCK_R times to line up with a stacked B tile; 0 where not ``has``.

    S_SLICES == 0: a runtime loop over SPLIT_S slices — each iteration's add waits for its load, so
    the slices cost SPLIT_S dependent L2 round trips (17 at M=16) on the program's tail.
    S_SLICES > 0 (host-set to SPLIT_S, plan ``s_unroll``): the same sum, same order, unrolled, so the
    loads are independent and in flight together: one round trip. Bit-identical to the loop."""
    offs_q = tl.arange(0, DQ)
    s_ptrs = s_ptr + rows[:, None].to(tl.int64) * stride_sm + (offs_q % BLOCK_R)[None, :]
    s = tl.zeros((BM, DQ), tl.float32)
    if S_SLICES > 0:
        for sp in tl.static_range(S_SLICES):
            s += tl.load(s_ptrs + sp * stride_ss, mask=has[:, None], other=0.0)
    else:
        for sp in range(0, SPLIT_S):
            s += tl.load(s_ptrs + sp * stride_ss, mask=has[:, None], other=0.0)
    scale = tl.load(scales_ptr + ids, mask=has, other=0.0).to(tl.float32)
    return s * scale[:, None]


@triton.jit
def multi_lowrank_up(acc, rows, valid, ids, s_ptr, stride_ss, stride_sm, SPLIT_S, scales_ptr,
                     b_ptr, stride_bl, stride_bn, stride_br, ranks_ptr, R_MAX, offs_n, N,
                     BM: tl.constexpr, BLOCK_R: tl.constexpr, EPI_D: tl.constexpr, S_SLICES: tl.constexpr = 0):
    """acc [BM, BN] += scale[ids]·S[rows]·B[ids, offs_n, :rank]ᵀ, EPI_D distinct adapters per MMA.

    S is the shrink workspace [SPLIT_S, M, BLOCK_R] (fp32), summed over its K slices in order and
    read with its columns repeated EPI_D times (so it lines up with the stacked B tile); rows whose
    id is −1 keep acc bit for bit (their S is masked out of every MMA).
    """
    DQ: tl.constexpr = EPI_D * BLOCK_R
    has = valid & (ids >= 0)
    s = _scaled_s(rows, has, ids, s_ptr, stride_ss, stride_sm, SPLIT_S, scales_ptr, BM, BLOCK_R, DQ, S_SLICES)
    first, order, count = _distinct(ids, BM)
    for j0 in range(0, count, EPI_D):
        slot_q = _stacked_slots(first, order, ids, j0, DQ, BLOCK_R)
        rr, live_q = _stacked_rows(slot_q, ranks_ptr, R_MAX, DQ, BLOCK_R)
        acc = _stacked_up(acc, s, ids, slot_q, live_q, rr, b_ptr, stride_bl, stride_bn, stride_br, offs_n, N)
    return acc


@triton.jit
def _group_rows(first, order, ids, rank_row, j0, DQ: tl.constexpr, BLOCK_R: tl.constexpr):
    """(slot, rank index, live) of each stacked row of adapter group j0 — no memory access: the
    rank comes from the per-row ranks loaded once before the loop (same reduction as the slot), so
    the only load left in a group step is its B tile."""
    jq = j0 + tl.arange(0, DQ) // BLOCK_R
    hit = first[:, None] & (order[:, None] == jq[None, :])                    # [BM, DQ]
    slot_q = tl.max(tl.where(hit, ids[:, None], -1), axis=0)
    rank_q = tl.max(tl.where(hit, rank_row[:, None], 0), axis=0)
    rr = tl.arange(0, DQ) % BLOCK_R
    return slot_q, rr, (slot_q >= 0) & (rr < rank_q)


@triton.jit
def multi_lowrank_up_pipe(acc, rows, valid, ids, s_ptr, stride_ss, stride_sm, SPLIT_S, scales_ptr,
                          b_ptr, stride_bl, stride_bn, stride_br, ranks_ptr, R_MAX, offs_n, N,
                          BM: tl.constexpr, BLOCK_R: tl.constexpr, EPI_D: tl.constexpr,
                          EPI_PIPE: tl.constexpr, B_VEC: tl.constexpr, S_SLICES: tl.constexpr = 0):
    """:func:`multi_lowrank_up` with the group loop's load latency hidden (plan candidate).

    EPI_PIPE == 1: manual double buffer — group g+1's B tile is loaded (into registers) before
    group g's MMA, so one load latency per tile instead of one per group. EPI_PIPE ≥ 2: the
    compiler's software pipeliner (``tl.range(num_stages=EPI_PIPE)``, cp.async into an SMEM ring
    of EPI_PIPE B tiles; the sm_90 PTX shows the extra cp.async only with B_VEC — the 2-B gather is
    not pipelined). EPI_PIPE 0: the plain loop (with B_VEC's vector loads).
    Both read ranks once per row up front instead of once per group (a dependent load per step).
    Same sums, same order as :func:`multi_lowrank_up`: −1 rows keep acc bit for bit.
    """
    DQ: tl.constexpr = EPI_D * BLOCK_R
    has = valid & (ids >= 0)
    s = _scaled_s(rows, has, ids, s_ptr, stride_ss, stride_sm, SPLIT_S, scales_ptr, BM, BLOCK_R, DQ, S_SLICES)
    rank_row = tl.load(ranks_ptr + ids, mask=has, other=0)
    rank_row = tl.minimum(tl.maximum(rank_row, 0), R_MAX)
    first, order, count = _distinct(ids, BM)
    if EPI_PIPE == 1:
        slot_q, rr, live_q = _group_rows(first, order, ids, rank_row, 0, DQ, BLOCK_R)
        b_t = _stacked_b(slot_q, rr, live_q, b_ptr, stride_bl, stride_bn, stride_br, offs_n, N, BLOCK_R, B_VEC)
        for j0 in range(0, count, EPI_D):
            # next group first (past the last group every row is dead: a fully masked load, no traffic)
            slot_n, rr_n, live_n = _group_rows(first, order, ids, rank_row, j0 + EPI_D, DQ, BLOCK_R)
            b_n = _stacked_b(slot_n, rr_n, live_n, b_ptr, stride_bl, stride_bn, stride_br, offs_n, N,
                           BLOCK_R, B_VEC)
            s_x = tl.where((ids[:, None] == slot_q[None, :]) & live_q[None, :], s, 0.0)
            acc = tl.dot(s_x.to(b_t.dtype), b_t, acc)
            slot_q = slot_n
            live_q = live_n
            b_t = b_n
    else:
        # EPI_PIPE 0 (B_VEC alone): stages=1 keeps the pipeliner off this loop, as in multi_lowrank_up
        for j0 in tl.range(0, count, EPI_D, num_stages=max(EPI_PIPE, 1)):
            slot_q, rr, live_q = _group_rows(first, order, ids, rank_row, j0, DQ, BLOCK_R)
            b_t = _stacked_b(slot_q, rr, live_q, b_ptr, stride_bl, stride_bn, stride_br, offs_n, N,
                           BLOCK_R, B_VEC)
            s_x = tl.where((ids[:, None] == slot_q[None, :]) & live_q[None, :], s, 0.0)
            acc = tl.dot(s_x.to(b_t.dtype), b_t, acc)
    return acc


@triton.jit
def _appended_step(acc, s, s_op, ids, cur, rank, b_ptr, b_desc, stride_bl, stride_bn, stride_br, offs_n, n0, N,
                   BN: tl.constexpr, BLOCK_R: tl.constexpr, B_TMA: tl.constexpr, B_MASK: tl.constexpr,
                   ROW_SELECT: tl.constexpr):
    """One appended K step: acc += (S ⊙ [ids == cur]) · B[cur, n-tile, :rank]ᵀ (see appended_expand)."""
    rr = tl.arange(0, BLOCK_R)
    if B_TMA:
        b = b_desc.load([cur, n0, 0]).reshape(BN, BLOCK_R)
        if B_MASK:
            b = tl.where(rr[None, :] < rank, b, 0.0)
    else:
        # fallback (bank_b not TMA-legal): per-element rank mask, 2-B loads
        b = tl.load(b_ptr + cur.to(tl.int64) * stride_bl + offs_n[:, None] * stride_bn + rr[None, :] * stride_br,
                    mask=(offs_n[:, None] < N) & (rr[None, :] < rank), other=0.0)
    if ROW_SELECT:
        # whole S tile as the (loop-invariant) A operand, the adapter's rows picked on the fp32
        # result in the accumulator layout: no per-step A-operand relayout through SMEM
        part = tl.dot(s_op, tl.trans(b))
        acc = tl.where((ids == cur)[:, None], acc + part, acc)
    else:
        s_x = tl.where((ids == cur)[:, None], s, 0.0)
        acc = tl.dot(s_x.to(b.dtype), tl.trans(b), acc)
    return acc


@triton.jit
def appended_expand(acc, rows, valid, ids, slot, pid_k, lst_ptr, s_ptr, stride_ss, stride_sm, SPLIT_S,
                    scales_ptr, b_ptr, b_desc, stride_bl, stride_bn, stride_br, ranks_ptr, R_MAX, offs_n, n0, N,
                    BM: tl.constexpr, BN: tl.constexpr, BLOCK_R: tl.constexpr, SPLIT_K: tl.constexpr,
                    STAGES: tl.constexpr, B_TMA: tl.constexpr, B_MASK: tl.constexpr, ROW_SELECT: tl.constexpr,
                    APPEND_D: tl.constexpr = 1, B_VEC: tl.constexpr = False, S_SLICES: tl.constexpr = 0):
    """acc [BM, BN] += Σ_a (scale·S ⊙ rowmask_a) [BM, BLOCK_R] · B[a, n-tile, :]ᵀ as extra K steps.

    One step per distinct adapter a of the row block (split pid_k takes every SPLIT_K-th one), run
    as its own software-pipelined loop (``STAGES`` deep): the B tile [BN, BLOCK_R] streams in through
    TMA (``b_desc``: bank_b viewed [L, N, R_MAX], box [1, BN, BLOCK_R], rows past N and columns past
    R_MAX zero-filled, so nothing leaks from the next adapter) or 16-B cp.async, so step j+STAGES-1's
    load overlaps step j's MMA instead of one exposed DRAM latency per adapter. The wgmma A operand
    (S with other adapters' rows zeroed) is built in registers from the S tile loaded once.
    The step's adapter id and rank come from a per-program list [2, BM] int32 (``lst_ptr`` + slot)
    written here from the row block's first-occurrence marks: a scalar load per step that depends on
    j only (the pipeliner can issue it ahead), instead of a [BM] cross-warp reduction per step.
    B_MASK (TMA path) zeroes B's columns past each adapter's rank in registers (they may hold garbage,
    even NaN); a caller whose bank is zero-padded (``AdapterBank``) may skip it, so wgmma reads the
    TMA tile straight from SMEM. Rows with id −1 see exact zeros.
    APPEND_D > 1 (round-2 candidate): APPEND_D distinct adapters stacked into one fatter step
    (K = APPEND_D·BLOCK_R). sm_90 PTX of the D=1 loop: ~3 bar.sync, an A relayout through SMEM
    (st.shared → bar.sync → ldmatrix) and a wgmma.wait_group 0 per adapter; D separate steps per
    iteration keep all of that per adapter, a stacked step pays it once per APPEND_D adapters.
    B comes by pointer gather (TMA boxes cannot be stacked: the adapters are not adjacent slots).
    """
    has = valid & (ids >= 0)
    s = _scaled_s(rows, has, ids, s_ptr, stride_ss, stride_sm, SPLIT_S, scales_ptr, BM, BLOCK_R, BLOCK_R, S_SLICES)
    first, order, count = _distinct(ids, BM)
    rank_row = tl.load(ranks_ptr + ids, mask=has, other=0)
    rank_row = tl.minimum(tl.maximum(rank_row, 0), R_MAX)
    lst = lst_ptr + slot.to(tl.int64) * (2 * BM)
    tl.store(lst + order, ids, mask=first)
    tl.store(lst + BM + order, rank_row, mask=first)
    tl.debug_barrier()      # the list is read back by other threads of this program
    s_op = s.to(b_ptr.dtype.element_ty)
    if APPEND_D == 1:
        for j in tl.range(pid_k, count, SPLIT_K, num_stages=STAGES):
            cur = tl.load(lst + j)
            rank = tl.load(lst + BM + j)
            acc = _appended_step(acc, s, s_op, ids, cur, rank, b_ptr, b_desc, stride_bl, stride_bn, stride_br,
                                 offs_n, n0, N, BN, BLOCK_R, B_TMA, B_MASK, ROW_SELECT)
    else:
        # stacked: APPEND_D adapters' B tiles gathered into ONE [BN, APPEND_D·BLOCK_R] operand (16-B
        # cp.async runs, pipelined into an SMEM ring), S repeated APPEND_D times along K and masked
        # block-diagonally: one A relayout, one MMA chain and one wgmma wait per APPEND_D adapters
        DQ: tl.constexpr = APPEND_D * BLOCK_R
        s_rep = _scaled_s(rows, has, ids, s_ptr, stride_ss, stride_sm, SPLIT_S, scales_ptr, BM, BLOCK_R, DQ,
                          S_SLICES)
        qa = tl.arange(0, DQ) // BLOCK_R
        qr = tl.arange(0, DQ) % BLOCK_R
        nmask = offs_n[:, None] < N
        for j in tl.range(pid_k * APPEND_D, count, SPLIT_K * APPEND_D, num_stages=STAGES):
            jq = j + qa
            live_q = jq < count
            cur_q = tl.load(lst + jq, mask=live_q, other=-2)            # −2: matches no row
            rank_q = tl.load(lst + BM + jq, mask=live_q, other=0)
            if B_VEC:
                # host-checked: unit rank stride, R_MAX == BLOCK_R, 16-B aligned adapter/row strides:
                # each BLOCK_R run is one adapter's contiguous rank vector → masked as a whole
                q_off = tl.max_contiguous(tl.multiple_of(cur_q.to(tl.int64) * stride_bl + qr, 8), BLOCK_R)
                has_q = tl.max_constancy(live_q, BLOCK_R)
                b = tl.load(b_ptr + q_off[None, :] + offs_n[:, None] * stride_bn, mask=nmask & has_q[None, :],
                            other=0.0)
                if B_MASK:
                    b = tl.where((qr < rank_q)[None, :], b, 0.0)
            else:
                q_off = cur_q.to(tl.int64) * stride_bl + qr * stride_br
                b = tl.load(b_ptr + q_off[None, :] + offs_n[:, None] * stride_bn,
                            mask=nmask & (live_q & (qr < rank_q))[None, :], other=0.0)
            s_x = tl.where(ids[:, None] == cur_q[None, :], s_rep, 0.0)
            acc = tl.dot(s_x.to(b.dtype), tl.trans(b), acc)
    return acc


@triton.jit
def rows_expand(part_ptr, pid_m, pid_k, row_order_ptr, ids_ptr, M, L, s_ptr, stride_ss, stride_sm, SPLIT_S,
                scales_ptr, b_ptr, stride_bl, stride_bn, stride_br, ranks_ptr, R_MAX, n0, N,
                BM: tl.constexpr, BN: tl.constexpr, BLOCK_R: tl.constexpr, SPLIT_K: tl.constexpr,
                RC: tl.constexpr, HAS_ORDER: tl.constexpr, B_MASK: tl.constexpr, B_VEC: tl.constexpr,
                S_SLICES: tl.constexpr = 0):
    """part [BM, BN] (fp32, this program's parked tile) += scale·S[row]·B[id(row), n-tile, :rank]ᵀ, row by row on
    the CUDA cores: the ``expand="rows"`` plan (session 27).

    Why: the appended expand runs one MMA step per *distinct adapter* of the tile, and each step is a chain
    (B tile wait → A relayout → wgmma → wait); with as many adapters as rows (64 adapters at M = 64) that chain
    is the program's tail. Here every row gathers its own adapter's B slice [BN, BLOCK_R] (contiguous in the bank:
    16-B vector loads) and reduces it against its S row in registers: no MMA, no barrier, and every load of a
    chunk of RC rows is independent of the others, so one memory latency per chunk instead of one per adapter.
    It reads B once per *row* (an adapter's rows in one tile reread it from L1/L2), the price where adapters
    repeat. Chunk c of the tile's BM / RC chunks belongs to split program c mod SPLIT_K: every row's branch is
    added to exactly one split's partial, so the split-K sum adds it once, in a fixed order (no atomics).
    S is rounded to B's dtype before the product, as in the MMA expands. Rows with id −1, or past M, add exact
    zeros. B_MASK masks B's columns past each row's rank (they may hold garbage, even NaN); without it
    (zero-padded bank) B_VEC (host-checked: r_max == BLOCK_R, unit rank stride) drops the column mask entirely.
    """
    rr = tl.arange(0, BLOCK_R)
    cn = tl.arange(0, BN)
    offs_n = n0 + cn
    nmask = offs_n < N
    for c in range(pid_k, BM // RC, SPLIT_K):
        q = c * RC + tl.arange(0, RC)
        rows, valid = _block_rows(row_order_ptr, pid_m * BM + q, M, HAS_ORDER)
        ids = _safe_ids(ids_ptr, rows, valid, L)
        has = valid & (ids >= 0)
        rank = tl.load(ranks_ptr + ids, mask=has, other=0)
        rank = tl.minimum(tl.maximum(rank, 0), R_MAX)
        live = has[:, None] & (rr[None, :] < rank[:, None])                      # [RC, BLOCK_R]
        s = _scaled_s(rows, has, ids, s_ptr, stride_ss, stride_sm, SPLIT_S, scales_ptr, RC, BLOCK_R, BLOCK_R, S_SLICES)
        s = tl.where(live, s, 0.0).to(b_ptr.dtype.element_ty).to(tl.float32)
        b_ptrs = (b_ptr + ids.to(tl.int64)[:, None, None] * stride_bl + offs_n[None, :, None] * stride_bn
                  + rr[None, None, :] * stride_br)
        if B_MASK:
            bmask = live[:, None, :] & nmask[None, :, None]
        elif B_VEC:
            bmask = has[:, None, None] & nmask[None, :, None]
        else:
            bmask = has[:, None, None] & nmask[None, :, None] & (rr < R_MAX)[None, None, :]
        b = tl.load(b_ptrs, mask=bmask, other=0.0)                                 # [RC, BN, BLOCK_R]
        delta = tl.sum(b.to(tl.float32) * s[:, None, :], axis=2)                   # [RC, BN]
        pp = part_ptr + q[:, None] * BN + cn[None, :]
        tl.store(pp, tl.load(pp) + delta)


# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------

@triton.jit
def _mlora_shrink_kernel(
        x_ptr,          # (M, K)
        a_ptr,          # (L, R_MAX, K)
        ids_ptr,        # (M,) int32
        row_order_ptr,  # (M,) int32 or dummy
        ranks_ptr,      # (L,) int32
        s_ptr,          # (SPLIT_S, M, BLOCK_R) fp32, out
        M, K, L, R_MAX, K_PER_SPLIT,
        stride_xm, stride_xk, stride_al, stride_ar, stride_ak, stride_ss, stride_sm,
        MAX_DISTINCT: tl.constexpr, NUM_RB: tl.constexpr, SPLIT_S: tl.constexpr,
        BM: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, HAS_ORDER: tl.constexpr,
        PDL: tl.constexpr = False):
    if PDL:
        # the main kernel may start now: its K loop reads nothing this kernel writes, and it waits
        # for this whole grid before it reads S. The wait is a no-op as launched (without the PDL
        # attribute, see multi_lora_gemm); it keeps this kernel correct if it ever is.
        gdc_launch_dependents()
        gdc_wait()
    pid = tl.program_id(0)
    split = pid % SPLIT_S
    t = pid // SPLIT_S
    rb = t % NUM_RB
    t = t // NUM_RB
    j = t % MAX_DISTINCT
    mb = t // MAX_DISTINCT

    rows, valid = _block_rows(row_order_ptr, mb * BM + tl.arange(0, BM), M, HAS_ORDER)
    ids = _safe_ids(ids_ptr, rows, valid, L)
    first, order, count = _distinct(ids, BM)
    cur = tl.max(tl.where(first & (order == j), ids, -1), axis=0)
    if cur >= 0:
        rank = tl.minimum(tl.maximum(tl.load(ranks_ptr + cur), 0), R_MAX)
        sel = ids == cur
        offs_r = rb * BR + tl.arange(0, BR)
        k_lo = split * K_PER_SPLIT
        k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
        x_ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_xm
        a_ptrs = a_ptr + cur.to(tl.int64) * stride_al + offs_r[:, None] * stride_ar
        acc = tl.zeros((BM, BR), tl.float32)
        for k in range(k_lo, k_hi, BK):
            offs_k = k + tl.arange(0, BK)
            kin = offs_k < k_hi
            xt = tl.load(x_ptrs + offs_k[None, :] * stride_xk, mask=sel[:, None] & kin[None, :], other=0.0)
            at = tl.load(a_ptrs + offs_k[None, :] * stride_ak,
                         mask=(offs_r[:, None] < rank) & kin[None, :], other=0.0)
            acc = tl.dot(xt, at.T, acc)
        tl.store(s_ptr + split * stride_ss + rows[:, None].to(tl.int64) * stride_sm + offs_r[None, :],
                 acc, mask=sel[:, None])


@triton.jit
def _mlora_shrink_rows_kernel(
        x_ptr,          # (M, K)
        a_ptr,          # (L, R_MAX, K)
        ids_ptr,        # (M,) int32
        ranks_ptr,      # (L,) int32
        s_ptr,          # (SPLIT_S, M, BLOCK_R) fp32, out
        M, K, L, R_MAX, K_PER_SPLIT,
        stride_xm, stride_xk, stride_al, stride_ar, stride_ak, stride_ss, stride_sm,
        SPLIT_S: tl.constexpr, BLOCK_R: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False):
    """The shrink by row (plan ``shrink_rows``, session 27): one program per (row, K slice) computes
    S[slice, row] = x[row]·A[id(row)]ᵀ over its slice on the CUDA cores, as the BGMV baseline does. The block shrink
    (:func:`_mlora_shrink_kernel`) launches a program per (16-row block, j-th distinct adapter of the block): with
    as many adapters as rows most of those are empty, and every live one first reduces its block's distinct ids and
    then runs a chain of dependent K steps for one or two live rows (ncu, M = 256, 64 adapters: 13.9 µs, off the
    main kernel's overlap). Rows with id −1 write nothing (the main kernel masks their S)."""
    if PDL:
        gdc_launch_dependents()      # as _mlora_shrink_kernel
        gdc_wait()
    pid = tl.program_id(0)
    split = pid % SPLIT_S
    m = pid // SPLIT_S
    lid = tl.load(ids_ptr + m).to(tl.int32)
    if (lid >= 0) & (lid < L):
        rank = tl.minimum(tl.maximum(tl.load(ranks_ptr + lid), 0), R_MAX)
        offs_r = tl.arange(0, BLOCK_R)
        k_lo = split * K_PER_SPLIT
        k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
        a_rows = a_ptr + lid.to(tl.int64) * stride_al + offs_r[:, None] * stride_ar
        acc = tl.zeros((BLOCK_R, BK), tl.float32)
        for k in range(k_lo, k_hi, BK):
            offs_k = k + tl.arange(0, BK)
            kin = offs_k < k_hi
            xv = tl.load(x_ptr + m.to(tl.int64) * stride_xm + offs_k * stride_xk, mask=kin, other=0.0)
            at = tl.load(a_rows + offs_k[None, :] * stride_ak, mask=(offs_r[:, None] < rank) & kin[None, :], other=0.0)
            acc += at.to(tl.float32) * xv.to(tl.float32)[None, :]
        tl.store(s_ptr + split * stride_ss + m.to(tl.int64) * stride_sm + offs_r, tl.sum(acc, axis=1))


@triton.jit
def _mlora_main_kernel(
        x_ptr,          # (M, K)
        x_desc,         # (M, K) TensorDescriptor, block [BM, BK] when X_TMA (else a dummy pointer)
        w_desc,         # (N, K) TensorDescriptor, block [BN, BK]  (or raw pointer when not USE_TMA)
        y_ptr,          # (M, N), out
        bias_ptr,       # (N,) or dummy
        ids_ptr,        # (M,) int32
        row_order_ptr,  # (M,) int32 or dummy
        s_ptr,          # (SPLIT_S, M, BLOCK_R) fp32 from the shrink kernel (FUSE_D == 0)
        scales_ptr,     # (L,) fp32
        a_ptr,          # (L, R_MAX, K)                            (FUSE_D > 0)
        b_ptr,          # (L, N, R_MAX)
        ranks_ptr,      # (L,) int32
        ws_ptr,         # (tiles, SPLIT_K, BM, BN) fp32 split-K partials              (SPLIT_K > 1)
        sws_ptr,        # (tiles, SPLIT_K, BM, FUSE_D·BLOCK_R) fp32 S partials (SPLIT_K > 1, FUSE_D > 0)
        cnt_ptr,        # (tiles,) int32 arrival tickets, zero on entry, left zero on exit (SPLIT_K > 1)
        b_desc,         # (L, N, R_MAX) TensorDescriptor, block [1, BN, BLOCK_R] (APPEND and B_TMA; else dummy)
        lst_ptr,        # (tiles·SPLIT_K, 2, BM) int32 scratch: distinct adapters + ranks (APPEND)
        wscale_ptr,     # (N,) fp32: an fp8 W's per-output-channel scale              (W_SCALE)
        xscale_ptr,     # (M,) fp32: the fp8 x's per-token scale                      (X_TERMS > 0)
        M, N, K, L, R_MAX, SPLIT_S,
        stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
        stride_ss, stride_sm, stride_al, stride_ar, stride_ak, stride_bl, stride_bn, stride_br,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BLOCK_R: tl.constexpr,
        GROUP_M: tl.constexpr, HAS_ORDER: tl.constexpr, HAS_LORA: tl.constexpr,
        HAS_BIAS: tl.constexpr, USE_TMA: tl.constexpr, X_TMA: tl.constexpr = False,
        FUSE_D: tl.constexpr = 0, EPI_D: tl.constexpr = 1, SPLIT_K: tl.constexpr = 1,
        EPI_PIPE: tl.constexpr = 0, B_VEC: tl.constexpr = False, APPEND: tl.constexpr = False,
        APPEND_STAGES: tl.constexpr = 3, B_TMA: tl.constexpr = False, B_MASK: tl.constexpr = True,
        ROW_SELECT: tl.constexpr = False, APPEND_D: tl.constexpr = 1, S_SLICES: tl.constexpr = 0,
        PDL: tl.constexpr = False, SWAP_AB: tl.constexpr = False, ROWS: tl.constexpr = False,
        ROWS_RC: tl.constexpr = 16,       # ROWS_RC: host-capped (rows_chunk), ≤ BM
        W_SCALE: tl.constexpr = False, X_TERMS: tl.constexpr = 0):
    # W_SCALE: W is fp8 (its tiles widened to x's dtype in registers unless x is fp8 too), scaled per column after
    # the K loop, before any low-rank term joins the accumulator. X_TERMS 1 / 2: x_ptr / x_desc hold x's e4m3 codes
    # (2: the residual's as rows M … 2M − 1, on the same row scale; row_quant.fp8_rows) and the shrink reads the
    # 16-bit x; the row scale joins after the K loop.
    FUSED: tl.constexpr = HAS_LORA and FUSE_D > 0
    tl.static_assert(not (FUSED and X_TERMS > 0), "fp8 x: the fused shrink would read the codes (plan fuse_d = 0)")
    tl.static_assert(not (SWAP_AB and FUSED), "swap_ab: the fused shrink's MMA has BM rows (plan fuse_d = 0)")
    APPENDED: tl.constexpr = HAS_LORA and APPEND and FUSE_D == 0
    ROWS_EXP: tl.constexpr = HAS_LORA and ROWS and FUSE_D == 0 and not APPENDED
    DQ: tl.constexpr = max(FUSE_D, 1) * BLOCK_R
    tile = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)

    rows, valid = _block_rows(row_order_ptr, pid_m * BM + tl.arange(0, BM), M, HAS_ORDER)
    offs_n = pid_n * BN + tl.arange(0, BN)
    x_ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_xm
    ids = _safe_ids(ids_ptr, rows, valid, L)
    per_split = tl.cdiv(tl.cdiv(K, BK), SPLIT_K) * BK
    k_lo = pid_k * per_split
    k_hi = tl.minimum(k_lo + per_split, K)

    # SWAP_AB (decode-sized M, the LoRA kernel's KernelConfig.swap_ab): accᵀ [BN, BM] = W·Xᵀ, weight rows on
    # the wgmma's M and the BM tokens on its N; transposed back once after the loop
    acc = tl.zeros((BN, BM) if SWAP_AB else (BM, BN), tl.float32)
    LO_ACC: tl.constexpr = X_TERMS == 2 and SWAP_AB     # the residual's own accumulator (_lora_kernels._main_loop)
    if LO_ACC:
        acc_lo = tl.zeros((BN, BM), tl.float32)
    s_f = tl.zeros((BM, DQ), tl.float32)
    if FUSED:
        # shrink in the k-loop: the first FUSE_D distinct adapters' A rows stacked into one
        # [DQ, BK] tile per K step; S_all = X·A_stackᵀ rides along the main MMA (X already loaded)
        first, order, count = _distinct(ids, BM)
        slot_q = _stacked_slots(first, order, ids, 0, DQ, BLOCK_R)
        rr, live_q = _stacked_rows(slot_q, ranks_ptr, R_MAX, DQ, BLOCK_R)
        a_rows = a_ptr + slot_q.to(tl.int64) * stride_al + rr * stride_ar
    for k in range(k_lo, k_hi, BK):
        offs_k = k + tl.arange(0, BK)
        if X_TMA:
            xt = x_desc.load([pid_m * BM, k])
        else:
            xt = tl.load(x_ptrs + offs_k[None, :] * stride_xk, mask=valid[:, None] & (offs_k[None, :] < k_hi),
                         other=0.0)
        if USE_TMA:
            wt = w_desc.load([pid_n * BN, k])
        else:
            wt = tl.load(w_desc + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
                         mask=(offs_n[:, None] < N) & (offs_k[None, :] < k_hi), other=0.0)
        if wt.dtype != xt.dtype:
            wt = wt.to(xt.dtype)
        if SWAP_AB:
            acc = tl.dot(wt, xt.T, acc)
        else:
            acc = tl.dot(xt, wt.T, acc)
        if X_TERMS == 2:
            # the residual's codes, rows M apart, into the same accumulator (rows ≥ M of a TMA box are never stored)
            if X_TMA:
                xt = x_desc.load([pid_m * BM + M, k])
            else:
                xt = tl.load(x_ptrs + M * stride_xm + offs_k[None, :] * stride_xk,
                             mask=valid[:, None] & (offs_k[None, :] < k_hi), other=0.0)
            if LO_ACC:
                acc_lo = tl.dot(wt, xt.T, acc_lo)
            else:
                acc = tl.dot(xt, wt.T, acc)
        if FUSED:
            at = tl.load(a_rows[:, None] + offs_k[None, :] * stride_ak,
                         mask=live_q[:, None] & (offs_k[None, :] < k_hi), other=0.0)
            s_f = tl.dot(xt, at.T, s_f)
    if LO_ACC:
        acc += acc_lo
    if SWAP_AB:
        acc = tl.trans(acc)
    if W_SCALE:
        acc = acc * tl.load(wscale_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
    if X_TERMS > 0:
        acc = acc * tl.load(xscale_ptr + rows, mask=valid, other=0.0)[:, None]
    if PDL:
        # launched as the shrink's programmatic dependent: everything above read only x, W, ids and
        # the row order, none of which the shrink writes. S, and every global write (y, split-K
        # partials and tickets, the appended list), come after the shrink grid has finished.
        gdc_wait()
    if APPENDED:
        acc = appended_expand(acc, rows, valid, ids, tile * SPLIT_K + pid_k, pid_k, lst_ptr, s_ptr, stride_ss,
                              stride_sm, SPLIT_S, scales_ptr, b_ptr, b_desc, stride_bl, stride_bn, stride_br,
                              ranks_ptr, R_MAX, offs_n, pid_n * BN, N, BM, BN, BLOCK_R, SPLIT_K, APPEND_STAGES,
                              B_TMA, B_MASK, ROW_SELECT, APPEND_D, B_VEC, S_SLICES)
    # this program's fp32 partial slot in the split-K workspace (the rows expand has one at SPLIT_K = 1 too)
    ob = tl.arange(0, BM)
    slot = (tile * SPLIT_K + pid_k).to(tl.int64)
    p_ptrs = ws_ptr + ob[:, None] * BN + tl.arange(0, BN)[None, :]
    if ROWS_EXP:
        # park the tile in the slot, then add the branch of the rows this split owns to it (rows_expand); the
        # split-K sum, or the reload below, picks it up
        part = ws_ptr + slot * (BM * BN)
        tl.store(p_ptrs + slot * (BM * BN), acc)
        tl.debug_barrier()      # the rows' read-modify-write crosses threads
        rows_expand(part, pid_m, pid_k, row_order_ptr, ids_ptr, M, L, s_ptr, stride_ss, stride_sm, SPLIT_S,
                    scales_ptr, b_ptr, stride_bl, stride_bn, stride_br, ranks_ptr, R_MAX, pid_n * BN, N,
                    BM, BN, BLOCK_R, SPLIT_K, ROWS_RC, HAS_ORDER, B_MASK, B_VEC, S_SLICES)
        if SPLIT_K == 1:
            tl.debug_barrier()
            acc = tl.load(p_ptrs + slot * (BM * BN))

    if SPLIT_K > 1:
        # deterministic split-K without a second launch: every split parks its fp32 partial, the
        # last to arrive (ticket) sums all partials in split order and runs the epilogue
        if not ROWS_EXP:        # rows: parked (and its rows' branch added) above
            tl.store(p_ptrs + slot * (BM * BN), acc)
        if FUSED:
            q_ptrs = sws_ptr + ob[:, None] * DQ + tl.arange(0, DQ)[None, :]
            tl.store(q_ptrs + slot * (BM * DQ), s_f)
        tl.debug_barrier()      # all threads' partial stores precede the (one-thread) release
        ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        is_last = ticket == SPLIT_K - 1
        if is_last:
            acc = tl.zeros((BM, BN), tl.float32)
            s_f = tl.zeros((BM, DQ), tl.float32)
            for sp in tl.static_range(SPLIT_K):
                acc += tl.load(p_ptrs + (tile * SPLIT_K + sp).to(tl.int64) * (BM * BN), cache_modifier=".cg")
                if FUSED:
                    s_f += tl.load(q_ptrs + (tile * SPLIT_K + sp).to(tl.int64) * (BM * DQ), cache_modifier=".cg")
            tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")     # ready for the next launch
    else:
        is_last = True

    if is_last:
        if HAS_LORA and not APPENDED and not ROWS_EXP:
            if FUSED:
                has = valid & (ids >= 0)
                scale = tl.load(scales_ptr + ids, mask=has, other=0.0).to(tl.float32)
                acc = _stacked_up(acc, s_f * scale[:, None], ids, slot_q, live_q, rr, b_ptr, stride_bl,
                                  stride_bn, stride_br, offs_n, N)
                # more distinct adapters than fused (a wrong host hint): exact but slow fallback
                for j in range(FUSE_D, count):
                    acc = _late_adapter(acc, j, first, order, ids, x_ptrs, stride_xk, a_ptr, stride_al,
                                        stride_ar, stride_ak, b_ptr, stride_bl, stride_bn, stride_br,
                                        scales_ptr, ranks_ptr, R_MAX, offs_n, N, K, BM, BK, BLOCK_R)
            elif EPI_PIPE > 0 or B_VEC:
                acc = multi_lowrank_up_pipe(acc, rows, valid, ids, s_ptr, stride_ss, stride_sm, SPLIT_S,
                                            scales_ptr, b_ptr, stride_bl, stride_bn, stride_br, ranks_ptr, R_MAX,
                                            offs_n, N, BM, BLOCK_R, EPI_D, EPI_PIPE, B_VEC, S_SLICES)
            else:
                acc = multi_lowrank_up(acc, rows, valid, ids, s_ptr, stride_ss, stride_sm, SPLIT_S, scales_ptr,
                                       b_ptr, stride_bl, stride_bn, stride_br, ranks_ptr, R_MAX, offs_n, N,
                                       BM, BLOCK_R, EPI_D, S_SLICES)
        acc = add_bias(acc, offs_n, N, bias_ptr, HAS_BIAS)
        store_tile(y_ptr, acc, rows, offs_n, M, N, stride_ym, stride_yn)


# ----------------------------------------------------------------------------------------------
# plan: configs + SMEM ledger
# ----------------------------------------------------------------------------------------------

def _pow2_at_least(v: int, lo: int = 16) -> int:
    return max(lo, next_pow2(max(1, v)))


@dataclass(frozen=True)
class MultiLoRAPlan:
    """The launches' choices. ``main``: the GEMM tile (``split_k`` > 1: deterministic in-kernel
    split-K, the last split to arrive reduces); ``shrink``: block_m = rows per shrink block,
    block_n = rank slice, block_k = K step, split_k = K slices summed by the epilogue.
    ``fuse_d`` > 0: no shrink launch, S of the first ``fuse_d`` distinct adapters of a row block is
    accumulated in the main k-loop (more adapters stay exact through a slow fallback);
    ``epi_d``: distinct adapters per stacked epilogue MMA (shrink-workspace path);
    ``x_tma``: x tiles through TMA (gather mode only).
    Plan candidates for the shrink-workspace epilogue (unmeasured, off by default):
    ``epi_pipe``: 0 = plain group loop; 1 = next group's B loaded before the current MMA (register
    double buffer); ≥ 2 = ``tl.range(num_stages=epi_pipe)`` (compiler pipeliner, SMEM ring);
    ``b_vec``: 16-B vector loads for the B gather (applied only when bank_b's layout allows).
    ``expand``: "epilogue" (the loops above, after the K loop) or "appended" (candidate: one extra
    pipelined K step per distinct adapter, B tiles through a TMA ring ``append_stages`` deep, adapters
    shared out over the split-K programs; see :func:`appended_expand`); ``append_rowsel``: whole-S
    MMA per step with the adapter's rows selected on the fp32 result (no per-step A relayout);
    ``append_d`` (round-2 candidate, 1/2/4): adapters per pipelined appended iteration.
    ``shrink_rows`` (session-27 candidate): the shrink launch by row (:func:`_mlora_shrink_rows_kernel`; shrink's
    split_k K slices, block_k steps, num_warps) instead of by (row block, distinct adapter).
    ``expand="rows"`` (session-27 candidate): each row's branch on the CUDA cores, its adapter's B slice gathered
    per row, ``rows_chunk`` rows at a time, chunks dealt out over the split-K programs (:func:`rows_expand`).
    ``s_unroll`` (session-5 candidate, off until measured): the main kernel sums the shrink's K
    slices of S unrolled — all slice loads in flight at once instead of one L2 round trip per
    slice on every program's tail (:func:`_scaled_s`); bit-identical. ``main.swap_ab`` (session 6): the K
    loop's MMA is W·Xᵀ — weight rows on the wgmma's M, block_m = 16/64 tokens on its N (shrink launch only)."""

    main: KernelConfig
    shrink: KernelConfig
    use_tma: bool = True
    fuse_d: int = 0
    epi_d: int = 1
    x_tma: bool = False
    epi_pipe: int = 0
    b_vec: bool = False
    expand: str = "epilogue"
    append_stages: int = 3
    append_rowsel: bool = False
    append_d: int = 1
    s_unroll: bool = False
    rows_chunk: int = 16
    shrink_rows: bool = False

    def __post_init__(self):
        if self.expand not in EXPANDS:
            raise ValueError(f"MultiLoRAPlan.expand must be one of {EXPANDS}, got {self.expand!r}")
        if self.expand == "appended" and self.fuse_d:
            raise ValueError(f"MultiLoRAPlan: expand='appended' reads the shrink workspace, needs fuse_d=0, "
                             f"got fuse_d={self.fuse_d}")
        if self.expand == "rows" and self.fuse_d:
            raise ValueError(f"MultiLoRAPlan: expand='rows' reads the shrink workspace, needs fuse_d=0, "
                             f"got fuse_d={self.fuse_d}")
        if self.rows_chunk not in (1, 2, 4, 8, 16, 32, 64, 128):
            raise ValueError(f"MultiLoRAPlan.rows_chunk must be a power of two in [1, 128], got {self.rows_chunk}")
        if self.append_d not in (1, 2, 4):
            raise ValueError(f"MultiLoRAPlan.append_d must be 1, 2 or 4, got {self.append_d}")
        if not 1 <= self.append_stages <= 6:
            raise ValueError(f"MultiLoRAPlan.append_stages must lie in [1, 6], got {self.append_stages}")
        for name in ("fuse_d", "epi_d"):
            v = getattr(self, name)
            if v < 0 or (v and v & (v - 1)) or (name == "epi_d" and v < 1):
                raise ValueError(f"MultiLoRAPlan.{name} must be a power of two (fuse_d may be 0), got {v}")
        if not 0 <= self.epi_pipe <= 4:
            raise ValueError(f"MultiLoRAPlan.epi_pipe must lie in [0, 4], got {self.epi_pipe}")
        if (why := self.main.swap_ab_mismatch()) is not None:
            raise ValueError(f"MultiLoRAPlan.main: {why}")
        if self.main.swap_ab and self.fuse_d:
            raise ValueError(f"MultiLoRAPlan: main.swap_ab needs the shrink launch (the fused shrink's MMA has "
                             f"block_m rows): fuse_d = 0, got fuse_d={self.fuse_d}")

    def to_dict(self) -> dict:
        return {"main": self.main.to_dict(), "shrink": self.shrink.to_dict(), "use_tma": self.use_tma,
                "fuse_d": self.fuse_d, "epi_d": self.epi_d, "x_tma": self.x_tma, "epi_pipe": self.epi_pipe,
                "b_vec": self.b_vec, "expand": self.expand, "append_stages": self.append_stages,
                "append_rowsel": self.append_rowsel, "append_d": self.append_d, "s_unroll": self.s_unroll,
                "rows_chunk": self.rows_chunk, "shrink_rows": self.shrink_rows}

    @classmethod
    def from_dict(cls, d: dict) -> "MultiLoRAPlan":
        return cls(main=KernelConfig.from_dict(d["main"]), shrink=KernelConfig.from_dict(d["shrink"]),
                   **{k: d[k] for k in ("use_tma", "fuse_d", "epi_d", "x_tma", "epi_pipe", "b_vec", "expand",
                                          "append_stages", "append_rowsel", "append_d", "s_unroll", "rows_chunk",
                                          "shrink_rows")
                      if k in d})


def main_ledger(cfg: KernelConfig, elem_bits: int = 16, use_tma: bool = True, fuse_d: int = 0,
                epi_d: int = 1, epi_pipe: int = 0, b_vec: bool = False, append_stages: int = 0,
                append_d: int = 1) -> SmemLedger:
    """SMEM of the main kernel: pipelined x, W (and, fused, stacked A) tiles, TMA barriers; the
    epilogue's S and stacked-B operand tiles reuse the pipeline buffers (dead after the K loop),
    so only any excess counts. ``epi_pipe`` ≥ 2 with ``b_vec`` (the only combination the
    compiler pipelines): a ring of ``epi_pipe`` B tiles, which may also reuse the barriers' bytes
    (sm_90 ``metadata.shared`` = max(pipeline + barriers, S + ring))."""
    dq = max(fuse_d, epi_d, 1) * cfg.block_r
    pipe = [
        SmemTerm("x tile", tile_bytes(cfg.block_m, cfg.block_k, elem_bits), cfg.num_stages),
        SmemTerm("W tile", tile_bytes(cfg.block_n, cfg.block_k, elem_bits), cfg.num_stages),
    ]
    if fuse_d:
        pipe.append(SmemTerm("A stack tile", tile_bytes(fuse_d * cfg.block_r, cfg.block_k, elem_bits),
                             cfg.num_stages))
    pipe_bytes = sum(t.total(1) for t in pipe)
    ring = epi_pipe if (epi_pipe >= 2 and b_vec and not fuse_d) else 1
    epi_bytes = tile_bytes(cfg.block_m, dq, elem_bits) + ring * tile_bytes(dq, cfg.block_n, elem_bits)
    terms = list(pipe)
    if use_tma:
        terms.append(SmemTerm("W TMA barriers", barrier_bytes(1), cfg.num_stages))
    if ring > 1:
        reused = pipe_bytes + (barrier_bytes(1) * cfg.num_stages if use_tma else 0)
        terms.append(SmemTerm(f"lowrank S+{ring} B ring beyond pipeline", max(0, epi_bytes - reused)))
    elif append_stages:
        # appended expand: a ring of [BN, BLOCK_R] B tiles + their barriers + the S operand tile,
        # allocated after the K loop's buffers die (they reuse them)
        # (append_d > 1: stacked [BN, d·BLOCK_R] tiles by cp.async, no TMA barriers)
        dr = append_d * cfg.block_r
        ring_bytes = (append_stages * (tile_bytes(cfg.block_n, dr, elem_bits) + (barrier_bytes(1) if append_d == 1 else 0))
                      + tile_bytes(cfg.block_m, dr, elem_bits))
        terms.append(SmemTerm(f"appended {append_stages}-deep B ring beyond pipeline", max(0, ring_bytes - pipe_bytes)))
    else:
        terms.append(SmemTerm("lowrank S+B beyond pipeline", max(0, epi_bytes - pipe_bytes)))
    return SmemLedger(tuple(terms), label=f"multilora main {cfg.block_m}x{cfg.block_n}x{cfg.block_k}")


def can_implement(cfg: KernelConfig, elem_bits: int = 16, fuse_d: int = 0, epi_d: int = 1,
                  epi_pipe: int = 0, b_vec: bool = False, append_stages: int = 0, append_d: int = 1) -> bool:
    return not cfg.persistent and main_ledger(cfg, elem_bits, fuse_d=fuse_d, epi_d=epi_d, epi_pipe=epi_pipe,
                                              b_vec=b_vec, append_stages=append_stages, append_d=append_d).fits()


TUNED_PATH = TUNED_DIR / "multilora_h200.json"


def tuned_key(M: int, N: int, K: int, r_max: int, adapters: int, mode: str = "gather") -> str:
    """Table key: M and the distinct-adapter bound in power-of-two buckets, exact N and K,
    BLOCK_R for the rank; ``_seg`` for a plan measured in segment mode (rows sorted by adapter: a tile holds fewer
    adapters, so other tiles win)."""
    key = f"m{_pow2_at_least(M, 1)}_n{N}_k{K}_r{_pow2_at_least(r_max)}_a{_pow2_at_least(adapters, 1)}"
    return key + "_seg" if mode == "segment" else key


def _load_tuned(path: str) -> dict:
    """The plans of a multi-LoRA tuned table (``plan.tuned.table_entries``: one that ``extends`` another, the H100's
    own entries only, has the H200's beneath)."""
    return table_entries(path, "plans")


_APPEND_STAGES = 3        # the heuristic's appended-expand B ring (every tuned appended winner's depth)


@functools.lru_cache(maxsize=512)      # a pure function of its arguments, ~0.2 ms of host time per eager call
def heuristic_plan(M: int, N: int, K: int, r_max: int, L: int, mode: str, sms: int,
                   adapters: int | None = None, decode_swap: bool = True) -> MultiLoRAPlan:
    """Memory-bound decode shapes (M ≤ 256): W tiles 128 wide (M > 64: 256 wide where the planner's wave rule
    takes them, :func:`~lowrank_gemm.plan.planner.takes_wide_tiles`), in-kernel split-K to cover the SMs when N
    is small. At 16 < M ≤ 64 one adapter per row block: its shrink fused into the k-loop, the expand in the
    epilogue. More adapters, or M > 64 (where the fused shrink's MMA is redone for every N tile): the shrink
    launch and the appended expand (one pipelined K step per distinct adapter, the adapters shared out over the
    split-K programs), the plan of every tuned winner with ≥ 4 adapters at M = 64 / 256; the epilogue's serial
    loop over adapters read up to 25× cuBLAS on untuned shapes (session 18, ``probes/s18/down``: M=64,
    4096→6144, r64, 64 adapters 433 µs vs shrink + expand 54). M ≤ 16: swap-AB tiles (16 tokens on the wgmma's
    N) with the shrink launch and the appended expand (``decode_swap=False``: the BM-64 plan the swap replaced,
    for probes that compare the two)."""
    block_r = rank_block(r_max)
    block_m = 64 if M <= 64 else 128
    num_pid_m = cdiv(M, block_m)
    block_n = 128
    if block_m == 128 and takes_wide_tiles(M, N, sms):
        # the single-adapter rule; on the multi-LoRA kernel 128×256 won at M=256 N=14336 and lost at N=6144 / 4096
        # (probes/s18/ml_variants), and every tuned M=256 N=28672 winner is 128×256
        block_n = 256
    block_k = 128 if block_m == 64 else 64
    tiles = num_pid_m * cdiv(N, block_n)
    split = max(1, min(sms // tiles, cdiv(K, block_k) // 4, 8))
    d_all = adapters if adapters is not None else L
    d_bound = max(1, min(M, block_m, L, d_all))
    swap = M <= 16 and decode_swap             # swap-AB decode plan, built below
    appended = swap or (M > 16 and (d_bound > 1 or block_m == 128))
    fuse_d = 0 if appended or _pow2_at_least(d_bound, 1) * block_r > 64 else _pow2_at_least(d_bound, 1)
    epi_d = max(1, 64 // block_r)
    # Many adapters of rank ≤ 16 (session 28, probes/s28/call10: untuned Llama-3-8B projections, × cuBLAS, heuristic
    # before → after, shrink + expand beside): M = 256 with 16–64 adapters takes the shrink by row on 8 warps and four
    # adapters per appended step (4096→6144 64 adapters 2.84 → 2.36 vs 2.40; 14336→4096 2.00 → 1.73 vs 1.80,
    # 16 adapters 1.86 → 1.63 vs 1.74; 4096→14336 1.85 → 1.78 vs 2.11); 16 < M ≤ 64 with at least as many adapters
    # as rows takes the rows expand (4096→6144 2.17 → 1.93, 4096→14336 1.77 → 1.64; shrink + expand 1.81 / 1.59).
    many = appended and not swap and block_r <= 16
    rows_first = many and M <= 64 and d_all >= M
    shrink_by_row = many and block_m == 128 and M <= 256 and d_all >= 16     # (measured at M = 256 only)
    append_d = 4 if shrink_by_row else 1
    if rows_first and num_pid_m * cdiv(N, 64) <= sms:
        # the rows expand on 64-wide tiles where they fit one wave (its register budget then allows 32-row chunks):
        # 4096→6144 unsplit 31.2 µs vs 33.5 on 128-wide split 2 (shrink + expand 32.0, probes/s28/call12), the tuned
        # N = 4096 winner is 64×64 split 2; at N = 14336 (224 such tiles) they lost, 59.0 vs 55.2
        block_n = 64
        split = max(1, min(sms // (num_pid_m * cdiv(N, block_n)), cdiv(K, block_k) // 4, 8))
    base = KernelConfig(block_m=block_m, block_n=block_n, block_k=block_k, block_r=block_r,
                        group_m=8, num_warps=4 if block_m == 64 else 8, split_k=split)
    ring = _APPEND_STAGES if appended and not rows_first else 0
    stages, _, _ = solve_stages(lambda s, _l: main_ledger(base.replace(num_stages=s), fuse_d=fuse_d, epi_d=epi_d,
                                                          append_stages=ring, append_d=append_d),
                                min_main=2, max_main=5)
    main = base.replace(num_stages=stages)

    # shrink: sorted rows share adapters, so bigger blocks; random ids → small blocks
    sbm = min(64 if mode == "segment" else 16, _pow2_at_least(M))
    sbk = 128 if K >= 128 else _pow2_at_least(K)
    pairs = cdiv(M, sbm) * min(sbm, max(L, 1)) * (block_r // SHRINK_RANK_BLOCK)
    # every extra K slice costs each main tile one more [rows, BLOCK_R] fp32 read: keep ≤ 32 KiB
    s_budget = max(1, 32768 // (min(M, block_m) * block_r * 4))
    s_split = max(1, min(cdiv(2 * sms, pairs), cdiv(K, sbk), s_budget, 32))
    shrink = KernelConfig(block_m=sbm, block_n=SHRINK_RANK_BLOCK, block_k=sbk, block_r=block_r,
                          split_k=s_split, num_warps=4, num_stages=3)
    if swap:
        # Decode: a 64-row tile wastes ¾ of every wgmma on ≤ 16 tokens; swap-AB puts the weight rows on the
        # wgmma's M and the tokens on its N (16). Session 15 (H200, untuned N 6144/8192/14336, r 16/64,
        # 1–16 adapters): 10–48 % less time than the BM-64 fused-shrink plan in all six cases, and every tuned
        # M = 16 winner is this shape. Swap-AB needs the shrink launch; the appended expand beat the epilogue one.
        tile = main.replace(block_m=16, block_k=64, num_warps=4, swap_ab=True)
        stages, _, _ = solve_stages(lambda s, _l: main_ledger(tile.replace(num_stages=s), append_stages=_APPEND_STAGES),
                                    min_main=2, max_main=6)
        main = tile.replace(num_stages=stages)
    expand = dict(expand="appended", append_stages=_APPEND_STAGES, s_unroll=True) if appended else {}
    if rows_first:
        expand.update(expand="rows", rows_chunk=rows_chunk(main, block_r, 32))
    if shrink_by_row:
        shrink = shrink.replace(split_k=4, num_warps=8)
        expand.update(shrink_rows=True, append_d=append_d)
    return MultiLoRAPlan(main=main, shrink=shrink, fuse_d=fuse_d, epi_d=epi_d, **expand)


def choose_plan(M: int, N: int, K: int, r_max: int, L: int, mode: str, device,
                adapters: int | None = None, tuned_path: str | Path | None = None) -> MultiLoRAPlan:
    """Tuned table (``plan/tuned/multilora_<gpu>.json``, :func:`~lowrank_gemm.plan.tuned.tuned_file`, or
    ``tuned_path``; in segment mode its segment entry first, then the gather one) → :func:`heuristic_plan`.
    ``adapters``: host-known bound on distinct adapters in the batch (e.g. the bank's loaded count; None → L)."""
    bound = max(1, min(M, L, adapters if adapters is not None else L))
    path = tuned_path if tuned_path is not None else tuned_file("multilora", device)
    if path is not None:
        table = _load_tuned(str(path))
        for m in dict.fromkeys((mode, "gather")):
            hit = table.get(tuned_key(M, N, K, r_max, bound, m))
            if hit is not None:
                return MultiLoRAPlan.from_dict(hit)
    return heuristic_plan(M, N, K, r_max, L, mode, num_sms(device), adapters)


# ----------------------------------------------------------------------------------------------
# host: validation, launch, op
# ----------------------------------------------------------------------------------------------

def bank_route(M: int, N: int, K: int, x: torch.Tensor, weight: torch.Tensor, bank_a: torch.Tensor,
               adapter_ids: torch.Tensor, adapters: int):
    """(strategy, config, stack_d) of the single-adapter kernels on the bank for a batch the caller bounds to
    ``adapters`` distinct ids, or None (multi-LoRA kernels): one adapter → :func:`one_adapter_plan` (stack_d 0); a
    few → stacked bank mode (:func:`~lowrank_gemm.kernels.lora_gemm.stack_plan`, ``LOWRANK_GEMM_ML_STACK=0`` turns
    it off), on the same operand conditions."""
    if adapters == 1:
        one = one_adapter_plan(M, N, K, x, weight, bank_a, adapter_ids)
        return None if one is None else (*one, 0)
    if not env_on("LOWRANK_GEMM_ML_STACK") or not _bank_operands_ok(x, weight, bank_a, adapter_ids):
        return None
    return stack_plan(M, N, K, bank_a.shape[1], adapters, x.dtype, x.device)


def _bank_operands_ok(x, weight, bank_a, adapter_ids) -> bool:
    """Bank mode's operands: on CUDA (or the interpreter), A readable from the bank viewed [L·R_MAX, K] — contiguous,
    16-B aligned base (the rows' pitch: bank_plan checks K) — and K-contiguous x, W; contiguous ids."""
    if not env_on("LOWRANK_GEMM_ML_BANK") or not (x.is_cuda or _interpreting()):
        return False
    return (bank_a.is_contiguous() and bank_a.data_ptr() % TMA_ALIGN == 0 and x.stride(1) == 1
            and weight.stride(1) == 1 and adapter_ids.is_contiguous())


def one_adapter_plan(M: int, N: int, K: int, x: torch.Tensor, weight: torch.Tensor, bank_a: torch.Tensor,
                     adapter_ids: torch.Tensor):
    """(strategy, config) of the single-adapter kernels in bank mode (:func:`~lowrank_gemm.kernels.lora_gemm.run_bank`)
    for a batch the caller says holds one distinct adapter, or None (multi-LoRA kernels). The single-adapter plans
    are the tuned LoRA table's. H200, session 21 (``probes/s21/call5``, same process): bank mode beat the multi-LoRA
    kernel's one-adapter plans at 11 of the 12 issue-5 cells (N = 4096, M = 64, r64: 17.1 against 26.2 µs; M = 256
    21.6 against 41.4), within 0.1–2.1 µs of ``lora_linear`` on the same bytes. Where the single-adapter op itself
    runs the Gluon v2 kernel (its table's M 33–64, N ≥ 16384 bucket), bank mode's Triton plan lost to the tuned
    multi plan (N = 28672, M = 64, r16: 65.7 against 63.9 µs), so that bucket keeps the multi kernels.
    ``LOWRANK_GEMM_ML_BANK=0`` turns the route off (A/B probes)."""
    if not _bank_operands_ok(x, weight, bank_a, adapter_ids):
        return None
    if x.is_cuda and _v2_choice(M, N, K, bank_a.shape[1], x.device) is not None:
        return None
    return bank_plan(M, N, K, bank_a.shape[1], x.dtype, x.device)


SORT_KERNEL_MAX_M = 8192     # above: torch.sort (the rank count is O(M²) work; measured in benchmarks/NOTES.md)


@triton.jit
def _sort_rows_kernel(ids_ptr, order_ptr, M, BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    """One launch, no workspace: row m's place in the stable sort by id is the number of rows j with
    (id_j, j) < (id_m, m), counted over all M ids in CHUNK-wide steps; then ``order[place] = m``. The places are a
    permutation of 0..M−1, so every store hits its own slot (no atomics, same order every run). The counts stay
    per (row, lane) until the loop ends — one cross-lane sum, not one per step — and a program owns few rows
    (BLOCK = 16), so even small batches spread over many SMs: the first version (128 rows per program, a sum per
    step) took 8 µs at M = 256, each step a chain of ~1300 dependent instructions on one warp per scheduler."""
    offs_m = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live_m = offs_m < M
    key_m = tl.load(ids_ptr + offs_m, mask=live_m, other=0)
    count = tl.zeros((BLOCK, CHUNK), tl.int32)
    for j0 in range(0, M, CHUNK):
        offs_j = j0 + tl.arange(0, CHUNK)
        key_j = tl.load(ids_ptr + offs_j, mask=offs_j < M, other=0)
        before = (key_j[None, :] < key_m[:, None]) | ((key_j[None, :] == key_m[:, None])
                                                      & (offs_j[None, :] < offs_m[:, None]))
        count += (before & (offs_j < M)[None, :]).to(tl.int32)
    tl.store(order_ptr + tl.sum(count, axis=1), offs_m, mask=live_m)


SORT_BLOCK = 16         # rows per program of the rank-counting sort


SEGMENT_MIN_M = 65              # mode="auto": segment mode from this many rows …
SEGMENT_MIN_ADAPTERS = 16       # … where the batch may hold this many distinct adapters (fewer: see auto_mode)


def auto_mode(M: int, N: int, adapters: int | None) -> str:
    """The mode ``mode="auto"`` runs for M rows, N outputs and a bound on the batch's distinct adapters (None:
    unknown, read as many). Measured on an H100 with the one-launch sort (session 46, ``results/h100/multilora.md``
    and ``probes/s46/s46f``), segment (sort included) against gather:
    - M ≤ 64: gather as fast or faster in every cell;
    - 16 or 64 adapters from M = 256: segment wins (N = 4096 r64, 16 adapters, M = 256: 38.0 vs 64.5 µs; N = 28672
      r64, 64 adapters: 229.1 vs 285.5; M = 1024, 64 of r16: 89.4 vs 115.1 at N = 4096, 493.6 vs 576.8 at 28672);
    - four adapters: segment wins only at M = 256 on N = 4096 (r64: 36.1 vs 43.8; r16 a tie), gather everywhere else
      (N = 28672, M = 256 r64: 146.4 vs 161.5; M = 512 / 1024: 48.3 / 73.3 vs 56.6 / 84.7 at N = 4096)."""
    if M < SEGMENT_MIN_M:
        return "gather"
    if adapters is not None and adapters < SEGMENT_MIN_ADAPTERS and (M > 256 or N > 8192):
        return "gather"
    return "segment"


def sort_rows(adapter_ids: torch.Tensor) -> torch.Tensor:
    """Row permutation sorting rows by adapter id (stable: equal ids keep their order), int32, on the ids' device,
    no host sync: the same permutation as ``torch.sort(ids, stable=True).indices``. Up to ``SORT_KERNEL_MAX_M``
    rows it is one rank-counting launch (:func:`_sort_rows_kernel`); ``torch.sort`` takes ~10 launches' time
    (11 / 22 µs at M = 64 / 256 on the H200, session 27), which made segment mode lose to gather mode."""
    ids = adapter_ids.reshape(-1)
    M = ids.numel()
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"sort_rows: adapter ids must be integers, got {ids.dtype}")
    if M == 0 or M > SORT_KERNEL_MAX_M or not (ids.is_cuda or (ids.device.type == "cpu" and _interpreting())):
        return torch.sort(ids, stable=True).indices.to(torch.int32)
    ids = ids.to(torch.int32).contiguous()      # as the kernels read them (multi_lora_gemm narrows the same way)
    order = torch.empty(M, dtype=torch.int32, device=ids.device)
    launch(_sort_rows_kernel, (cdiv(M, SORT_BLOCK),), ids, order, M, BLOCK=SORT_BLOCK,
           CHUNK=min(256, max(16, next_pow2(M))), num_warps=4)
    return order


def _default_validate() -> bool:
    if torch.compiler.is_compiling():
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _check_inputs(x, weight, bank_a, bank_b, ranks, scales, adapter_ids, bias, row_order, mode, weight_scale=None,
                  fp8_activations=0):
    def need(cond, msg):      # msg: a string or a callable building it (built only on failure)
        if not cond:
            raise ValueError(f"multi_lora_linear: {msg() if callable(msg) else msg}")

    need(mode in MODES, lambda: f"mode must be one of {MODES}, got {mode!r}")
    need(x.dim() == 2, lambda: f"x must be [M, K] (flatten leading dims), got shape {tuple(x.shape)}")
    M, K = x.shape
    need(weight.dim() == 2 and weight.shape[1] == K,
         lambda: f"weight must be [N, K={K}], got {tuple(weight.shape)}")
    N = weight.shape[0]
    need(bank_a.dim() == 3 and bank_a.shape[2] == K,
         lambda: f"bank_a must be [L, r_max, K={K}], got {tuple(bank_a.shape)}")
    L, r_max = bank_a.shape[0], bank_a.shape[1]
    need(tuple(bank_b.shape) == (L, N, r_max),
         lambda: f"bank_b must be [L={L}, N={N}, r_max={r_max}], got {tuple(bank_b.shape)}")
    need(tuple(ranks.shape) == (L,) and ranks.dtype == torch.int32,
         lambda: f"ranks must be int32 [L={L}], got {ranks.dtype} {tuple(ranks.shape)}")
    need(tuple(scales.shape) == (L,) and scales.dtype == torch.float32,
         lambda: f"scales must be float32 [L={L}], got {scales.dtype} {tuple(scales.shape)}")
    need(tuple(adapter_ids.shape) == (M,) and adapter_ids.dtype in (torch.int32, torch.int64),
         lambda: f"adapter_ids must be int32/int64 [M={M}], got {adapter_ids.dtype} {tuple(adapter_ids.shape)}")
    need(x.dtype in (torch.float16, torch.bfloat16), lambda: f"x must be fp16 or bf16, got {x.dtype}")
    for name, t in (("weight", weight), ("bank_a", bank_a), ("bank_b", bank_b)):
        need(t.dtype == x.dtype or (name == "weight" and t.dtype in FP8_WEIGHTS),
             lambda: f"{name} dtype must match x ({x.dtype}"
                     + (", or be fp8 with weight_scale" if name == "weight" else "") + f"), got {t.dtype}")
    try:
        check_fp8_base(x, weight, weight_scale, fp8_activations)
    except (TypeError, ValueError) as e:
        raise type(e)(f"multi_lora_linear: {e}") from None
    if bias is not None:
        need(tuple(bias.shape) == (N,), lambda: f"bias must be [N={N}], got {tuple(bias.shape)}")
    if row_order is not None:
        need(tuple(row_order.shape) == (M,) and row_order.dtype == torch.int32,
             lambda: f"row_order must be int32 [M={M}], got {row_order.dtype} {tuple(row_order.shape)}")
    named = [("weight", weight), ("bank_a", bank_a), ("bank_b", bank_b), ("ranks", ranks),
             ("scales", scales), ("adapter_ids", adapter_ids), ("bias", bias), ("row_order", row_order)]
    for name, t in named:
        if t is not None:
            need(t.device == x.device, lambda: f"{name} is on {t.device}, expected x's device {x.device}")
    return M, N, K, L, r_max


def _check_values(adapter_ids, ranks, L, r_max):
    """Host-side value checks: ids in [−1, L), ranks in [0, r_max] — one device sync for all four bounds."""
    if adapter_ids.numel() == 0:
        return
    bounds = [adapter_ids.min(), adapter_ids.max()] + ([ranks.min(), ranks.max()] if L else [])
    lo, hi, *rank_bounds = torch.stack([b.to(torch.int64) for b in bounds]).tolist()
    if lo < -1 or hi >= L:
        raise ValueError(f"multi_lora_linear: adapter_ids must lie in [-1, {L - 1}] (L={L} slots, −1 = base "
                         f"only), got values in [{lo}, {hi}]")
    if L:
        rlo, rhi = rank_bounds
        if rlo < 0 or rhi > r_max:
            raise ValueError(f"multi_lora_linear: ranks must lie in [0, r_max={r_max}], got [{rlo}, {rhi}]")


ROWS_ELEMS_PER_THREAD = 256     # B elements one thread holds per rows_expand chunk (bf16: 128 registers)


def rows_chunk(cfg: KernelConfig, block_r: int, want: int) -> int:
    """Rows per :func:`rows_expand` chunk as launched: the plan's ``rows_chunk``, at most block_m, and small enough
    that a chunk's gathered B tile [rows, BN, BLOCK_R] stays within ROWS_ELEMS_PER_THREAD elements per thread (ptxas,
    sm_90, 4 warps: 64×128 r16 tiles at 16 rows per chunk hold 256, 172 registers, no spill; at 32 rows 512 spill)."""
    cap = max(1, ROWS_ELEMS_PER_THREAD * 32 * cfg.num_warps // (cfg.block_n * block_r))
    return max(1, min(want, cfg.block_m, 1 << (cap.bit_length() - 1)))


def _w_operand(weight: torch.Tensor, cfg: KernelConfig, use_tma: bool):
    if not use_tma:
        return weight
    from triton.tools.tensor_descriptor import TensorDescriptor
    return TensorDescriptor(weight, shape=list(weight.shape), strides=list(weight.stride()),
                            block_shape=[cfg.block_n, cfg.block_k])


def _b_tma_ok(bank_b: torch.Tensor) -> bool:
    """TMA needs a unit inner stride, 16-B aligned outer strides and base."""
    es = bank_b.element_size()
    return (bank_b.stride(2) == 1 and (bank_b.stride(1) * es) % 16 == 0 and (bank_b.stride(0) * es) % 16 == 0
            and bank_b.data_ptr() % 16 == 0)


def _b_descriptor(bank_b: torch.Tensor, block_n: int, block_r: int):
    """bank_b [L, N, r_max] as a 3-D TMA descriptor, box [1, BN, BLOCK_R]: a box never crosses into
    the next adapter (rows ≥ N and columns ≥ r_max are zero-filled by the TMA unit)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    return TensorDescriptor(bank_b, shape=list(bank_b.shape), strides=list(bank_b.stride()),
                            block_shape=[1, block_n, block_r])


def multi_lora_gemm(x, weight, bank_a, bank_b, ranks, scales, adapter_ids, bias=None, row_order=None,
                    mode: str = "auto", plan: MultiLoRAPlan | None = None, has_lora: bool = True,
                    validate: bool | None = None, out: torch.Tensor | None = None,
                    poison_workspace: bool = False, adapters: int | None = None,
                    b_clean: bool = False, pdl: bool | None = None, weight_scale: torch.Tensor | None = None,
                    fp8_activations: bool | int = False) -> torch.Tensor:
    """Launch (shrink +) main. x [M, K], weight [N, K], bank_a [L, r_max, K], bank_b [L, N, r_max],
    ranks [L] int32, scales [L] fp32, adapter_ids [M] (−1 = base only), bias [N] → y [M, N].

    ``mode``: "gather" (rows in place), "segment" (rows walked sorted by adapter; ``row_order``
    may be passed in, else it is computed on device), "auto" (:func:`auto_mode`, by M, N and ``adapters``;
    segment whenever ``row_order`` is given).
    ``has_lora=False`` runs the same main kernel without the low-rank branch (the base product).
    ``adapters``: host-known bound on distinct adapters in the batch (plan choice only; a wrong
    bound stays exact). ``out`` [M, N] receives y (tests pass it NaN-filled); ``poison_workspace``
    NaN-fills the S and split-K workspaces first, so a read of a slot nobody wrote shows up.
    ``b_clean``: the caller guarantees bank_b is zero past each slot's rank (``AdapterBank`` does);
    lets the appended expand skip its per-step rank mask. Wrong when the padding holds NaN/Inf.
    ``pdl``: programmatic dependent launch of the main kernel behind the shrink (its K loop runs
    while the shrink does; it waits for S after the loop). None → ``kernels.pdl.pdl_enabled``
    (``LOWRANK_GEMM_PDL``, off by default until measured); True is ignored where PDL cannot run
    (CPU, interpreter, before sm_90) and when there is no shrink launch (fused shrink,
    ``has_lora=False``). Same results bit for bit.
    ``weight_scale`` / ``fp8_activations``: an fp8 base weight, as in ``lora_linear`` (its scale per output channel;
    x per token in one or two e4m3 terms for an fp8 × fp8 base product, the branch on the 16-bit x). Runs the
    multi-LoRA kernels (:func:`fp8_plan` adapts the chosen plan; a ``plan`` passed in runs as given), never bank mode.
    """
    M, N, K, L, r_max = _check_inputs(x, weight, bank_a, bank_b, ranks, scales, adapter_ids, bias,
                                      row_order, mode, weight_scale, fp8_activations)
    terms = _act_terms(fp8_activations)
    fp8_base = weight_scale is not None or terms > 0
    if validate is None:
        validate = _default_validate()
    if validate and M:
        _check_values(adapter_ids, ranks, L, r_max)
    if mode == "auto":
        mode = "segment" if row_order is not None else auto_mode(M, N, adapters if adapters is not None else L)
    if out is not None:
        if tuple(out.shape) != (M, N) or out.dtype != x.dtype or out.device != x.device:
            raise ValueError(f"multi_lora_linear: out must be {x.dtype} [{M}, {N}] on {x.device}, got "
                             f"{out.dtype} {tuple(out.shape)} on {out.device}")
        y = out
    else:
        y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y
    if plan is None and adapters is not None and adapters >= 1 and L > 0 and r_max > 0 and not fp8_base:
        route = bank_route(M, N, K, x, weight, bank_a, adapter_ids, adapters)
        if route is not None:
            strategy, bcfg, stack_d = route
            ids = adapter_ids.reshape(-1)
            return run_bank(strategy, bcfg, x, weight, bank_a, bank_b, ranks, scales,
                            ids if ids.dtype == torch.int32 else ids.to(torch.int32), bias, out=y,
                            has_lora=has_lora, b_clean=b_clean, stack_d=stack_d)
    if plan is None:
        plan = choose_plan(M, N, K, r_max, L, mode, x.device, adapters)
        if fp8_base:
            plan = fp8_plan(plan, terms)
    elif terms and plan.fuse_d:         # a given plan is taken as given, or refused
        raise ValueError(f"multi_lora_linear: fp8 activations need a plan without the fused shrink (fuse_d = 0: S "
                         f"comes from the 16-bit x), got fuse_d={plan.fuse_d} (fp8_plan makes one)")
    # the main kernel's x: the 16-bit x, or its e4m3 codes (the shrink reads the 16-bit x either way)
    xm, x_scale = fp8_rows(x, terms=terms) if terms else (x, None)
    cfg, scfg = plan.main, plan.shrink
    use_tma = plan.use_tma and (K * weight.element_size()) % 16 == 0 and weight.stride(1) == 1
    has_lora = has_lora and L > 0 and r_max > 0
    ids = adapter_ids if adapter_ids.dtype == torch.int32 else adapter_ids.to(torch.int32)
    if mode == "segment":
        order = sort_rows(ids) if row_order is None else row_order
    else:
        order = None
    order_arg = order if order is not None else ids      # dummy pointer when HAS_ORDER is False
    block_r = rank_block(r_max)
    if cfg.block_r != block_r:
        cfg = cfg.replace(block_r=block_r)
    fuse_d = plan.fuse_d if has_lora else 0
    x_tma = (plan.x_tma and use_tma and order is None and xm.stride(1) == 1
             and (xm.stride(0) * xm.element_size()) % 16 == 0 and (K * xm.element_size()) % 16 == 0)

    shrink = has_lora and not fuse_d
    # PDL only between the shrink and the main kernel: main's K loop reads x, W, ids and the row
    # order before its wait, which is safe because the shrink itself is launched WITHOUT the PDL
    # attribute (it starts after every earlier kernel — the id sort, whatever wrote x — has finished
    # and flushed) and main can start only once every shrink program has started. A PDL-launched
    # shrink would let main overlap an earlier kernel that may still be writing x or the ids.
    use_pdl = shrink and (pdl_enabled(x.device) if pdl is None else (pdl and pdl_supported(x.device)))
    split_s = scfg.split_k if shrink else 1
    s_ws = torch.empty((split_s, M, block_r), dtype=torch.float32, device=x.device)
    if poison_workspace:
        s_ws.fill_(float("nan"))

    # every workspace is set up before the shrink launch, so that the shrink is the main kernel's
    # immediate predecessor in the stream (the PDL pair)
    tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
    split_k = max(1, min(cfg.split_k, cdiv(K, cfg.block_k)))
    rows = plan.expand == "rows" and shrink
    if split_k > 1 or rows:
        ws = torch.empty((tiles, split_k, cfg.block_m, cfg.block_n), dtype=torch.float32, device=x.device)
        sws = torch.empty((tiles, split_k, cfg.block_m, max(fuse_d, 1) * block_r) if fuse_d else (1,),
                          dtype=torch.float32, device=x.device)
        # split-K tickets: the per-stream region the LoRA launches use (zeroed once, left zero by every launch), not a
        # zeroed buffer per call (a memset node in every captured graph)
        cnt = _lora_gemm._TICKETS.get(x.device, tiles) if split_k > 1 else ids
        if poison_workspace:
            ws.fill_(float("nan"))
            sws.fill_(float("nan"))
    else:
        ws = sws = s_ws
        cnt = ids
    append = plan.expand == "appended" and shrink
    b_tma = append and plan.append_d == 1 and _b_tma_ok(bank_b)     # stacked steps gather B by pointer
    if append:
        lst = torch.empty((tiles * split_k, 2 * cfg.block_m), dtype=torch.int32, device=x.device)
        b_desc = _b_descriptor(bank_b, cfg.block_n, block_r) if b_tma else bank_b
    else:
        lst, b_desc = ids, bank_b
    if x_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        x_desc = TensorDescriptor(xm, shape=list(xm.shape), strides=list(xm.stride()),
                                  block_shape=[cfg.block_m, cfg.block_k])
    else:
        x_desc = xm
    w_scale = column_scale(weight_scale, N) if weight_scale is not None else scales   # scales: a dummy pointer

    k_per_split = cdiv(cdiv(K, split_s), scfg.block_k) * scfg.block_k
    if shrink and plan.shrink_rows:
        launch(_mlora_shrink_rows_kernel, (M * split_s,),
            x, bank_a, ids, ranks, s_ws, M, K, L, r_max, k_per_split,
            x.stride(0), x.stride(1), bank_a.stride(0), bank_a.stride(1), bank_a.stride(2),
            s_ws.stride(0), s_ws.stride(1),
            SPLIT_S=split_s, BLOCK_R=block_r, BK=scfg.block_k, PDL=use_pdl, num_warps=scfg.num_warps)
    elif shrink:
        sbm = scfg.block_m
        max_distinct = min(sbm, L)
        num_rb = block_r // scfg.block_n
        grid_s = (cdiv(M, sbm) * max_distinct * num_rb * split_s,)
        launch(_mlora_shrink_kernel, grid_s,
            x, bank_a, ids, order_arg, ranks, s_ws, M, K, L, r_max, k_per_split,
            x.stride(0), x.stride(1), bank_a.stride(0), bank_a.stride(1), bank_a.stride(2),
            s_ws.stride(0), s_ws.stride(1),
            MAX_DISTINCT=max_distinct, NUM_RB=num_rb, SPLIT_S=split_s, BM=sbm, BR=scfg.block_n,
            BK=scfg.block_k, HAS_ORDER=order is not None, PDL=use_pdl, num_warps=scfg.num_warps,
            num_stages=scfg.num_stages)
    launch(_mlora_main_kernel, (tiles, split_k),
        xm, x_desc, _w_operand(weight, cfg, use_tma), y, bias if bias is not None else x, ids, order_arg, s_ws,
        scales, bank_a, bank_b, ranks, ws, sws, cnt, b_desc, lst, w_scale, x_scale if terms else scales,
        M, N, K, L, r_max, split_s,
        xm.stride(0), xm.stride(1), weight.stride(0), weight.stride(1), y.stride(0), y.stride(1),
        s_ws.stride(0), s_ws.stride(1), bank_a.stride(0), bank_a.stride(1), bank_a.stride(2),
        bank_b.stride(0), bank_b.stride(1), bank_b.stride(2),
        BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k, BLOCK_R=block_r, GROUP_M=cfg.group_m,
        HAS_ORDER=order is not None, HAS_LORA=has_lora, HAS_BIAS=bias is not None, USE_TMA=use_tma,
        X_TMA=x_tma, FUSE_D=fuse_d, EPI_D=plan.epi_d, SPLIT_K=split_k, EPI_PIPE=plan.epi_pipe,
        B_VEC=((plan.b_vec or (append and plan.append_d > 1) or rows) and bank_b.stride(2) == 1
               and bank_b.stride(0) % 8 == 0 and bank_b.stride(1) % 8 == 0 and r_max == block_r),
        APPEND=append, APPEND_STAGES=plan.append_stages, B_TMA=b_tma, B_MASK=not b_clean,
        ROW_SELECT=plan.append_rowsel, APPEND_D=plan.append_d,
        S_SLICES=split_s if plan.s_unroll and shrink else 0, PDL=use_pdl, SWAP_AB=cfg.swap_ab,
        ROWS=rows, ROWS_RC=rows_chunk(cfg, block_r, plan.rows_chunk), W_SCALE=weight_scale is not None,
        X_TERMS=terms, num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=use_pdl)
    return y


def fp8_plan(plan: MultiLoRAPlan, terms: int) -> MultiLoRAPlan:
    """The 16-bit plan of the shape, for an fp8 base weight (the tables are 16-bit measurements; for fp8 only the
    widened-W decode tiles' K step was measured, session 35). With fp8 x (``terms`` 1 / 2) the K loop's x tiles are
    e4m3 codes, so S cannot ride along: a fused shrink (``fuse_d``) becomes the shrink launch. With 16-bit x each W
    tile is widened in registers; as the wgmma's B operand it then goes back through shared memory, so the tile is
    swapped (W on the wgmma's M, its register A operand, as ``lora_gemm._fp8_weight_plan`` does) where the plan has
    no fused shrink and the tiles allow it, and the decode tiles read 128-byte K steps (:data:`FP8_W_BLOCK_K`)."""
    if terms:
        return replace(plan, fuse_d=0) if plan.fuse_d else plan
    main = plan.main
    if not main.swap_ab and not plan.fuse_d and main.replace(swap_ab=True).swap_ab_mismatch() is None:
        main = main.replace(swap_ab=True)
    if main.swap_ab and main.block_m <= 64 and main.block_k < FP8_W_BLOCK_K:
        # a 64-wide K step is a 64-byte fp8 W box; the fastest W8A16 tiles read 128 bytes per row (session 35).
        # Decode tiles only: the widened 128×256 prefill tile spills either way (sm_90 ptxas: 128 bytes at K step 64,
        # 256 at 128)
        for stages in range(main.num_stages, 1, -1):
            wide = main.replace(block_k=FP8_W_BLOCK_K, num_stages=stages)
            if can_implement(wide, 16, plan.fuse_d, plan.epi_d, plan.epi_pipe, plan.b_vec,
                             plan.append_stages if plan.expand == "appended" else 0, plan.append_d):
                main = wide
                break
    return replace(plan, main=main) if main != plan.main else plan


# the widened-W (W8A16) swap tile's K step at least this: 128 bytes of fp8 W per row and TMA box. H200, session 35
# (probe_multilora_fp8, same process, 128 / the table's K step): 16 tokens × 16 adapters at N = 28672 60.3 / 75.7 µs
# (the bf16 op 66.6), 64 × 16 there 73.8 / 77.8, 1 × 4 57.1 / 59.0; tiles already at 128 unchanged. 0 restores
# the table's K step
FP8_W_BLOCK_K = int(os.environ.get("LOWRANK_GEMM_ML_FP8W_BK", "128"))


@torch.library.custom_op("lowrank_gemm::multi_lora_linear", mutates_args=())
def _multi_lora_linear_op(x: torch.Tensor, weight: torch.Tensor, bank_a: torch.Tensor, bank_b: torch.Tensor,
                          ranks: torch.Tensor, scales: torch.Tensor, adapter_ids: torch.Tensor,
                          bias: torch.Tensor | None, row_order: torch.Tensor | None, mode: str,
                          validate: bool, max_adapters: int | None = None, b_clean: bool = False,
                          weight_scale: torch.Tensor | None = None, fp8_activations: int = 0) -> torch.Tensor:
    return _multi_lora_linear_impl(x, weight, bank_a, bank_b, ranks, scales, adapter_ids, bias, row_order, mode,
                                   validate, max_adapters, b_clean, weight_scale, fp8_activations)


def _multi_lora_linear_impl(x, weight, bank_a, bank_b, ranks, scales, adapter_ids, bias, row_order, mode: str,
                            validate: bool, max_adapters: int | None = None, b_clean: bool = False,
                            weight_scale=None, fp8_activations: int = 0) -> torch.Tensor:
    """The op's body; eager calls on plain tensors run it without the custom-op dispatch
    (:func:`lora_gemm._direct_ok`)."""
    x2 = x.reshape(-1, x.shape[-1])
    y = multi_lora_gemm(x2, weight, bank_a, bank_b, ranks, scales, adapter_ids.reshape(-1), bias,
                        row_order, mode, validate=validate and _default_validate(), adapters=max_adapters,
                        b_clean=b_clean, weight_scale=weight_scale, fp8_activations=fp8_activations)
    return y.reshape(*x.shape[:-1], weight.shape[0])


@_multi_lora_linear_op.register_fake
def _(x, weight, bank_a, bank_b, ranks, scales, adapter_ids, bias, row_order, mode, validate, max_adapters=None,
      b_clean=False, weight_scale=None, fp8_activations=0):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def multi_lora_linear(x: torch.Tensor, weight: torch.Tensor, bank_a, bank_b: torch.Tensor | None = None,
                      ranks: torch.Tensor | None = None, scales: torch.Tensor | None = None,
                      adapter_ids: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                      mode: str = "auto", row_order: torch.Tensor | None = None,
                      validate: bool = True, max_adapters: int | None = None,
                      weight_scale: torch.Tensor | None = None, fp8_activations: bool | int = False) -> torch.Tensor:
    """Per-row multi-adapter LoRA linear (custom op ``lowrank_gemm::multi_lora_linear``).

    x [..., K], weight [N, K], bank_a [L, r_max, K], bank_b [L, N, r_max], ranks [L] int32,
    scales [L] fp32, adapter_ids [...] (one id per row of x, −1 = base only; int32, or int64 at the cost of a conversion
    kernel per call — ``AdapterIds`` keeps int32 ids for a whole batch), bias [N] → y [..., N].
    ``bank_a`` may instead be an ``AdapterBank`` (then bank_b/ranks/scales come from it and the
    next positional argument is ``adapter_ids``). ``validate`` runs the host-syncing value checks
    unless inside CUDA-graph capture or torch.compile; bad ids are otherwise treated as −1.
    ``max_adapters``: what the caller knows (without a sync) about how many distinct adapters a batch
    holds; it only picks the kernel plan (the measured H200 plans are keyed by it): 1 at M ≤ 256, or 2–4 of a
    rank-16/32 bank at M ≤ 64, run the single-adapter LoRA kernels on the bank (bank mode, stacked for 2–4;
    :func:`bank_route`). Results stay exact when it is wrong, only slower. Default: the bank's slot count.
    ``weight_scale`` / ``fp8_activations``: an fp8 (e4m3 / e5m2) ``weight`` with its float32 scale per output channel
    ([N] or one value); ``fp8_activations`` (e4m3 weight) quantizes x per token for an fp8 × fp8 base product —
    ``True`` one e4m3 term, ``2`` two on one scale (about 16-bit x's precision) — while the adapters' shrink reads
    the 16-bit x (``lora_linear`` has the accuracy numbers). Always the multi-LoRA kernels (no bank mode).
    """
    b_clean = False
    if hasattr(bank_a, "bank_a"):       # an AdapterBank
        bank = bank_a
        # its set_adapter/remove_adapter keep B zero past each rank, so the appended expand may skip the
        # per-step rank mask on B (session 2, H200: r=64, 64 adapters 181.6 → 153.0 µs)
        b_clean = getattr(bank, "B_ZERO_PADDED", False)
        if adapter_ids is None:
            adapter_ids = bank_b
        bank_a, bank_b, ranks, scales = bank.bank_a, bank.bank_b, bank.ranks, bank.scales
    if adapter_ids is None or bank_b is None or ranks is None or scales is None:
        raise TypeError("multi_lora_linear needs bank_b, ranks, scales and adapter_ids (or an AdapterBank)")
    if adapter_ids.numel() != x.numel() // max(1, x.shape[-1]):
        raise ValueError(f"multi_lora_linear: adapter_ids needs one id per row of x "
                         f"({x.numel() // max(1, x.shape[-1])}), got shape {tuple(adapter_ids.shape)}")
    if max_adapters is not None and max_adapters < 1:
        raise ValueError(f"multi_lora_linear: max_adapters must be ≥ 1 or None, got {max_adapters}")
    terms = _act_terms(fp8_activations)
    op = (_multi_lora_linear_impl
          if _direct_ok(x, weight, bank_a, bank_b, ranks, scales, adapter_ids, bias, row_order, weight_scale)
          else _multi_lora_linear_op)
    return op(x, weight, bank_a, bank_b, ranks, scales, adapter_ids, bias, row_order, mode, validate, max_adapters,
              b_clean, weight_scale, terms)
