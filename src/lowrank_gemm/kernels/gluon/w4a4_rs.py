"""W4A4 int4_g64 GEMM at large M: swap-AB with the packed weights as the REGISTER-A operand of e4m3 wgmmas.

    outᵀ[N, M] tile [BN weight rows, BT tokens] = W_tile · X_tileᵀ ,   then the v2 epilogue (launcher contract of
    ``w4a4_ws.launch_w4a4_v2``: col_scale, + s·lora_upᵀ, + bias)

Why: v2's f8 path (w4a4_ws) expands the packed weights into SMEM in two expander warpgroups, with a fence and
a barrier hand-off per K step, so the SS-wgmma can read them; ncu shows the expanders' 8 warps taking issue
slots from the consumers, whose per-group rescale (two FFMAs per output element) already needs ~all the FP32
pipe. Here, as in the decode kernel (w4a4_decode), every consumer warp loads its weight rows straight from the
TMA ring into the wgmma A-register layout and expands them in registers (``w4a4_ws._offset_nibbles_f8``: one
LOP3 per four bytes, offset nibbles n' = q + 8 as e4m3 n'·2⁻⁹); no expanded weight ever touches SMEM. The
token tile is the B operand, pre-expanded to e4m3 by ``w4_expand.expand_act_f8`` and read in place.

Arithmetic (w4a4_ws module doc, "F8"): per group g an e4m3 wgmma chain gives P' = 2⁻⁹·Σ q_x·(q_w + 8) in fp32;
acc[n, m] = fma(fma(P', a[m], b[m]), ws[n], acc) with the token rows a = 2⁹·xs, b = −8·R·xs (xab [K/G, 2, M]).
Swap-AB puts the tokens on the accumulator's columns: a thread holds 2 weight rows × BT/4 token columns per
64-row wgmma, so ws is 2 registers and a, b are BT/4 each, read from SMEM right before each rescale.

Overlap inside a warpgroup (the decode kernel's trick, generalized): the token tile is cut into NSPLIT column
chunks of BTc = BT/NSPLIT, and a "unit" = (group, chunk) is one chain of register-A wgmmas m64nBTck32 into a
fresh partial. Unit u is issued, then unit u−1 is waited for (everything but unit u retires) and rescaled, so the
tensor cores run unit u under unit u−1's FFMAs. Two partials of BTc columns are live: NSPLIT = 2 gives BT = 128
the overlap at the register cost of one full-width partial (acc 64 + partials 64 + a, b 32 per thread).
The last unit of a K step is drained before the step ends: an in-flight partial carried over the loop's back edge
makes ptxas serialize every wgmma (decode kernel, C7514).

No warp specialization (the simplest form that shows whether the idea pays): NUM_WARPS = BN/16 (one or two
warpgroups of 64 weight rows, both reading the same token tile) run one instruction stream; each K step's slot
is refilled by the same warps (STAGES−1 steps of TMA stay in flight) once every warp is past the step
(``gl.thread_barrier``; all its wgmmas retired). Persistent grid over the shared grouped tile order
(``skeleton.GroupedTileScheduler``, token blocks as its "M"); the ring runs on one flat step counter across the
program's tiles, so the next tile's first steps load during this tile's last steps and its epilogue
(host mirrors: :func:`rs_steps_host` the closed forms, :func:`rs_cursor_host` the loop variables line by line;
:func:`simulate_rs` runs the protocol on mbarrier semantics). Per step one slot holds (all by TMA, OOB → zeros):
x8 [BT, BK] e4m3, packed w [BN, BK/2], the step's xab rows [2·BK/G, BT] fp32 and ws rows [BK/G, BN] 16-bit (2-D
boxes, one copy each). Past K, x8 and the rows of groups past K/G read as 0, so those partials add exactly 0; past
M, x8 and a, b are 0 (column adds 0); past N, ws is 0 (the row adds 0; zero packed bytes would be n' = 8) — and
neither is ever stored.
Epilogue per tile (all warps): s [BT, BR] fp32 and lora_up [BN, BR] land by TMA at the tile's start (own
barrier, phase = tile parity); s is rounded to lora_up's dtype into an SMEM tile (the wgmma B operand), lora_up
goes to registers as A, one bf16/fp16 wgmma per chunk adds s·lora_upᵀ onto acc; × col_scale before, + bias
after; masked store of the transposed tile (as the decode kernel). Deterministic: fixed K order, no atomics.
"""

from __future__ import annotations

import random

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from ...plan.config import KernelConfig
from ...plan.smem import SmemLedger, SmemTerm, barrier_bytes, tile_bytes
from ..epilogue import rank_block
from ..launch import launch
from ..schedule import cdiv, num_sms
from .host import desc, dummy
from .skeleton import GroupedTileScheduler, alloc_barriers, program_tiles_host, reads_done_before_refill
from .w4a4_ws import _f8_operands, _offset_nibbles_f8, _pad_rank

__all__ = ["rs_ledger", "default_rs_config", "plan_rs", "check_rs_config", "launch_w4a4_rs", "w4a4_rs_kernel",
           "rs_args", "aot_signature_rs", "rs_steps_host", "rs_cursor_host", "simulate_rs", "default_nsplit",
           "ctas_per_sm", "SM90_SMEM_PER_SM", "PROBE_TAGS", "config_from_tag", "RATIO_FLOOR",
           "ratio_weight_tables", "ratio_act_tables", "ratio_groups"]

PACK = 64                    # formats.int4.PACK_BLOCK: a 64-wide K block is 32 packed bytes (lo | hi nibbles)
_PACK = gl.constexpr(PACK)
ROWS_PER_WARP = 16           # a 64-row wgmma: 16 weight rows per warp
_ROWS_PER_WARP = gl.constexpr(ROWS_PER_WARP)
MAX_STAGES = 8
SM90_SMEM_PER_SM = 228 * 1024
SMEM_RESERVED_PER_CTA = 1024     # the driver's per-CTA reservation (counts against SM90_SMEM_PER_SM)
_BITS = {torch.bfloat16: 16, torch.float16: 16, torch.float32: 32}


# =============================================================================================
# Device code
@gluon.jit
def _issue_step(ok, slot, kk, off_t, off_n, x_desc, w_desc, ab_desc, ws_desc, x_bufs, w_bufs, ab_bufs, ws_bufs, ready,
                BLOCK_K: gl.constexpr, UR: gl.constexpr):
    """TMA copies of K step ``kk`` of the tile at (off_t, off_n) into ``slot`` (predicated off with ``ok``)."""
    bar = ready.index(slot)
    mbarrier.expect(bar, x_desc.block_type.nbytes + w_desc.block_type.nbytes + ab_desc.block_type.nbytes
                    + ws_desc.block_type.nbytes, pred=ok)
    tma.async_copy_global_to_shared(x_desc, [off_t, kk * BLOCK_K], bar, x_bufs.index(slot), pred=ok)
    tma.async_copy_global_to_shared(w_desc, [off_n, kk * (BLOCK_K // 2)], bar, w_bufs.index(slot), pred=ok)
    # xab viewed as [2·K/G, M]: the step's groups are rows 2·UR·kk … (a, b interleaved per group)
    tma.async_copy_global_to_shared(ab_desc, [kk * (2 * UR), off_t], bar, ab_bufs.index(slot), pred=ok)
    tma.async_copy_global_to_shared(ws_desc, [kk * UR, off_n], bar, ws_bufs.index(slot), pred=ok)


@gluon.jit
def _tile_origin(sched, t, BLOCK_T: gl.constexpr, BLOCK_N: gl.constexpr):
    pid_m, pid_n = sched.get_tile(t)
    return pid_m * BLOCK_T, pid_n * BLOCK_N


@gluon.jit
def _issue_lowrank(t, n_local, sched, s_desc, up_desc, s_smem, up_smem, lr_bar, BLOCK_T: gl.constexpr,
                   BLOCK_N: gl.constexpr):
    """The epilogue's s [BT, BR] and lora_up [BN, BR] tiles of local tile ``t`` (none past the last tile)."""
    ok = t < n_local
    off_t, off_n = _tile_origin(sched, t, BLOCK_T, BLOCK_N)
    mbarrier.expect(lr_bar, s_desc.block_type.nbytes + up_desc.block_type.nbytes, pred=ok)
    tma.async_copy_global_to_shared(s_desc, [off_t, 0], lr_bar, s_smem, pred=ok)
    tma.async_copy_global_to_shared(up_desc, [off_n, 0], lr_bar, up_smem, pred=ok)


@gluon.jit
def _rescale(acc, done, ab, ab_row, ws_row, c: gl.constexpr, BTC: gl.constexpr, mma: gl.constexpr):
    """acc = fma(fma(P', a, b), ws, acc) for token chunk c of the group whose a row is ``ab_row`` (b the next)."""
    a = ab.index(ab_row).slice(c * BTC, BTC).load(gl.SliceLayout(0, mma))
    b = ab.index(ab_row + 1).slice(c * BTC, BTC).load(gl.SliceLayout(0, mma))
    return gl.fma(gl.fma(done, a[None, :], b[None, :]), ws_row[:, None], acc)


@gluon.jit
def _weights_a(wp, b: gl.constexpr, SWAR: gl.constexpr, a_layout: gl.constexpr):
    """64-wide block b of the slot's packed weights [BN, 32 B] straight into the wgmma A-register layout (k_width 4:
    four consecutive K bytes of one row per register), as e4m3 offset nibbles (low → K 0–31, high → K 32–63)."""
    packed = wp.slice(b * (_PACK // 2), _PACK // 2, dim=1).load(a_layout).to(gl.int8, bitcast=True)
    return _offset_nibbles_f8(packed, SWAR)


@gluon.jit
def _step(acc0, acc1, xb, wp, ab, wsr, slot, zero, BLOCK_K: gl.constexpr, G2: gl.constexpr, NSPLIT: gl.constexpr,
          SWAR: gl.constexpr, mma: gl.constexpr):
    """One K step (UR = BK/G groups) of one slot: units (group j, chunk c) in order; unit u's wgmmas are issued
    before unit u−1 is waited for and rescaled (module doc). acc0 / acc1: token chunks 0 / 1 (acc1 passes
    through untouched when NSPLIT = 1). ``ab`` / ``wsr``: every slot's row tables as rows (slot s, group j: a, b
    rows 2·UR·s + 2j, + 1; ws row UR·s + j). The step's last unit is drained before returning."""
    UR: gl.constexpr = BLOCK_K // G2
    BPG: gl.constexpr = G2 // _PACK                     # 64-wide blocks per group
    BTC: gl.constexpr = zero.shape[1]
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    for j in gl.static_range(UR):
        ws_row = wsr.index(slot * UR + j).load(gl.SliceLayout(1, mma)).to(gl.float32)
        if BPG == 1:     # G = 64: the group's weights expanded once, shared by its chunks
            lo1, hi1 = _weights_a(wp, j, SWAR, a_layout)
        for c in gl.static_range(NSPLIT):
            xc = xb.slice(c * BTC, BTC, dim=0)
            part = zero
            for b in gl.static_range(j * BPG, (j + 1) * BPG):
                if BPG == 1:
                    lo = lo1
                    hi = hi1
                else:        # G = 128: re-expanded per chunk (one block's registers live, not the group's)
                    lo, hi = _weights_a(wp, b, SWAR, a_layout)
                part = warpgroup_mma(lo, xc.slice(b * _PACK, _PACK // 2, dim=1).permute((1, 0)), part,
                                     use_acc=b > j * BPG, is_async=True)
                part = warpgroup_mma(hi, xc.slice(b * _PACK + _PACK // 2, _PACK // 2, dim=1).permute((1, 0)),
                                     part, is_async=True)
            if j * NSPLIT + c > 0:
                done = warpgroup_mma_wait(2 * BPG, deps=(prev, ))     # all but this unit's wgmmas retired
                if prev_c == 0:
                    acc0 = _rescale(acc0, done, ab, slot * (2 * UR) + 2 * prev_j, prev_ws, 0, BTC, mma)
                else:
                    acc1 = _rescale(acc1, done, ab, slot * (2 * UR) + 2 * prev_j, prev_ws, 1, BTC, mma)
            prev = part
            prev_j = j
            prev_c = c
            prev_ws = ws_row
    done = warpgroup_mma_wait(0, deps=(prev, ))
    if prev_c == 0:
        acc0 = _rescale(acc0, done, ab, slot * (2 * UR) + 2 * prev_j, prev_ws, 0, BTC, mma)
    else:
        acc1 = _rescale(acc1, done, ab, slot * (2 * UR) + 2 * prev_j, prev_ws, 1, BTC, mma)
    return acc0, acc1


@gluon.jit
def _ratio_rescale(acc, ab, ab_row, rw_row, c: gl.constexpr, BTC: gl.constexpr, mma: gl.constexpr):
    """RATIO: acc = acc·ρa[m]·ρw[n] + cb[m] — the running sum re-expressed in group g's scale units, plus the
    group's offset correction; the group's wgmmas then accumulate P' onto it in place (module doc, "RATIO")."""
    ra = ab.index(ab_row).slice(c * BTC, BTC).load(gl.SliceLayout(0, mma))
    cb = ab.index(ab_row + 1).slice(c * BTC, BTC).load(gl.SliceLayout(0, mma))
    return gl.fma(acc * ra[None, :], rw_row[:, None], cb[None, :])


@gluon.jit
def _step_ratio(acc0, acc1, xb, wp, ab, wsr, slot, BLOCK_K: gl.constexpr, G2: gl.constexpr, NSPLIT: gl.constexpr,
                SWAR: gl.constexpr, mma: gl.constexpr):
    """RATIO form of :func:`_step`: no partials. Per unit (group j, chunk c) the chunk's accumulator is rescaled
    by the ratio rows and the group's register-A wgmmas accumulate onto it. With two chunks, chunk c's rescale
    runs while the other chunk's wgmmas are in flight (wait leaves the other chunk's 2·BPG wgmmas outstanding);
    the step's wgmmas are drained before it returns (the slot is refilled next)."""
    UR: gl.constexpr = BLOCK_K // G2
    BPG: gl.constexpr = G2 // _PACK
    BTC: gl.constexpr = acc0.shape[1]
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    for j in gl.static_range(UR):
        rw_row = wsr.index(slot * UR + j).load(gl.SliceLayout(1, mma))
        if BPG == 1:
            lo1, hi1 = _weights_a(wp, j, SWAR, a_layout)
        for c in gl.static_range(NSPLIT):
            if c == 0:
                acc = acc0
            else:
                acc = acc1
            # this chunk's previous group retired, the other chunk's may still run. (At j = 0, c = 1 nothing of
            # this chunk is in flight — the last step drained — but without the wait ptxas cannot prove it and
            # injects a full wait after chunk 0's wgmmas: C7517)
            if j > 0 or c > 0:
                acc = warpgroup_mma_wait(2 * BPG if NSPLIT == 2 else 0, deps=(acc, ))
            acc = _ratio_rescale(acc, ab, slot * (2 * UR) + 2 * j, rw_row, c, BTC, mma)
            xc = xb.slice(c * BTC, BTC, dim=0)
            for b in gl.static_range(j * BPG, (j + 1) * BPG):
                if BPG == 1:
                    lo = lo1
                    hi = hi1
                else:
                    lo, hi = _weights_a(wp, b, SWAR, a_layout)
                acc = warpgroup_mma(lo, xc.slice(b * _PACK, _PACK // 2, dim=1).permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma(hi, xc.slice(b * _PACK + _PACK // 2, _PACK // 2, dim=1).permute((1, 0)), acc,
                                    is_async=True)
            if c == 0:
                acc0 = acc
            else:
                acc1 = acc
    if NSPLIT == 2:
        acc0, acc1 = warpgroup_mma_wait(0, deps=(acc0, acc1))
    else:
        acc0 = warpgroup_mma_wait(0, deps=(acc0, ))
    return acc0, acc1


@gluon.jit
def _store_chunk(acc, c: gl.constexpr, off_t, off_n, up_regs, s16, out_ptr, stride_om, col_scale_ptr, bias_ptr, M, N,
                 HAS_LOWRANK: gl.constexpr, HAS_COL_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr,
                 mma: gl.constexpr, mma16: gl.constexpr, RATIO: gl.constexpr = False, a_last_ptr=None,
                 w_last_ptr=None):
    """Epilogue of token chunk c: × col_scale[n] → + s·lora_upᵀ (one wgmma, K = BR) → + bias[n] → masked store of
    the transposed [BN, BTc] tile into out [M, N]."""
    BN: gl.constexpr = acc.shape[0]
    BTC: gl.constexpr = acc.shape[1]
    offs_n = off_n + gl.arange(0, BN, gl.SliceLayout(1, mma))
    offs_t = off_t + c * BTC + gl.arange(0, BTC, gl.SliceLayout(0, mma))
    n_ok = offs_n < N
    t_ok = offs_t < M
    if RATIO:   # the last group's scales: acc was kept in their units
        acc = acc * gl.load(w_last_ptr + offs_n, mask=n_ok, other=0.0)[:, None] \
            * gl.load(a_last_ptr + offs_t, mask=t_ok, other=0.0)[None, :]
    if HAS_COL_SCALE:
        acc = acc * gl.load(col_scale_ptr + offs_n, mask=n_ok, other=0.0).to(gl.float32)[:, None]
    if HAS_LOWRANK:
        acc16 = gl.convert_layout(acc, mma16, assert_trivial=True)
        acc16 = warpgroup_mma(up_regs, s16.slice(c * BTC, BTC, dim=0).permute((1, 0)), acc16)
        acc = gl.convert_layout(acc16, mma, assert_trivial=True)
    if HAS_BIAS:
        acc = acc + gl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(gl.float32)[:, None]
    mask = n_ok[:, None] & t_ok[None, :]
    gl.store(out_ptr + offs_t[None, :] * stride_om + offs_n[:, None], acc.to(out_ptr.dtype.element_ty), mask=mask)


# M, N, K, stride_om: never specialized (a value of 1 would become a constexpr).
@gluon.jit(do_not_specialize=["M", "N", "K", "stride_om"])
def w4a4_rs_kernel(x_desc, w_desc, ab_desc, ws_desc, s_desc, up_desc,
                   out_ptr, stride_om, col_scale_ptr, bias_ptr, a_last_ptr, w_last_ptr,
                   M, N, K,
                   G2: gl.constexpr, BLOCK_T: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                   BLOCK_R: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, NSPLIT: gl.constexpr,
                   HAS_LOWRANK: gl.constexpr, HAS_COL_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr,
                   SWAR: gl.constexpr, RATIO: gl.constexpr = False):
    gl.static_assert(BLOCK_K % G2 == 0 and G2 % _PACK == 0, "a K step covers whole groups of 64-wide blocks")
    gl.static_assert(NSPLIT == 1 or NSPLIT == 2, "one or two token chunks")
    gl.static_assert(BLOCK_N == _ROWS_PER_WARP * gl.num_warps(), "one 64-row wgmma per warpgroup")
    UR: gl.constexpr = BLOCK_K // G2
    BTC: gl.constexpr = BLOCK_T // NSPLIT
    nw: gl.constexpr = gl.num_warps()
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[nw, 1], instr_shape=[16, BTC, 32])
    # Every SMEM buffer and barrier of the kernel is declared here (rs_ledger mirrors it).
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    ab_bufs = gl.allocate_shared_memory(ab_desc.dtype, [STAGES] + ab_desc.block_type.shape, ab_desc.layout)
    ws_bufs = gl.allocate_shared_memory(ws_desc.dtype, [STAGES] + ws_desc.block_type.shape, ws_desc.layout)
    # the same bytes as plain rows (an unswizzled NVMMA tile is row-major), one [BT] / [BN] row per index
    ab_rows = ab_bufs._reinterpret(ab_desc.dtype, [STAGES * 2 * UR, BLOCK_T],
                                   gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1))
    ws_rows = ws_bufs._reinterpret(ws_desc.dtype, [STAGES * UR, BLOCK_N],
                                   gl.NVMMASharedLayout(swizzle_byte_width=0,
                                                        element_bitwidth=ws_desc.dtype.primitive_bitwidth, rank=1))
    ready = alloc_barriers(STAGES, 1)
    lr_dtype: gl.constexpr = up_desc.dtype
    mma16: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[nw, 1],
                                                    instr_shape=[16, BTC, 16])
    if HAS_LOWRANK:
        s_smem = gl.allocate_shared_memory(s_desc.dtype, s_desc.block_type.shape, s_desc.layout)
        up_smem = gl.allocate_shared_memory(lr_dtype, up_desc.block_type.shape, up_desc.layout)
        s16_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_T, BLOCK_R], lr_dtype)
        s16 = gl.allocate_shared_memory(lr_dtype, [BLOCK_T, BLOCK_R], s16_layout)
        lr_bar = alloc_barriers(1, 1).index(0)

    sched = GroupedTileScheduler.initialize(M, N, BLOCK_T, BLOCK_N, GROUP_M)
    n_local = sched.get_num_tiles()
    k_tiles = gl.cdiv(K, BLOCK_K)
    total = n_local * k_tiles
    for i in gl.static_range(STAGES):
        pt, pn = _tile_origin(sched, i // k_tiles, BLOCK_T, BLOCK_N)
        _issue_step(i < total, i, i % k_tiles, pt, pn, x_desc, w_desc, ab_desc, ws_desc, x_bufs, w_bufs, ab_bufs,
                    ws_bufs, ready, BLOCK_K, UR)
    if HAS_LOWRANK:
        _issue_lowrank(0, n_local, sched, s_desc, up_desc, s_smem, up_smem, lr_bar, BLOCK_T, BLOCK_N)

    zero = gl.zeros([BLOCK_N, BTC], gl.float32, mma)
    # The refill cursor: flat step `step + STAGES` as (local tile, K step, tile origin), advanced by one step per
    # K step (no divisions in the loop). Its slot is the one just consumed.
    i_t = STAGES // k_tiles
    i_kk = STAGES % k_tiles
    i_off_t, i_off_n = _tile_origin(sched, i_t, BLOCK_T, BLOCK_N)
    slot = 0
    phase = 0
    for t in range(n_local):
        off_t, off_n = _tile_origin(sched, t, BLOCK_T, BLOCK_N)
        acc0 = gl.zeros([BLOCK_N, BTC], gl.float32, mma)
        acc1 = gl.zeros([BLOCK_N, BTC], gl.float32, mma)
        for kk in range(k_tiles):
            mbarrier.wait(ready.index(slot), phase)
            if RATIO:
                acc0, acc1 = _step_ratio(acc0, acc1, x_bufs.index(slot), w_bufs.index(slot), ab_rows, ws_rows, slot,
                                         BLOCK_K, G2, NSPLIT, SWAR, mma)
            else:
                acc0, acc1 = _step(acc0, acc1, x_bufs.index(slot), w_bufs.index(slot), ab_rows, ws_rows, slot, zero,
                                   BLOCK_K, G2, NSPLIT, SWAR, mma)
            # every warp is past this slot's SMEM reads and its wgmmas retired: refill it STAGES steps ahead
            reads_done_before_refill()
            _issue_step(i_t < n_local, slot, i_kk, i_off_t, i_off_n, x_desc, w_desc, ab_desc, ws_desc, x_bufs,
                        w_bufs, ab_bufs, ws_bufs, ready, BLOCK_K, UR)
            i_kk += 1
            if i_kk == k_tiles:
                i_kk = 0
                i_t += 1
                i_off_t, i_off_n = _tile_origin(sched, i_t, BLOCK_T, BLOCK_N)
            slot += 1
            if slot == STAGES:
                slot = 0
                phase ^= 1
        # ---- epilogue (all warps) ----
        if HAS_LOWRANK:
            mbarrier.wait(lr_bar, t & 1)
            s_layout: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [nw, 1], [1, 0])
            s16.store(s_smem.load(s_layout).to(lr_dtype))     # rounded like an unfused s @ lora_upᵀ
            fence_async_shared()
            gl.thread_barrier()                                 # every warp's part of s16 is in before the wgmma
            up_regs = up_smem.load(gl.DotOperandLayout(operand_index=0, parent=mma16, k_width=2))
        else:
            up_regs = zero
            s16 = x_bufs
        _store_chunk(acc0, 0, off_t, off_n, up_regs, s16, out_ptr, stride_om, col_scale_ptr, bias_ptr, M, N,
                     HAS_LOWRANK, HAS_COL_SCALE, HAS_BIAS, mma, mma16, RATIO, a_last_ptr,
                     w_last_ptr)
        if NSPLIT == 2:
            _store_chunk(acc1, 1, off_t, off_n, up_regs, s16, out_ptr, stride_om, col_scale_ptr, bias_ptr, M, N,
                         HAS_LOWRANK, HAS_COL_SCALE, HAS_BIAS, mma, mma16, RATIO, a_last_ptr, w_last_ptr)
        if HAS_LOWRANK:
            reads_done_before_refill()   # every warp is past s_smem / up_smem / s16: the next tile's copies may land
            _issue_lowrank(t + 1, n_local, sched, s_desc, up_desc, s_smem, up_smem, lr_bar, BLOCK_T, BLOCK_N)


# =============================================================================================
# Host side: ledger, plan, validate, launch.
def default_nsplit(block_t: int) -> int:
    """Token chunks per tile: BT = 128 keeps two 64-column partials (one full-width partial's registers) so the
    overlap fits beside acc; BT = 64 keeps two full-width ones."""
    return 2 if block_t >= 128 else 1


def rs_ledger(config: KernelConfig, *, group_size: int = 64, has_lowrank: bool = True,
              lowrank_dtype=torch.bfloat16, ratio: bool = False) -> SmemLedger:
    """Every byte :func:`w4a4_rs_kernel` allocates (mirrors the allocations in the kernel; one CTA). ``ratio``: the
    weight rows are the fp32 ratios ρw instead of the 16-bit w_scale."""
    bt, bn, bk, br, s = config.block_m, config.block_n, config.block_k, config.block_r, config.num_stages
    ur = bk // group_size
    terms = [SmemTerm("ring.x_e4m3", tile_bytes(bt, bk, 8), s),
             SmemTerm("ring.w_packed", tile_bytes(bn, bk // 2, 8), s),
             SmemTerm("ring.xab_rows", tile_bytes(2 * ur, bt, 32), s),
             SmemTerm("ring.w_ratio_rows" if ratio else "ring.w_scale_rows",
                      tile_bytes(ur, bn, 32 if ratio else 16), s),
             SmemTerm("barriers.ring", barrier_bytes(s))]
    if has_lowrank:
        bits = _BITS[lowrank_dtype]
        terms += [SmemTerm("lowrank.s_fp32", tile_bytes(bt, br, 32)),
                  SmemTerm("lowrank.lora_up", tile_bytes(bn, br, bits)),
                  SmemTerm("lowrank.s_rounded", tile_bytes(bt, br, bits)),
                  # the allocator places this barrier after the ring's, 16-byte aligned (odd ring depth: 8 B gap)
                  SmemTerm("barriers.lowrank", barrier_bytes(1) + (8 if s % 2 else 0))]
    return SmemLedger(tuple(terms), consumers=1, label=f"w4a4 rs {bt}x{bn}x{bk}{' ratio' if ratio else ''}")


def ctas_per_sm(config: KernelConfig, ledger: SmemLedger | None = None, ctas: int | None = None) -> int:
    """CTAs the persistent grid puts on one SM: as many as shared memory holds, up to ``ctas`` (default: 2 for one
    warpgroup — ≤ 255 registers × 128 threads × 2 always fits the register file — else 1; a caller asking for
    more asserts the registers fit, e.g. RATIO with ≤ 128 registers × 256 threads × 2). The grid never exceeds
    what runs at once."""
    want = ctas or (2 if config.num_warps <= 4 else 1)
    total = (ledger or rs_ledger(config)).total()
    return max(1, min(want, SM90_SMEM_PER_SM // (total + SMEM_RESERVED_PER_CTA)))


def default_rs_config(group_size: int = 64) -> KernelConfig:
    """128 tokens × 128 weight rows (two warpgroups), 256-wide K steps (four G=64 groups: the per-step costs — thread
    barrier, TMA issue, the drained last unit — amortized over more FFMAs); the ring as deep as fits (3 slots)."""
    return KernelConfig(block_m=128, block_n=128, block_k=256, block_r=16, group_m=8,
                        num_warps=128 // ROWS_PER_WARP, num_stages=MAX_STAGES, lowrank_stages=1, persistent=True)


def _budget(config: KernelConfig, want_ctas: int) -> int:
    return SM90_SMEM_PER_SM // want_ctas - SMEM_RESERVED_PER_CTA


def plan_rs(rank: int, group_size: int = 64, config: KernelConfig | None = None, lowrank_dtype=torch.bfloat16,
            stages: int | None = None, ratio: bool = False, ctas: int | None = None) -> KernelConfig:
    """Tiles from ``config`` (or the default), block_r from the rank, and the ring depth: ``stages`` if given,
    else the deepest ring (≤ MAX_STAGES) that fits — two CTAs per SM for one-warpgroup tiles when that leaves
    ≥ 3 slots, else one; ``ctas``: that many CTAs per SM (≥ 2 slots), else one."""
    base = (config or default_rs_config(group_size))
    base = base.replace(block_r=max(base.block_r, rank_block(rank)), num_warps=base.block_n // ROWS_PER_WARP)
    if stages is not None:
        return base.replace(num_stages=stages)
    has_lr = rank > 0

    def fits(s, want_ctas):
        led = rs_ledger(base.replace(num_stages=s), group_size=group_size, has_lowrank=has_lr,
                        lowrank_dtype=lowrank_dtype, ratio=ratio)
        return led.total() <= min(led.limit, _budget(base, want_ctas))

    for want in ((ctas, 1) if ctas else (2, 1) if base.num_warps <= 4 else (1, )):
        ok = [s for s in range(2, MAX_STAGES + 1) if fits(s, want)]
        if ok and (want == 1 or max(ok) >= (2 if ctas else 3)):
            return base.replace(num_stages=max(ok))
    return base.replace(num_stages=2)        # check_rs_config raises SmemError with the table


def check_rs_config(config: KernelConfig, M: int, N: int, K: int, rank: int, group_size: int, nsplit: int,
                    lowrank_dtype=torch.bfloat16, ratio: bool = False):
    """Raise ValueError / SmemError naming the violated constraint (expected vs got)."""
    bt, bn, bk = config.block_m, config.block_n, config.block_k
    # (256 tokens would need 128 accumulator registers per thread beside the partials: ptxas spills)
    if bt not in (64, 128) or bn not in (64, 128):
        raise ValueError(f"w4a4 rs: block_m (tokens) ∈ {{64, 128}}, block_n (weight rows) ∈ {{64, 128}}; got {bt}×{bn}")
    if config.num_warps != bn // ROWS_PER_WARP:
        raise ValueError(f"w4a4 rs: num_warps must be block_n/16 = {bn // ROWS_PER_WARP} (one warpgroup per 64 "
                         f"weight rows), got {config.num_warps}")
    if nsplit not in (1, 2) or bt // nsplit < 64:
        raise ValueError(f"w4a4 rs: nsplit ∈ {{1, 2}} with block_m/nsplit ≥ 64 (the wgmma N of a chunk), got "
                         f"nsplit={nsplit} for block_m={bt}")
    if bk % group_size or bk % PACK or bk > 512:
        raise ValueError(f"w4a4 rs: block_k must be a multiple of the group size {group_size} (and of {PACK}), "
                         f"≤ 512; got {bk}")
    if config.num_stages < 2:
        raise ValueError(f"w4a4 rs: num_stages ≥ 2, got {config.num_stages}")
    if rank > config.block_r:
        raise ValueError(f"w4a4 rs: rank {rank} exceeds block_r {config.block_r}")
    # the scale rows come as 2-D TMA boxes: row strides must be 16-byte multiples
    if M % 4 or N % 8:
        raise ValueError(f"w4a4 rs: needs M % 4 == 0 (xab rows, fp32) and N % 8 == 0 (w_scale rows, 16-bit) for "
                         f"the TMA'd scale rows; got M={M}, N={N} (use launch_w4a4_v2 for such shapes)")
    rs_ledger(config, group_size=group_size, has_lowrank=rank > 0, lowrank_dtype=lowrank_dtype, ratio=ratio).check()


def _expect(cond, msg):
    if not cond:
        raise ValueError(f"w4a4 rs: {msg}")


# The candidates the probe times and the tests compile (scripts/probe_w4a4_rs.py): "t{BT}n{BN}k{BK}[s{NSPLIT}]
# [x{STAGES}]", "default" = :func:`default_rs_config`. Each compiles with 0 spills (tests/test_w4a4_rs.py).
PROBE_TAGS = ("default", "t128n128k128", "t128n128k128s1", "t128n64k128", "t64n128k256", "t64n64k256",
              "t128n128k128r", "t128n64k128r", "t128n64k128rc3", "t128n64k256rc2", "t64n64k256r", "t64n64k128rc4",
              "t64n64k128c4", "t64n64k128c3", "t64n64k256c3", "t128n64k128c3")


def config_from_tag(tag: str) -> tuple[KernelConfig | None, dict]:
    """"t128n64k128s2x4rc3" → (config 128 tokens × 64 weight rows × 128 K, launch options nsplit 2, stages 4,
    ratio (``r``: the RATIO K loop), ctas 3 per SM); absent parts → None / False (nsplit: :func:`default_nsplit`,
    stages: as deep as fits, ctas: :func:`ctas_per_sm`'s default); "default" → (None, {})."""
    import re
    if tag == "default":
        return None, {}
    m = re.fullmatch(r"t(\d+)n(\d+)k(\d+)(?:s(\d))?(?:x(\d))?(r)?(?:c(\d))?", tag)
    if not m:
        raise ValueError(f"w4a4 rs: config tag must look like t128n128k256[s2][x3][r][c2] or 'default', got {tag!r}")
    bt, bn, bk = (int(v) for v in m.groups()[:3])
    kw = {}
    if m.group(4):
        kw["nsplit"] = int(m.group(4))
    if m.group(5):
        kw["stages"] = int(m.group(5))
    if m.group(6):
        kw["ratio"] = True
    if m.group(7):
        kw["ctas"] = int(m.group(7))
    cfg = default_rs_config().replace(block_m=bt, block_n=bn, block_k=bk, num_warps=bn // ROWS_PER_WARP)
    return cfg, kw


# RATIO (module doc): how far below its row's (column's) largest scale a group's scale may sit before it is raised
# to that floor for the ratio chain — keeps every ratio product ≤ 2⁸⁰ (fp32 holds 2¹²⁷); a raised group's error is
# ≤ 2⁻⁴⁰ of the row's (column's) largest group's contribution, below fp32 resolution.
RATIO_FLOOR = 2.0 ** -40


def ratio_groups(n_groups: int, group_size: int) -> int:
    """Rows of a ratio table: K/G padded to whole 512-wide K steps (the largest BLOCK_K), so any config's last step
    reads real rows. A padded group must leave the running sum alone (ρ = 1, cb = 0): TMA's zero fill would read
    ρ = 0 and wipe it."""
    per = max(1, 512 // group_size)
    return -(-n_groups // per) * per


def _ratio_chain(scale: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-major scales [K/G, L] → (ρ [ratio_groups, L] fp32 with ρ[g] = s[g−1]/s[g], ρ[0] = 0, padded rows 1;
    s_last [L]) on the effective scales s = max(scale, floor) with floor = RATIO_FLOOR · max over groups (1 for an
    all-zero column). NaN anywhere in a column makes the column's s, hence its ρ and s_last, NaN."""
    s = scale.float()
    top = s.amax(dim=0, keepdim=True)
    floor = torch.where(top > 0, top * RATIO_FLOOR, torch.ones_like(top))
    floor = torch.where(torch.isnan(top), top, floor)
    eff = torch.maximum(s, floor)
    g = s.shape[0]
    rho = torch.ones(ratio_groups(g, group_size), s.shape[1], dtype=torch.float32, device=s.device)
    rho[0] = 0.0
    rho[1:g] = eff[:-1] / eff[1:]
    return rho, eff[-1].contiguous()


def ratio_weight_tables(w_scale: torch.Tensor, group_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights' side of RATIO, once per weight: (ρw [ratio_groups, N] fp32, ws_last [N] fp32)."""
    return _ratio_chain(w_scale, group_size)


def ratio_act_tables(xab: torch.Tensor, group_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens' side of RATIO from the e4m3 path's rows xab [K/G, 2, M] = (a = 2⁹·xs, b = −8·R·xs):
    (rab [ratio_groups, 2, M] fp32 = (ρa, cb), a_last [M]) with cb = −R/64 (the offset correction in P' units; R
    recovered as the integer round(−64·b/a), 0 where a = 0; 0 in padded rows)."""
    a, b = xab[:, 0].float(), xab[:, 1].float()
    rho, a_last = _ratio_chain(a, group_size)
    r = torch.where(a != 0, torch.round(-64.0 * b / torch.where(a != 0, a, torch.ones_like(a))), torch.zeros_like(a))
    r = torch.where(torch.isnan(a), a, r)
    cb = torch.zeros_like(rho)
    cb[:a.shape[0]] = -r / 64.0
    return torch.stack((rho, cb), dim=1).contiguous(), a_last


def rs_args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt, group_size,
            config: KernelConfig | None = None, *, col_scale=None, grid: int | None = None, nsplit: int | None = None,
            stages: int | None = None, swar: bool = True, ratio: bool = False, ctas: int | None = None,
            ratio_tables=None):
    """Validate (the v1/v2 contract's checks, ``w4a4_gemm.check_gemm_args``), plan and build one launch.
    x_q / x_scale may be the pre-expanded e4m3 operands (x8 [M, K], xab [K/G, 2, M]) or packed int4 + scales
    (then ``expand_act_f8`` runs here). ``ratio``: the RATIO K loop; ``ratio_tables`` = (rab, a_last, ρw, ws_last)
    if the caller holds them (else computed here, :func:`ratio_act_tables` / :func:`ratio_weight_tables`).
    Returns (grid, args, constexprs, config)."""
    from ..w4a4_gemm import check_gemm_args
    _expect(fmt in ("int4_g64", "int4_g"), f"the register-A kernel is the int4_g64 (e4m3) path, got fmt={fmt!r}")
    if x_q.dtype == torch.float8_e4m3fn:
        # pre-expanded (x8, xab): the packed contract is checked on zero-stride stand-ins of the packed shapes
        _expect(x_q.dim() == 2 and x_q.is_contiguous(), f"pre-expanded x8 must be contiguous e4m3 [M, K], got "
                                                        f"{list(x_q.shape)}")
        M, K = x_q.shape
        _expect(tuple(x_scale.shape) == (K // group_size, 2, M) and x_scale.dtype == torch.float32
                and x_scale.is_contiguous(), f"pre-expanded xab must be contiguous float32 [K/G, 2, M] = "
                                             f"{[K // group_size, 2, M]}, got {x_scale.dtype} {list(x_scale.shape)}")
        # the packed contract checked on zero-copy stand-ins with its shapes and dtypes (views of x8's / xab's bytes)
        packed = x_q.view(torch.uint8).reshape(2 * M, K // 2)[:M]
        scales = x_scale.view(w_scale.dtype).reshape(-1, M)[:K // group_size]
        M, N, K, r = check_gemm_args(packed, scales, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, group_size,
                                     "int4_g64")
    else:
        M, N, K, r = check_gemm_args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, group_size,
                                     "int4_g64")
    dev = x_q.device
    _expect(out.dtype in _BITS and tuple(out.shape) == (M, N) and out.is_contiguous() and out.device == dev,
            f"out must be contiguous bf16/fp16/fp32 [M, N] = {[M, N]} on {dev}, got {out.dtype} {list(out.shape)} "
            f"on {out.device}")
    _expect(col_scale is None or (tuple(col_scale.shape) == (N, ) and col_scale.device == dev),
            f"col_scale must be [N={N}] on {dev}, got {None if col_scale is None else list(col_scale.shape)}")
    _expect(w_scale.is_contiguous() and w_scale.data_ptr() % 16 == 0,
            "w_scale must be contiguous and 16-byte aligned (its rows come by TMA)")
    for name, t in (("x_q", x_q), ("w_q", w_q)):
        _expect(t.data_ptr() % 16 == 0, f"{name} must be 16-byte aligned for TMA, got address {t.data_ptr():#x}")
    lr_dtype = lora_up.dtype if r else torch.bfloat16
    config = plan_rs(r, group_size, config, lr_dtype, stages, ratio, ctas)
    nsplit = default_nsplit(config.block_m) if nsplit is None else nsplit
    check_rs_config(config, M, N, K, r, group_size, nsplit, lr_dtype, ratio)

    bt, bn, bk, br = config.block_m, config.block_n, config.block_k, config.block_r
    ur = bk // group_size
    x8, xab = _f8_operands(x_q, x_scale, group_size, True, "w4a4 rs")
    x_desc = desc(x8, (bt, bk))
    w_desc = desc(w_q, (bn, bk // 2))
    # the scale tables as 2-D row tables, unswizzled (each row is loaded on its own into a slice layout)
    f32 = dummy(dev, torch.float32, (1, ))
    a_last = w_last = f32
    rows = w_scale
    if ratio:
        if ratio_tables is None:
            ratio_tables = (*ratio_act_tables(xab, group_size), *ratio_weight_tables(w_scale, group_size))
        xab, a_last, rows, w_last = ratio_tables
        gp = ratio_groups(K // group_size, group_size)
        _expect(tuple(xab.shape) == (gp, 2, M) and tuple(rows.shape) == (gp, N)
                and a_last.numel() == M and w_last.numel() == N
                and all(t.dtype == torch.float32 and t.is_contiguous() for t in ratio_tables),
                f"ratio tables must be contiguous float32 rab [{gp}, 2, {M}], a_last [{M}], rho_w [{gp}, {N}], "
                f"ws_last [{N}] (ratio_act_tables / ratio_weight_tables); got {[tuple(t.shape) for t in ratio_tables]}")
    ab_desc = desc(xab.reshape(-1, M), (2 * ur, bt),
                   gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))
    ws_desc = desc(rows, (ur, bn), gl.NVMMASharedLayout(swizzle_byte_width=0,
                                                        element_bitwidth=rows.element_size() * 8, rank=2))
    r8 = -(-r // 8) * 8
    s_desc = desc(_pad_rank(lowrank_act, r8) if r else dummy(dev, torch.float32, (bt, br)), (bt, br))
    up_desc = desc(_pad_rank(lora_up, r8) if r else dummy(dev, lr_dtype, (bn, br)), (bn, br))
    tiles = cdiv(M, bt) * cdiv(N, bn)
    cap = num_sms(dev) * ctas_per_sm(config, rs_ledger(config, group_size=group_size, has_lowrank=r > 0,
                                                       lowrank_dtype=lr_dtype, ratio=ratio), ctas)
    grid = max(1, min(grid or cap, tiles))
    args = (x_desc, w_desc, ab_desc, ws_desc, s_desc, up_desc, out, out.stride(0),
            col_scale if col_scale is not None else f32, bias if bias is not None else f32, a_last, w_last, M, N, K)
    cx = dict(G2=group_size, BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk, BLOCK_R=br, GROUP_M=config.group_m,
              STAGES=config.num_stages, NSPLIT=nsplit, HAS_LOWRANK=r > 0, HAS_COL_SCALE=col_scale is not None,
              HAS_BIAS=bias is not None, SWAR=swar, RATIO=bool(ratio))
    return grid, args, cx, config


def launch_w4a4_rs(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt: str = "int4_g64",
                   group_size: int = 64, config: KernelConfig | None = None, *, col_scale=None,
                   grid: int | None = None, nsplit: int | None = None, stages: int | None = None, swar: bool = True,
                   ratio: bool = False, ctas: int | None = None, ratio_tables=None):
    """out [M, N] ← the int4_g64 W4A4 GEMM + epilogue (``launch_w4a4_v2``'s contract, plus pre-expanded e4m3
    activations). ``nsplit``: token chunks per tile (None = :func:`default_nsplit`); ``stages``: ring depth
    (None = deepest that fits); ``grid``: persistent programs (None = SMs × :func:`ctas_per_sm`)."""
    g, args, cx, cfg = rs_args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt, group_size,
                               config, col_scale=col_scale, grid=grid, nsplit=nsplit, stages=stages, swar=swar,
                               ratio=ratio, ctas=ctas, ratio_tables=ratio_tables)
    launch(w4a4_rs_kernel, (g, ), *args, **cx, num_warps=cfg.num_warps)
    return out


def aot_signature_rs(config: KernelConfig | None = None, *, M=300, N=320, K=448, rank=32, group_size=64, bias=True,
                     col_scale=True, out_dtype=torch.bfloat16, nsplit=None, stages=None, swar=True, ratio=False,
                     ctas=None):
    """(signature, constexprs, config) for ``kernels.aot.compile_sm90`` of :func:`w4a4_rs_kernel`."""
    import inspect
    from triton.runtime.jit import mangle_type
    from .w4a4_ws import make_operands_v2
    ops = make_operands_v2("int4_g64", M, N, K, rank, group_size, device="cpu", bias=bias, col_scale=col_scale,
                           out_dtype=out_dtype)
    _, args, cx, cfg = rs_args(**ops, config=config, nsplit=nsplit, stages=stages, swar=swar, ratio=ratio, ctas=ctas)
    names = [n for n in inspect.signature(w4a4_rs_kernel.fn).parameters if n not in cx]
    sig = {n: (mangle_type(a) if not isinstance(a, int) else "i32") for n, a in zip(names, args)}
    return sig, cx, cfg


# =============================================================================================
# Host model of the pipeline protocol (plain Python; tests/test_w4a4_rs.py).
def rs_steps_host(pid: int, nprog: int, M: int, N: int, K: int, config: KernelConfig) -> list[dict]:
    """Program ``pid``'s flat steps in the kernel's order, each with the slot / parity the kernel computes
    (slot = step % STAGES, the consumer waits for parity (step // STAGES) & 1) and the TMA coordinates of its
    copies: x [off_t, kk·BK], w [off_n, kk·BK/2], xab rows [2·UR·kk, off_t], ws rows [UR·kk, off_n]."""
    bt, bn, bk, s = config.block_m, config.block_n, config.block_k, config.num_stages
    k_tiles = cdiv(K, bk)
    out = []
    for t, (pm, pn) in enumerate(program_tiles_host(pid, nprog, M, N, bt, bn, config.group_m)):
        for kk in range(k_tiles):
            step = t * k_tiles + kk
            out.append(dict(step=step, tile=t, kk=kk, slot=step % s, parity=(step // s) & 1, off_t=pm * bt,
                            off_n=pn * bn))
    return out


def rs_cursor_host(n_local: int, k_tiles: int, stages: int) -> list[dict]:
    """The kernel's loop variables transcribed line by line (prologue, then per K step: wait on (slot, phase),
    refill ``slot`` from the cursor (i_t, i_kk) if i_t < n_local, advance cursor and slot/phase). Each consumed
    step → dict(slot, phase, refill=(i_t, i_kk) or None); the prologue's fills as the first entry's ``prologue``.
    Tests pin it to :func:`rs_steps_host`'s closed forms."""
    total = n_local * k_tiles
    prologue = [(i // k_tiles, i % k_tiles) for i in range(stages) if i < total]
    i_t, i_kk = stages // k_tiles, stages % k_tiles
    slot = phase = 0
    out = []
    for _t in range(n_local):
        for _kk in range(k_tiles):
            ev = dict(slot=slot, phase=phase, refill=(i_t, i_kk) if i_t < n_local else None)
            out.append(ev)
            i_kk += 1
            if i_kk == k_tiles:
                i_kk = 0
                i_t += 1
            slot += 1
            if slot == stages:
                slot = 0
                phase ^= 1
    if out:
        out[0]["prologue"] = prologue
    return out


def simulate_rs(n_tiles: int, k_tiles: int, stages: int, *, has_lowrank: bool = True, warps: int = 2, seed: int = 0,
                max_steps: int = 200000, refill_early: bool = False):
    """Run the kernel's protocol on real mbarrier semantics (``protocol_model.MBarrier``) under a random
    interleaving: ``warps`` warps running the one instruction stream (a thread barrier per step and one per tile, as
    the kernel), warp 0 standing for the elected thread that issues the copies, and a TMA engine landing copies in
    random order. Checks that every wait passes only on the fill it wants (no parity aliasing), that no slot is
    refilled while a warp may still read it, and that nothing deadlocks. ``refill_early`` models the bug the
    per-step thread barrier prevents (warp 0 refills the slot as soon as IT is done with the step). Returns a
    ``protocol_model.SimResult``."""
    from .protocol_model import MBarrier, SimResult
    rng = random.Random(seed)
    total = n_tiles * k_tiles
    ready = [MBarrier(1) for _ in range(stages)]
    lr_bar = MBarrier(1)
    slot_fill = [None] * stages                 # step whose data is in each slot
    reading = [set() for _ in range(stages)]    # warps that may still read the slot
    lr_fill = [None]
    lr_reading = set()
    tma_q = []
    errors = []
    barrier = dict(count=0, gen=0)

    def issue(step):
        if step >= total:                       # the kernel's pred=False copies
            return
        i = step % stages
        if reading[i]:
            errors.append(f"step {step} refills slot {i} while warps {sorted(reading[i])} may still read it")
        ready[i].arrive(expect_tx=1)
        tma_q.append((ready[i], lambda i=i, step=step: slot_fill.__setitem__(i, step)))

    def issue_lr(t):
        if t >= n_tiles:
            return
        if lr_reading:
            errors.append(f"tile {t}'s lowrank copies issued while warps {sorted(lr_reading)} may still read them")
        lr_bar.arrive(expect_tx=1)
        tma_q.append((lr_bar, lambda t=t: lr_fill.__setitem__(0, t)))

    def thread_barrier():
        gen = barrier["gen"]
        barrier["count"] += 1
        if barrier["count"] == warps:
            barrier["count"] = 0
            barrier["gen"] += 1
        else:
            yield lambda: barrier["gen"] != gen

    def wait(bar, parity):
        if not bar.try_wait(parity):
            yield lambda: bar.try_wait(parity)

    def warp(w):
        if w == 0:
            for i in range(stages):
                issue(i)
            if has_lowrank:
                issue_lr(0)
        step = 0
        for t in range(n_tiles):
            for kk in range(k_tiles):
                i = step % stages
                yield from wait(ready[i], (step // stages) & 1)
                if slot_fill[i] != step:
                    errors.append(f"warp {w} step {step}: slot {i} holds step {slot_fill[i]} (parity aliasing)")
                reading[i].add(w)
                yield None                     # the step's reads and wgmmas, interleaved with everything else
                reading[i].discard(w)
                if refill_early:
                    if w == 0:
                        issue(step + stages)
                else:
                    yield from thread_barrier()
                    if w == 0:
                        issue(step + stages)
                step += 1
            if has_lowrank:
                yield from wait(lr_bar, t & 1)
                if lr_fill[0] != t:
                    errors.append(f"warp {w} epilogue of tile {t}: lowrank buffers hold tile {lr_fill[0]}")
                lr_reading.add(w)
                yield None
                lr_reading.discard(w)
                yield from thread_barrier()
                if w == 0:
                    issue_lr(t + 1)
            yield None

    roles = {w: warp(w) for w in range(warps)}
    blocked = {w: None for w in roles}          # predicate a blocked warp waits on
    live = set(roles)
    for n in range(max_steps):
        if errors:
            return SimResult(False, errors[0], n)
        runnable = [w for w in sorted(live) if blocked[w] is None or blocked[w]()]
        if not live and not tma_q:
            return SimResult(True, "", n)
        if not runnable and not tma_q:
            return SimResult(False, f"deadlock: warps {sorted(live)} blocked, no copy in flight", n)
        who = rng.choice(runnable + (["tma"] if tma_q else []))
        if who == "tma":
            bar, land = tma_q.pop(rng.randrange(len(tma_q)))
            land()
            bar.complete_tx(1)
            continue
        try:
            blocked[who] = next(roles[who])
        except StopIteration:
            live.discard(who)
            blocked[who] = None
    return SimResult(False, "step limit", max_steps)
