"""Session 29: how fast can one launch stream a bf16 weight at decode sizes (M ≤ 16), against cuBLAS?

Issue 2's small-M cells at K = N = 4096 and 8192² sit at ~14.5 / ~36 µs for every implementation, cuBLAS included
(2.3 / 3.6 TB/s), while N = 28672 streams at 4.1 TB/s. Today's plans there are swap-AB tiles 64 weight rows wide:
64 / 128 programs for 132 SMs. This probe times, in one process and as CUDA-graph replays of 8 calls over rotated
weights (bench.common.time_graph), without any low-rank branch:
- ``cublas``: ``x @ W.T``;
- ``read``: a pure read of W (per-program row sums) — what streaming alone costs at this grid;
- ``fma``: a CUDA-core GEMV (M = 1), ``rows`` weight rows per program, the full K;
- ``mma``: a tensor-core skinny GEMM (``tl.dot`` of a [rows, BK] weight tile by xᵀ [BK, 16]; rows < 64 → mma.sync);
- ``lora``: ``mma`` plus split's branch (lora_down_kernel, PDL or not, then S·Bᵀ after the K loop), r = 16;
- ``prod``: one launch, 4 S-producer programs + the main tiles, which acquire S ``lead`` K steps before the end of
  their loop (session 29 call 9);
- ``ll``: ``prod`` with S as (value, epoch) 8-byte words — the S loads are the synchronization, no counter wait
  and no reset (session 29 call 13);
- ``pmode``: where the producers' cost goes — idle head programs, producers that nobody waits for, producers at the
  grid's tail (call 14);
- ``kloop``: ``mma`` with S = x·Aᵀ accumulated in the same K loop (A from L2; no second launch, no sync);
- ``auto``: today's ``lora_linear`` with r = 16 (the branch included), for reference.
Usage: python scripts/probe_lora_gemv.py --out DIR [--shapes 4096x4096,8192x8192] [--ms 1,16]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from lowrank_gemm.bench.common import device_meta, rotation_count, time_graph
from lowrank_gemm.kernels.lora_gemm import _launch_down, down_splits
from lowrank_gemm.kernels.pdl import gdc_wait
from lowrank_gemm.ops import lora_linear


@triton.jit
def _xt_tile(x_ptr, rm, rk, M, K):
    """xᵀ [BK, BM] for the K step at ``rk`` (x row-major, transposed in registers; rows ≥ M read 0)."""
    return tl.trans(tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0))


@triton.jit
def _w_loop(x_ptr, w_ptr, rn, rm, M, K, ROWS: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr):
    """accᵀ [ROWS, BM] = W[rn]·xᵀ over all of K (the skinny kernels' K loop)."""
    acc = tl.zeros([ROWS, BM], tl.float32)
    for k in range(0, K, BK):
        rk = k + tl.arange(0, BK)
        acc = tl.dot(tl.load(w_ptr + rn[:, None] * K + rk[None, :]), _xt_tile(x_ptr, rm, rk, M, K), acc)
    return acc


@triton.jit
def _s_slice(x_ptr, a_ptr, q, P, rm, rr, M, K, R, BK: tl.constexpr, BM: tl.constexpr, BR: tl.constexpr):
    """An S producer's slice: Sᵀ [BR, BM] = A·xᵀ over the q-th of P equal K ranges."""
    ks = K // P
    st = tl.zeros([BR, BM], tl.float32)
    for k in range(q * ks, q * ks + ks, BK):
        rk = k + tl.arange(0, BK)
        a = tl.load(a_ptr + rr[:, None] * K + rk[None, :], mask=rr[:, None] < R, other=0.0)
        st = tl.dot(a, _xt_tile(x_ptr, rm, rk, M, K), st)
    return st


@triton.jit
def _read_rows(w_ptr, y_ptr, N, K, ROWS: tl.constexpr, BK: tl.constexpr):
    rn = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    acc = tl.zeros([ROWS, BK], tl.float32)
    for k in range(0, K, BK):
        rk = k + tl.arange(0, BK)
        acc += tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=rn[:, None] < N, other=0.0).to(tl.float32)
    tl.store(y_ptr + rn, tl.sum(acc, 1).to(y_ptr.dtype.element_ty), mask=rn < N)


@triton.jit
def _gemv_fma(x_ptr, w_ptr, y_ptr, N, K, ROWS: tl.constexpr, BK: tl.constexpr):
    rn = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    acc = tl.zeros([ROWS, BK], tl.float32)
    for k in range(0, K, BK):
        rk = k + tl.arange(0, BK)
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=rn[:, None] < N, other=0.0)
        xv = tl.load(x_ptr + rk)
        acc += w.to(tl.float32) * xv.to(tl.float32)[None, :]
    tl.store(y_ptr + rn, tl.sum(acc, 1).to(y_ptr.dtype.element_ty), mask=rn < N)


@triton.jit
def _skinny_mma(x_ptr, w_ptr, y_ptr, M, N, K, ROWS: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr):
    rn = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rm = tl.arange(0, BM)
    acc = _w_loop(x_ptr, w_ptr, rn, rm, M, K, ROWS, BK, BM)
    tl.store(y_ptr + rm[None, :] * N + rn[:, None], acc.to(y_ptr.dtype.element_ty), mask=rm[None, :] < M)


@triton.jit
def _skinny_lora(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, R, S_SPLITS, stride_sk, stride_sm,
                 ROWS: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr, BR: tl.constexpr, PDL: tl.constexpr,
                 TAIL: tl.constexpr = 0, EPI: tl.constexpr = True):
    """The skinny GEMM plus split's branch: S [S_SPLITS, M, R] fp32 (scaled, from lora_down_kernel, PDL) summed,
    B's [ROWS, R] tile loaded before the K loop, one more dot after it."""
    rn = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rm = tl.arange(0, BM)
    rr = tl.arange(0, BR)
    if EPI:
        b = tl.load(b_ptr + rn[:, None] * R + rr[None, :], mask=(rn[:, None] < N) & (rr[None, :] < R), other=0.0)
    acc = tl.zeros([ROWS, BM], tl.float32)
    k_split = K - TAIL * BK            # EARLY: S is waited for and loaded before the last TAIL K steps
    for k in range(0, k_split, BK):
        rk = k + tl.arange(0, BK)
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :])
        xt = tl.trans(tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0))
        acc = tl.dot(w, xt, acc)
    if PDL:
        gdc_wait()
    st = tl.zeros([BR, BM], tl.float32)
    if EPI:
        for i in range(S_SPLITS):
            st += tl.load(s_ptr + i * stride_sk + rm[None, :] * stride_sm + rr[:, None],
                          mask=(rm[None, :] < M) & (rr[:, None] < R), other=0.0)
    for k in range(k_split, K, BK):
        rk = k + tl.arange(0, BK)
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :])
        xt = tl.trans(tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0))
        acc = tl.dot(w, xt, acc)
    if EPI:
        acc = tl.dot(b, st.to(b.dtype), acc)
    tl.store(y_ptr + rm[None, :] * N + rn[:, None], acc.to(y_ptr.dtype.element_ty), mask=rm[None, :] < M)


@triton.jit
def _skinny_kloop(x_ptr, w_ptr, a_ptr, b_ptr, y_ptr, M, N, K, R, scale,
                  ROWS: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr, BR: tl.constexpr,
                  S_FMA: tl.constexpr = False):
    """One launch, no cross-program traffic: every program also accumulates Sᵀ = A·Xᵀ (A from L2) in its K loop."""
    rn = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rm = tl.arange(0, BM)
    rr = tl.arange(0, BR)
    b = tl.load(b_ptr + rn[:, None] * R + rr[None, :], mask=(rn[:, None] < N) & (rr[None, :] < R), other=0.0)
    acc = tl.zeros([ROWS, BM], tl.float32)
    st = tl.zeros([BR, BM], tl.float32)
    for k in range(0, K, BK):
        rk = k + tl.arange(0, BK)
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :])
        xt = tl.trans(tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0))
        a = tl.load(a_ptr + rr[:, None] * K + rk[None, :], mask=rr[:, None] < R, other=0.0)
        acc = tl.dot(w, xt, acc)
        if S_FMA:     # M = 1: Sᵀ's one column on the CUDA cores (no mma.sync beside the W wgmma: C7515)
            x1 = tl.load(x_ptr + rk).to(tl.float32)
            st += tl.where(rm[None, :] == 0, tl.sum(a.to(tl.float32) * x1[None, :], 1)[:, None], 0.0)
        else:
            st = tl.dot(a, xt, st)
    acc = tl.dot(b, (st * scale).to(b.dtype), acc)
    tl.store(y_ptr + rm[None, :] * N + rn[:, None], acc.to(y_ptr.dtype.element_ty), mask=rm[None, :] < M)


@triton.jit
def _skinny_prod(x_ptr, w_ptr, a_ptr, s_ptr, cnt_ptr, b_ptr, y_ptr, M, N, K, R, n_main,
                 P: tl.constexpr, ROWS: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr, BR: tl.constexpr,
                 LEAD: tl.constexpr):
    """One launch: programs 0..P-1 compute S's K slices ([P, BR, BM] fp32, released on cnt[0]); the main tiles
    acquire them LEAD K steps before the end of their loop (inside it: a second loop would drain the pipeline) and
    take their reset ticket (cnt[1]) right there, so after the loop only the S·Bᵀ dot and the store remain.
    LEAD = 0: all of it after the loop (today's protocol)."""
    pid = tl.program_id(0)
    rm = tl.arange(0, BM)
    rr = tl.arange(0, BR)
    if pid < P:
        st = _s_slice(x_ptr, a_ptr, pid, P, rm, rr, M, K, R, BK, BM, BR)
        tl.store(s_ptr + pid * BR * BM + rr[:, None] * BM + rm[None, :], st)
        tl.debug_barrier()
        tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")
        return
    pid -= P
    rn = pid * ROWS + tl.arange(0, ROWS)
    b = tl.load(b_ptr + rn[:, None] * R + rr[None, :], mask=(rn[:, None] < N) & (rr[None, :] < R), other=0.0)
    acc = tl.zeros([ROWS, BM], tl.float32)
    st = tl.zeros([BR, BM], tl.float32)
    ticket = 0
    n_k = K // BK
    for kt in range(0, n_k):
        rk = kt * BK + tl.arange(0, BK)
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :])
        xt = tl.trans(tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0))
        acc = tl.dot(w, xt, acc)
        if LEAD > 0:
            if kt == n_k - LEAD:
                while tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu") < P:
                    pass
                for i in tl.static_range(P):
                    st += tl.load(s_ptr + i * BR * BM + rr[:, None] * BM + rm[None, :])
                ticket = tl.atomic_add(cnt_ptr + 1, 1, sem="relaxed", scope="gpu")
    if LEAD == 0:
        while tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu") < P:
            pass
        for i in tl.static_range(P):
            st += tl.load(s_ptr + i * BR * BM + rr[:, None] * BM + rm[None, :])
    acc = tl.dot(b, st.to(b.dtype), acc)
    tl.store(y_ptr + rm[None, :] * N + rn[:, None], acc.to(y_ptr.dtype.element_ty), mask=rm[None, :] < M)
    if LEAD == 0:
        ticket = tl.atomic_add(cnt_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if ticket == n_main - 1:
        tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(cnt_ptr + 1, 0, sem="relaxed", scope="gpu")


@triton.jit
def _skinny_ll(x_ptr, w_ptr, a_ptr, words_ptr, cnt_ptr, b_ptr, y_ptr, M, N, K, R, n_main,
               P: tl.constexpr, ROWS: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr, BR: tl.constexpr,
               LANE_EPOCH: tl.constexpr = False, ONE_TRIP: tl.constexpr = False):
    """As ``_skinny_prod`` (lead 0) with no counter wait and no reset: S travels as 8-byte words, the fp32 value in the
    low half and the launch's epoch in the high half (NCCL's LL protocol: an aligned 8-byte store is seen whole or
    not at all), so the main tiles' S loads are their synchronization. The epoch comes from two monotonic int64
    counters — main tiles count themselves on cnt[0], producers on cnt[1] — read by one relaxed atomic at each
    program's start (its latency hides behind the K loop); the words buffer is persistent (stale stamps are from
    earlier epochs)."""
    pid = tl.program_id(0)
    rm = tl.arange(0, BM)
    rr = tl.arange(0, BR)
    if pid < P:
        epoch = tl.atomic_add(cnt_ptr + 1, 1, sem="relaxed", scope="gpu") // P + 1
        st = _s_slice(x_ptr, a_ptr, pid, P, rm, rr, M, K, R, BK, BM, BR)
        word = (epoch << 32) | (st.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF)
        tl.store(words_ptr + pid * BR * BM + rr[:, None] * BM + rm[None, :], word)
        return
    if LANE_EPOCH:
        # one lane's atomic, its result kept in that lane (a scalar atomic is broadcast through shared memory
        # behind a barrier, i.e. the whole CTA waits for its round trip before the K loop — call 15's question)
        lane = tl.arange(0, 32)
        got = tl.atomic_add(cnt_ptr + lane * 0, tl.where(lane == 0, 1, 0).to(tl.int64), mask=lane == 0,
                            sem="relaxed", scope="gpu")
        lane_epoch = tl.where(lane == 0, got // n_main + 1, 0)
    else:
        epoch = tl.atomic_add(cnt_ptr, 1, sem="relaxed", scope="gpu") // n_main + 1
    pid -= P
    rn = pid * ROWS + tl.arange(0, ROWS)
    b = tl.load(b_ptr + rn[:, None] * R + rr[None, :], mask=(rn[:, None] < N) & (rr[None, :] < R), other=0.0)
    acc = _w_loop(x_ptr, w_ptr, rn, rm, M, K, ROWS, BK, BM)
    if LANE_EPOCH:
        epoch = tl.max(lane_epoch, 0)
    st = tl.zeros([BR, BM], tl.float32)
    if ONE_TRIP:
        # every slice's words in one load (one round trip), re-read only while some stamp is stale
        sl = tl.arange(0, P)
        ptrs3 = words_ptr + sl[:, None, None] * BR * BM + rr[None, :, None] * BM + rm[None, None, :]
        word3 = tl.load(ptrs3, volatile=True)
        while tl.min(tl.min(tl.min(tl.where((word3 >> 32) == epoch, 1, 0), 2), 1), 0) == 0:
            word3 = tl.load(ptrs3, volatile=True)
        st = tl.sum((word3 & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True), 0)
    else:
        for i in tl.static_range(P):
            ptrs = words_ptr + i * BR * BM + rr[:, None] * BM + rm[None, :]
            word = tl.load(ptrs, volatile=True)
            while tl.min(tl.where((word >> 32) == epoch, 1, 0)) == 0:
                word = tl.load(ptrs, volatile=True)
            st += (word & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    acc = tl.dot(b, st.to(b.dtype), acc)
    tl.store(y_ptr + rm[None, :] * N + rn[:, None], acc.to(y_ptr.dtype.element_ty), mask=rm[None, :] < M)


@triton.jit
def _skinny_pmode(x_ptr, w_ptr, a_ptr, s_ptr, s_static_ptr, cnt_ptr, b_ptr, y_ptr, M, N, K, R, n_main,
                  P: tl.constexpr, ROWS: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr, BR: tl.constexpr,
                  MODE: tl.constexpr):
    """Where do the in-grid producers' ~1.1 µs go (call 14)? MODE 0: P idle programs at the grid's head, the main tiles
    read a static S (no wait); 1: the producers compute and release S at the head, the main tiles read the static S
    (no wait); 2: the producers at the grid's tail (program ids n_main …), the main tiles wait as today (spin +
    ticket; needs every program resident: n_main + P ≤ the SMs); 3: as 2 at the head (today's order)."""
    pid = tl.program_id(0)
    rm = tl.arange(0, BM)
    rr = tl.arange(0, BR)
    TAIL: tl.constexpr = MODE == 2
    is_prod = (pid >= n_main) if TAIL else (pid < P)
    if is_prod:
        if MODE != 0:
            q = pid - n_main if TAIL else pid
            st = _s_slice(x_ptr, a_ptr, q, P, rm, rr, M, K, R, BK, BM, BR)
            tl.store(s_ptr + q * BR * BM + rr[:, None] * BM + rm[None, :], st)
            tl.debug_barrier()
            tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")
        return
    if not TAIL:
        pid -= P
    rn = pid * ROWS + tl.arange(0, ROWS)
    b = tl.load(b_ptr + rn[:, None] * R + rr[None, :], mask=(rn[:, None] < N) & (rr[None, :] < R), other=0.0)
    acc = _w_loop(x_ptr, w_ptr, rn, rm, M, K, ROWS, BK, BM)
    st = tl.zeros([BR, BM], tl.float32)
    if MODE >= 2:
        while tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu") < P:
            pass
        for i in tl.static_range(P):
            st += tl.load(s_ptr + i * BR * BM + rr[:, None] * BM + rm[None, :])
    else:
        for i in tl.static_range(P):
            st += tl.load(s_static_ptr + i * BR * BM + rr[:, None] * BM + rm[None, :])
    acc = tl.dot(b, st.to(b.dtype), acc)
    tl.store(y_ptr + rm[None, :] * N + rn[:, None], acc.to(y_ptr.dtype.element_ty), mask=rm[None, :] < M)
    if MODE >= 2:
        ticket = tl.atomic_add(cnt_ptr + 1, 1, sem="acq_rel", scope="gpu")
        if ticket == n_main - 1:
            tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(cnt_ptr + 1, 0, sem="relaxed", scope="gpu")
    elif MODE == 1:
        if pid == 0:      # keep the released count from growing without bound (nobody waits on it in this mode)
            tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")


def _variants(M):
    out = [("cublas", None)]
    for rows, bk, warps in ((64, 256, 4), (32, 256, 4), (16, 512, 4), (8, 512, 4), (16, 256, 2), (8, 1024, 4)):
        out.append((f"read r{rows} bk{bk} w{warps}", ("read", rows, bk, warps, 1)))
    if M == 1:
        for rows, bk, warps in ((32, 256, 4), (16, 512, 4), (8, 512, 4), (8, 1024, 4), (4, 1024, 4), (16, 256, 2)):
            out.append((f"fma r{rows} bk{bk} w{warps}", ("fma", rows, bk, warps, 1)))
    for rows, bk, warps, stages in ((64, 256, 4, 4), (32, 256, 4, 4), (32, 128, 4, 6), (16, 256, 4, 4),
                                    (16, 256, 1, 4), (32, 256, 2, 4), (16, 512, 2, 3),
                                    # call 10: wider / deeper tiles for N = 28672
                                    (128, 128, 4, 4), (128, 128, 8, 5), (128, 64, 4, 8), (64, 128, 4, 8),
                                    (64, 256, 4, 6), (64, 512, 4, 3), (256, 64, 8, 6)):
        out.append((f"mma r{rows} bk{bk} w{warps} s{stages}", ("mma", rows, bk, warps, stages)))
    for rows, bk, warps, stages, pdl, tail in ((32, 256, 4, 4, True, 0), (64, 256, 4, 4, True, 0),
                                               (32, 256, 2, 4, True, 0), (32, 256, 4, 4, False, 0),
                                               (16, 512, 2, 3, True, 0), (32, 256, 4, 4, True, 2),
                                               (64, 256, 4, 4, True, 2), (64, 256, 4, 4, True, 4),
                                               (64, 256, 4, 4, False, 2)):
        out.append((f"lora r{rows} bk{bk} w{warps} s{stages}" + (" pdl" if pdl else "") + (f" tail{tail}" if tail
                                                                                            else ""),
                    ("lora", rows, bk, warps, stages, pdl, tail, True, True)))
    # attribution (session 29, call 5): the branch's epilogue without the down launch (S left from an earlier
    # call), and the down launch + PDL without the epilogue (the output is then the bare product)
    for rows, pdl, down, epi in ((64, False, False, True), (32, False, False, True), (64, True, True, False),
                                 (32, True, True, False), (64, False, True, False)):
        out.append((f"attr r{rows}" + (" pdl" if pdl else "") + (" down" if down else "") + (" epi" if epi else ""),
                    ("lora", rows, 256, 4, 4, pdl, 0, down, epi)))
    for rows, bk, warps, stages, lead in ((64, 256, 4, 4, 0), (64, 256, 4, 4, 2), (64, 256, 4, 4, 4),
                                          (32, 256, 4, 4, 2), (64, 128, 4, 6, 4), (64, 256, 2, 4, 2)):
        out.append((f"prod r{rows} bk{bk} w{warps} s{stages} lead{lead}", ("prod", rows, bk, warps, stages, lead)))
    for rows, bk, warps, stages in ((64, 256, 4, 4), (32, 256, 4, 4), (64, 128, 4, 8), (64, 256, 2, 4)):
        out.append((f"ll r{rows} bk{bk} w{warps} s{stages}", ("ll", rows, bk, warps, stages, False)))
    for rows, bk, warps, stages in ((64, 256, 4, 4), (64, 128, 4, 8)):
        out.append((f"ll_lane r{rows} bk{bk} w{warps} s{stages}", ("ll", rows, bk, warps, stages, True)))
        out.append((f"ll_1trip r{rows} bk{bk} w{warps} s{stages}", ("ll", rows, bk, warps, stages, "1trip")))
    for mode in range(4):
        out.append((f"pmode{mode} r64 bk256 w4 s4", ("pmode", 64, 256, 4, 4, mode)))
    for rows, bk, warps, stages in ((64, 256, 4, 4), (32, 256, 4, 4), (64, 128, 4, 6), (128, 128, 4, 4),
                                    (64, 256, 2, 4), (64, 128, 2, 6)):
        out.append((f"kloop r{rows} bk{bk} w{warps} s{stages}", ("kloop", rows, bk, warps, stages, False)))
    if M == 1:
        for rows, bk, warps, stages in ((64, 256, 4, 4), (64, 128, 4, 6), (128, 128, 4, 4), (128, 128, 8, 4),
                                        (64, 256, 2, 4)):
            out.append((f"kfma r{rows} bk{bk} w{warps} s{stages}", ("kloop", rows, bk, warps, stages, True)))
    out.append(("auto lora r16", "auto"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="4096x4096,8192x8192,4096x28672")
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--rank", type=int, default=16, help="the kloop/kfma rows' rank (≤ 16)")
    ap.add_argument("--only", default="", help="comma-separated impl prefixes to run (cublas and auto always run)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    dev = "cuda"
    rows_out = []
    for shape in args.shapes.split(","):
        K, N = (int(v) for v in shape.split("x"))
        nsets = rotation_count(N * K * 2)
        ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(nsets)]
        A = torch.randn(16, K, device=dev, dtype=torch.bfloat16) / 64
        B = torch.randn(N, 16, device=dev, dtype=torch.bfloat16) / 64
        for M in (int(v) for v in args.ms.split(",")):
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            BMV = max(16, triton.next_power_of_2(M))     # the token tile (call 12: M = 64)
            ref = (x.float() @ ws[0].float().T)
            ref_lora = ref + (x.float() @ A.float().T) @ B.float().T
            R = args.rank
            Ar, Br = A[:R].contiguous(), B[:, :R].contiguous()
            ref_kloop = ref + (x.float() @ Ar.float().T) @ Br.float().T
            y = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
            ysum = torch.empty(N, device=dev, dtype=torch.float32)
            for name, spec in _variants(M):
                if args.only and spec not in (None, "auto") and not any(name.startswith(p)
                                                                          for p in args.only.split(",")):
                    continue
                row = dict(K=K, N=N, M=M, impl=name)
                try:
                    if spec is None:
                        fn = lambda w: x @ w.T  # noqa: E731
                    elif spec == "auto":
                        fn = lambda w: lora_linear(x, w, A, B)  # noqa: E731
                    elif spec[0] == "lora":
                        _, rows, bk, warps, stages, pdl, tail, down, epi = spec
                        grid = (triton.cdiv(N, rows),)
                        splits = down_splits(M, 16, K, 16, torch.cuda.get_device_properties(0).multi_processor_count)
                        sbuf = torch.empty(splits, M, 16, device=dev, dtype=torch.float32)

                        _launch_down(x, A, sbuf, 1.0, 16, Kp=K, R=16)

                        def fn(w, rows=rows, bk=bk, warps=warps, stages=stages, pdl=pdl, tail=tail, down=down,
                               epi=epi):
                            if down:
                                _launch_down(x, A, sbuf, 1.0, 16, Kp=K, R=16, pdl=pdl)
                            kw = dict(launch_pdl=True) if pdl else {}
                            _skinny_lora[grid](x, w, sbuf, B, y, M, N, K, 16, splits, sbuf.stride(0),
                                               sbuf.stride(1), ROWS=rows, BK=bk, BM=BMV, BR=16, PDL=pdl, TAIL=tail, EPI=epi,
                                               num_warps=warps, num_stages=stages, **kw)
                            return y
                    elif spec[0] == "prod":
                        _, rows, bk, warps, stages, lead = spec
                        grid = (4 + triton.cdiv(N, rows),)
                        sprod = torch.empty(4, 16, BMV, device=dev, dtype=torch.float32)
                        cnt = torch.zeros(2, device=dev, dtype=torch.int32)

                        def fn(w, rows=rows, bk=bk, warps=warps, stages=stages, lead=lead, grid=grid, sprod=sprod,
                               cnt=cnt):
                            _skinny_prod[grid](x, w, Ar, sprod, cnt, Br, y, M, N, K, R, grid[0] - 4, P=4, ROWS=rows,
                                               BK=bk, BM=BMV, BR=16, LEAD=lead, num_warps=warps, num_stages=stages)
                            return y
                    elif spec[0] == "ll":
                        _, rows, bk, warps, stages, lane_epoch = spec
                        grid = (4 + triton.cdiv(N, rows),)
                        words = torch.zeros(4, 16, BMV, device=dev, dtype=torch.int64)
                        cnt64 = torch.zeros(2, device=dev, dtype=torch.int64)

                        def fn(w, rows=rows, bk=bk, warps=warps, stages=stages, grid=grid, words=words,
                               cnt64=cnt64, lane_epoch=lane_epoch):
                            _skinny_ll[grid](x, w, Ar, words, cnt64, Br, y, M, N, K, R, grid[0] - 4, P=4,
                                             ROWS=rows, BK=bk, BM=BMV, BR=16, LANE_EPOCH=bool(lane_epoch),
                                             ONE_TRIP=lane_epoch == "1trip",
                                             num_warps=warps, num_stages=stages)
                            return y
                    elif spec[0] == "pmode":
                        _, rows, bk, warps, stages, mode = spec
                        n_main = triton.cdiv(N, rows)
                        grid = (4 + n_main,)
                        s_mode = torch.empty(4, 16, BMV, device=dev, dtype=torch.float32)
                        s_static = torch.zeros(4, 16, BMV, device=dev, dtype=torch.float32)
                        s_static[0, :R, :M] = (x.float() @ Ar.float().T).T
                        cnt_m = torch.zeros(2, device=dev, dtype=torch.int32)

                        def fn(w, rows=rows, bk=bk, warps=warps, stages=stages, mode=mode, grid=grid, n_main=n_main,
                               s_mode=s_mode, s_static=s_static, cnt_m=cnt_m):
                            _skinny_pmode[grid](x, w, Ar, s_mode, s_static, cnt_m, Br, y, M, N, K, R, n_main, P=4,
                                                ROWS=rows, BK=bk, BM=BMV, BR=16, MODE=mode, num_warps=warps,
                                                num_stages=stages)
                            return y
                    elif spec[0] == "kloop":
                        _, rows, bk, warps, stages, s_fma = spec
                        grid = (triton.cdiv(N, rows),)

                        def fn(w, rows=rows, bk=bk, warps=warps, stages=stages, s_fma=s_fma):
                            _skinny_kloop[grid](x, w, Ar, Br, y, M, N, K, R, 1.0, ROWS=rows, BK=bk, BM=BMV, BR=16,
                                                S_FMA=s_fma, num_warps=warps, num_stages=stages)
                            return y
                    else:
                        kind, rows, bk, warps, stages = spec
                        grid = (triton.cdiv(N, rows),)
                        if kind == "read":
                            def fn(w, rows=rows, bk=bk, warps=warps):
                                _read_rows[grid](w, ysum, N, K, ROWS=rows, BK=bk, num_warps=warps)
                        elif kind == "fma":
                            def fn(w, rows=rows, bk=bk, warps=warps):
                                _gemv_fma[grid](x, w, y, N, K, ROWS=rows, BK=bk, num_warps=warps)
                                return y
                        else:
                            def fn(w, rows=rows, bk=bk, warps=warps, stages=stages):
                                _skinny_mma[grid](x, w, y, M, N, K, ROWS=rows, BK=bk, BM=BMV, num_warps=warps,
                                                  num_stages=stages)
                                return y
                    got = fn(ws[0])
                    torch.cuda.synchronize()
                    if got is not None:
                        want = (ref_kloop if spec is not None and spec != "auto" and spec[0] in ("kloop", "prod", "ll", "pmode") else
                                ref_lora if spec == "auto" or (spec is not None and spec[0] == "lora" and spec[-1])
                                else ref)
                        err = ((got.float() - want).abs().max() / want.abs().max()).item()
                        row["rel_err"] = round(err, 5)
                        if err > 2e-2:
                            raise AssertionError(f"rel err {err}")
                    t = time_graph(fn, [(w,) for w in ws])
                    row.update(graph_us=round(t.median_us, 3), tbps=round(N * K * 2 / t.median_us / 1e6, 3))
                except Exception as exc:  # noqa: BLE001 — a failed variant is a row, not the end of the probe
                    row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                print(json.dumps(row), flush=True)
                rows_out.append(row)
        del ws
        torch.cuda.empty_cache()
    (out / "gemv.json").write_text(json.dumps({"meta": device_meta(), "rows": rows_out}, indent=1))


if __name__ == "__main__":
    main()
