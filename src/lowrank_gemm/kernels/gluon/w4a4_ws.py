"""W4A4 GEMM + low-rank branch, v2: warp-specialized persistent Gluon kernel for sm_90.

    out[M, N] = epilogue( main(x, w) ) ,   epilogue(z) = z ⊙ row ⊙ col + s · lora_upᵀ + bias

Two operand formats (``FMT``):

- ``int4_g`` (SVDQuant standard): xq uint8 [M, K/2] and wq uint8 [N, K/2] packed int4
  (``formats.int4``), group scales xscales [K/G, M], wscales [K/G, N] (16-bit), G ∈ {64, 128}.
  main = Σ_g (x_g · w_gᵀ) ⊙ xs[g, :, None] ⊙ ws[g, None, :]; BLOCK_K = G so one K step is one group.
- ``int4_2l`` (two-level): xq int8 [M, K] (already expanded), xscales [M] per token; wq uint8
  [N, K/2] packed int4 q, wmult int8 [K/G2, N] level-2 multipliers (q·u must fit int8), wscales [N]
  per channel. main = (x · (q⊙u)ᵀ) ⊙ xs[:, None] ⊙ ws[None, :] — no rescale in the K loop.

``int4_g`` with ``F8`` (fp8 MMA): the int8 path converts every int32 partial to fp32 once per group (I2F,
a quarter-rate conversion on sm_90) before its two-op rescale. With e4m3 operands the wgmma hands back an
fp32 partial directly, and the int4 values stay exact:
- x arrives pre-expanded (``expand_act_f8``: e4m3 [M, K], exact q ∈ [-8, 7]) by TMA into MAIN, like 2l;
- w is expanded in SMEM as the *offset* nibble n' = q + 8 ∈ [0, 15] (one LOP3 per four bytes): the e4m3 bit
  patterns 0x00–0x0F are exactly n'·2⁻⁹ (subnormals, then the lowest binade), so the MMA returns
  P' = 2⁻⁹·Σ q_x·(q_w + 8);
- Σ q_x·q_w = 2⁹·P' − 8·R with R = Σ_k∈g q_x, the group row sum, so per group
  acc += fma(P', a, b) · ws with rows a = 2⁹·xs, b = −8·R·xs (``xab`` [K/G, 2, M] fp32): two FFMAs per
  element, no conversion.
  Its defaults where the scale rows come by TMA: 4 RAW slots, two expander warpgroups (even / odd K steps,
  ``skeleton.ROLES_TWO_EXPANDERS``) and PAIRED consumer K loops (both consumers on a tile pair at once, K steps
  interleaved on MAIN, so one's rescale overlaps the other's MMA). ncu showed the single expander busy ~80 % of
  the kernel; the second expander alone did not pay (the consumers' K loops then serialized), both together did.

``int4_g`` with ``A8`` (per-token e4m3 activations, ``act_bits=8``, formats/fp8.py): x e4m3 [M, K] with its token scale
t [M], the weights expanded per call to *signed* e4m3 q, the no-expander in-flight route only. No activation rows
ride in MAIN; per group acc += P · ws (one FFMA per element), t in the epilogue. ``TRANS`` (with A8; by default where
K ≤ ``A8_TRANS_MAX_K``): the host hands the kernel Yᵀ's operands — the weights as rows, the tokens as columns — so a
consumer thread rescales with its two rows' weight scales, loaded from global memory while the MMA runs, and gives
slots back with no proxy fence (no plain loads of a slot); t is the column scale, the bias a row bias, lora_up · Sᵀ
the low-rank term, and the tile is stored transposed.

Roles (table in ``skeleton.ROLES``): loader (TMA of every ring), expander (int4 → int8 into SMEM),
two consumer warpgroups taking alternate local tiles (ping-pong: one's epilogue overlaps the
other's MMA), each running the epilogue of its own tile (on Hopper the accumulator lives in the
consumer's registers; handing it to a separate epilogue warpgroup would cost a 64 KiB fp32 SMEM
round trip per tile). The consumers hand the shared MAIN ring to each other per tile
(``skeleton.ConsumerOrder``; without it mbarrier parity aliasing hangs the kernel). Rings: MAIN (8-bit operands), RAW (packed tiles), LOWRANK (s, lora_up tiles),
EPILOGUE (per-consumer TMA-store buffer) — each with its own PipelineState per role.
"""


import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                               warpgroup_mma, warpgroup_mma_wait)
from triton.language.core import _aggregate as aggregate

from ...plan.config import KernelConfig
from ...plan.smem import Scope, SmemError, SmemLedger, SmemTerm, barrier_bytes, solve_stages, tile_bytes
from ..env import getenv
from ..epilogue import rank_block
from ..int4_unpack import HI_ASM, HI_MUL_ASM, HI_OFFSET_ASM, LO_ASM, LO_MUL_ASM, LO_OFFSET_ASM
from ..launch import launch
from ..schedule import cdiv, persistent_grid
from .host import desc, dummy, flat_layout
from .skeleton import (bias_and_store, consumer_step, strided_ring_stages, DEFAULT_WARPS, NUM_CONSUMERS, NUM_ROLES, ROLE_CONSUMER0, ROLE_CONSUMER1, ROLE_EXPANDER,
                       ROLE_LOADER, WORKER_REGS, WORKER_REGS_0X, WORKER_REGS_2X, WORKER_WARPS, WORKER_WARPS_0X, WORKER_WARPS_2X, ConsumerOrder, GroupedTileScheduler, Pipeline,
                       Ring, consumer_state, debug_record, make_consumer_order, make_pipeline, producer_state)

__all__ = ["FMT_INT4_G", "FMT_INT4_2L", "RAW_STAGES", "RAW_STAGES_F8", "w4a4_ledger", "plan_w4a4_v2", "can_implement_v2",
           "launch_w4a4_v2", "w4a4_ws_kernel", "reference_v2", "make_operands_v2",
           "kernel_args_v2", "aot_signature_v2", "default_config_v2", "f8_default", "paired_default", "f8_expanders_default",
           "inflight_default", "inflight_depth", "INFLIGHT_DEPTH", "a8_inflight_default", "A8_TRANS_DEPTH",
           "A8_TRANS_DEEP_DEPTH", "A8_TRANS_DEEP_K", "coop_default", "ws_f32_default",
           "ws_perm_default", "ws_row_order", "fuse_ws_default"]

FMT_INT4_G = 0
FMT_INT4_2L = 1
FORMATS = {"int4_g64": FMT_INT4_G, "int4_2l": FMT_INT4_2L}   # names of kernels/w4a4_gemm.py
RAW_STAGES = 2          # packed tiles only wait for the expander: two slots hide the TMA latency when compute
                        # bounds the kernel; memory-bound decode wants more bytes in flight (raw_stages=)
RAW_STAGES_F8 = 4       # the f8 expander turns a slot around faster than one TMA round trip: 2 → 4 slots took
                        # fc1 955 → 883 µs and M=64 decode 69.8 → 58.7 µs (H200, benchmarks/NOTES.md session 4)
PACK = 64               # formats.int4.PACK_BLOCK: one 64-wide K block = 32 bytes (lo | hi nibbles)
DEBUG_ITERS_DEFAULT = 64
DEBUG_TILES_DEFAULT = 16
INFLIGHT_DEPTH = 4      # groups per in-flight loop body (_f8_chain) when inflight=True: H200, coop, same process
                        # (probes/s25/depth), GEMM alone vs pairs: fc1 553 → 539 µs, fc2 545 → 529, 3072² 150 → 146,
                        # 9216 414 → 405; eight groups 663 / 664 / 180 / 512 (code size: two consumers' unrolled
                        # bodies); a rolled loop with both MMAs in flight over its back edge trips C7514
# Device-side copies (Gluon reads only constexpr globals).
_PACK = gl.constexpr(PACK)
_FMT_INT4_G = gl.constexpr(FMT_INT4_G)
_FMT_INT4_2L = gl.constexpr(FMT_INT4_2L)


# =============================================================================================
# Device code
@gluon.constexpr_function
def _u_rows(block_k, g2):
    return max(1, block_k // g2)   # = u_rows() on the host


@aggregate
class W4A4Args:
    x_desc: tma.tensor_descriptor      # 2l: int8 [M, K] box [BM, BK]; g: uint8 [M, K/2] box [BM, BK/2]
    w_desc: tma.tensor_descriptor      # uint8 [N, K/2] box [BN, BK/2]
    s_desc: tma.tensor_descriptor      # fp32 [M, R] box [BM, BR]
    b_desc: tma.tensor_descriptor      # 16-bit [N, R] box [BN, BR]
    out_desc: tma.tensor_descriptor    # 16-bit [M, N] box [BM, BN] (EPI_TMA only)
    x_bufs: gl.shared_memory_descriptor    # MAIN  [S, BM, BK] int8
    w_bufs: gl.shared_memory_descriptor    # MAIN  [S, BN, BK] int8
    xp_bufs: gl.shared_memory_descriptor   # RAW   [RAW_STAGES_N, BM, BK/2] uint8 (g only)
    wp_bufs: gl.shared_memory_descriptor   # RAW   [RAW_STAGES_N, BN, BK/2] uint8
    s_bufs: gl.shared_memory_descriptor    # LOWRANK [L, BM, BR] fp32
    b_bufs: gl.shared_memory_descriptor    # LOWRANK [L, BN, BR] 16-bit
    epi_bufs: gl.shared_memory_descriptor  # EPILOGUE [NUM_CONSUMERS, BM, BN] out dtype
    sc_desc: tma.tensor_descriptor     # SCALE_TMA, 1-D views: g → x_scale [K/G·M] box [BM]; 2l → u [K/G2·N] box [BN]
    sw_desc: tma.tensor_descriptor     # SCALE_TMA, g: w_scale [K/G·N] box [BN]
    sx_bufs: gl.shared_memory_descriptor   # g: MAIN [S, BM] 16-bit;  2l: RAW [RAW_STAGES_N·UR, BN] uint8 (u)
    sw_bufs: gl.shared_memory_descriptor   # g: MAIN [S, BN] 16-bit
    main: Pipeline
    raw: Pipeline
    lowrank: Pipeline
    order: ConsumerOrder
    out_ptr: gl.tensor
    stride_om: gl.tensor
    xscale_ptr: gl.tensor
    wscale_ptr: gl.tensor
    wmult_ptr: gl.tensor
    col_scale_ptr: gl.tensor
    bias_ptr: gl.tensor
    dbg_ptr: gl.tensor
    dbg_tiles_ptr: gl.tensor
    M: gl.tensor
    N: gl.tensor
    K: gl.tensor
    FMT: gl.constexpr
    G2: gl.constexpr
    BLOCK_M: gl.constexpr
    BLOCK_N: gl.constexpr
    BLOCK_K: gl.constexpr
    BLOCK_R: gl.constexpr
    GROUP_M: gl.constexpr
    HAS_LOWRANK: gl.constexpr
    HAS_COL_SCALE: gl.constexpr
    HAS_BIAS: gl.constexpr
    EPI_TMA: gl.constexpr
    DEBUG: gl.constexpr
    DEBUG_ITERS: gl.constexpr
    DEBUG_TILES: gl.constexpr
    SCALE_TMA: gl.constexpr
    SWAR: gl.constexpr
    F8: gl.constexpr
    PAIRED: gl.constexpr
    EXPANDERS: gl.constexpr
    INFLIGHT: gl.constexpr
    COOP: gl.constexpr
    WS_PERM: gl.constexpr
    A8: gl.constexpr
    TRANS: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, x_desc, w_desc, s_desc, b_desc, out_desc, x_bufs, w_bufs, xp_bufs, wp_bufs, s_bufs, b_bufs, epi_bufs, sc_desc, sw_desc, sx_bufs, sw_bufs, main, raw, lowrank, order, out_ptr, stride_om, xscale_ptr, wscale_ptr, wmult_ptr, col_scale_ptr, bias_ptr, dbg_ptr, dbg_tiles_ptr, M, N, K, FMT, G2, BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_R, GROUP_M, HAS_LOWRANK, HAS_COL_SCALE, HAS_BIAS, EPI_TMA, DEBUG, DEBUG_ITERS, DEBUG_TILES, SCALE_TMA, SWAR, F8, PAIRED, EXPANDERS, INFLIGHT, COOP, WS_PERM, A8, TRANS):
        self.x_desc = x_desc
        self.w_desc = w_desc
        self.s_desc = s_desc
        self.b_desc = b_desc
        self.out_desc = out_desc
        self.x_bufs = x_bufs
        self.w_bufs = w_bufs
        self.xp_bufs = xp_bufs
        self.wp_bufs = wp_bufs
        self.s_bufs = s_bufs
        self.b_bufs = b_bufs
        self.epi_bufs = epi_bufs
        self.sc_desc = sc_desc
        self.sw_desc = sw_desc
        self.sx_bufs = sx_bufs
        self.sw_bufs = sw_bufs
        self.main = main
        self.raw = raw
        self.lowrank = lowrank
        self.order = order
        self.out_ptr = out_ptr
        self.stride_om = stride_om
        self.xscale_ptr = xscale_ptr
        self.wscale_ptr = wscale_ptr
        self.wmult_ptr = wmult_ptr
        self.col_scale_ptr = col_scale_ptr
        self.bias_ptr = bias_ptr
        self.dbg_ptr = dbg_ptr
        self.dbg_tiles_ptr = dbg_tiles_ptr
        self.M = M
        self.N = N
        self.K = K
        self.FMT = gl.constexpr(FMT)
        self.G2 = gl.constexpr(G2)
        self.BLOCK_M = gl.constexpr(BLOCK_M)
        self.BLOCK_N = gl.constexpr(BLOCK_N)
        self.BLOCK_K = gl.constexpr(BLOCK_K)
        self.BLOCK_R = gl.constexpr(BLOCK_R)
        self.GROUP_M = gl.constexpr(GROUP_M)
        self.HAS_LOWRANK = gl.constexpr(HAS_LOWRANK)
        self.HAS_COL_SCALE = gl.constexpr(HAS_COL_SCALE)
        self.HAS_BIAS = gl.constexpr(HAS_BIAS)
        self.EPI_TMA = gl.constexpr(EPI_TMA)
        self.DEBUG = gl.constexpr(DEBUG)
        self.DEBUG_ITERS = gl.constexpr(DEBUG_ITERS)
        self.DEBUG_TILES = gl.constexpr(DEBUG_TILES)
        self.SCALE_TMA = gl.constexpr(SCALE_TMA)
        self.SWAR = gl.constexpr(SWAR)
        self.F8 = gl.constexpr(F8)
        self.PAIRED = gl.constexpr(PAIRED)
        self.EXPANDERS = gl.constexpr(EXPANDERS)
        self.INFLIGHT = gl.constexpr(INFLIGHT)
        self.COOP = gl.constexpr(COOP)
        self.WS_PERM = gl.constexpr(WS_PERM)
        self.A8 = gl.constexpr(A8)
        self.TRANS = gl.constexpr(TRANS)


@gluon.constexpr_function
def _tile_m(block_m, coop):
    # COOP: the CTA's tile is two consumers' row blocks over one shared weight tile
    return 2 * block_m if coop else block_m


@gluon.jit
def _scheduler(p):
    return GroupedTileScheduler.initialize(p.M, p.N, _tile_m(p.BLOCK_M, p.COOP), p.BLOCK_N, p.GROUP_M)


@gluon.jit
def _rows(p, bufs, C: gl.constexpr):
    """This consumer's BLOCK_M rows of a MAIN/LOWRANK slot: all of it, or (COOP) consumer C's half."""
    if p.COOP:
        return bufs.slice(C * p.BLOCK_M, p.BLOCK_M, dim=0)
    else:
        return bufs


@gluon.jit
def _load_step(p, main, raw, off_m, off_n, kk, it):
    """One K step of one tile: the MAIN fill the loader owns (x for 2l / F8, scale rows with SCALE_TMA)
    and the RAW packed tiles. Returns the advanced (main, raw, it)."""
    BK: gl.constexpr = p.BLOCK_K
    if p.DEBUG:   # the ring whose slots this role fills last: RAW, or MAIN when nothing goes through RAW
        if p.EXPANDERS == 0:
            debug_record(p.dbg_ptr, ROLE_LOADER, it, main, p.DEBUG_ITERS)
        else:
            debug_record(p.dbg_ptr, ROLE_LOADER, it, raw, p.DEBUG_ITERS)
    it += 1
    # The loader's share of a MAIN fill: 8-bit activations (2l, F8) and, for g with SCALE_TMA, the group's scale
    # rows — they ride in the slot the consumer reads them from (a DRAM round trip per K step on the consumer's
    # critical path otherwise). 1-D boxes: a box running past its row reads the next row's values into
    # rows/columns that are never stored (their operands are TMA zero fill); past the end: zeros.
    X_IN_MAIN: gl.constexpr = p.FMT == _FMT_INT4_2L or p.F8
    ROWS_IN_MAIN: gl.constexpr = p.SCALE_TMA and p.FMT != _FMT_INT4_2L and not p.TRANS
    W_IN_MAIN: gl.constexpr = p.EXPANDERS == 0   # the weights come pre-expanded (e4m3 offset nibbles)
    NX: gl.constexpr = 0 if p.A8 else (2 if p.F8 else 1)   # x rows per group: F8 a and b; int8 g the x_scale row;
                                                           # A8 none (its per-token scale waits for the epilogue)
    if X_IN_MAIN or ROWS_IN_MAIN:
        p.main.producer_acquire(main)
        bar = p.main.ready_bar(main)
        if ROWS_IN_MAIN:
            mbarrier.expect(bar, X_IN_MAIN * p.x_desc.block_type.nbytes + NX * p.sc_desc.block_type.nbytes
                            + p.sw_desc.block_type.nbytes + W_IN_MAIN * p.w_desc.block_type.nbytes)
            for j in gl.static_range(NX):
                tma.async_copy_global_to_shared(p.sc_desc, [(NX * kk + j) * p.M + off_m], bar,
                                                p.sx_bufs.index(NX * main.index + j))
            tma.async_copy_global_to_shared(p.sw_desc, [kk * p.N + off_n], bar, p.sw_bufs.index(main.index))
        else:
            mbarrier.expect(bar, p.x_desc.block_type.nbytes + W_IN_MAIN * p.w_desc.block_type.nbytes)
        if X_IN_MAIN:
            tma.async_copy_global_to_shared(p.x_desc, [off_m, kk * BK], bar, p.x_bufs.index(main.index))
        if W_IN_MAIN:
            tma.async_copy_global_to_shared(p.w_desc, [off_n, kk * BK], bar, p.w_bufs.index(main.index))
        main = main.next()
    if W_IN_MAIN:
        return main, raw, it
    p.raw.producer_acquire(raw)
    bar = p.raw.ready_bar(raw)
    if p.FMT == _FMT_INT4_2L and p.SCALE_TMA:
        # the multipliers u of this K step's level-2 groups, for the expander
        UR: gl.constexpr = _u_rows(BK, p.G2)
        mbarrier.expect(bar, p.w_desc.block_type.nbytes + UR * p.sc_desc.block_type.nbytes)
        for j in gl.static_range(UR):
            tma.async_copy_global_to_shared(p.sc_desc, [((kk * BK) // p.G2 + j) * p.N + off_n], bar,
                                            p.sx_bufs.index(raw.index * UR + j))
    elif X_IN_MAIN:
        mbarrier.expect(bar, p.w_desc.block_type.nbytes)
    else:   # int8 g: the packed activations are expanded in SMEM too
        mbarrier.expect(bar, p.w_desc.block_type.nbytes + p.x_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(p.x_desc, [off_m, kk * (BK // 2)], bar, p.xp_bufs.index(raw.index))
    tma.async_copy_global_to_shared(p.w_desc, [off_n, kk * (BK // 2)], bar, p.wp_bufs.index(raw.index))
    raw = raw.next()
    return main, raw, it


@gluon.jit
def _load_tile_head(p, sched, t, lr):
    """Per tile, before its K steps: (DEBUG) record the tile, then fill its LOWRANK slot (consumed last,
    so it has time to land). Returns (off_m, off_n, lr)."""
    pid_m, pid_n = sched.get_tile(t)
    off_m = pid_m * _tile_m(p.BLOCK_M, p.COOP)
    off_n = pid_n * p.BLOCK_N
    if p.DEBUG:
        if t < p.DEBUG_TILES:
            tb = p.dbg_tiles_ptr + (gl.program_id(0) * p.DEBUG_TILES + t) * 2
            gl.store(tb, pid_m)
            gl.store(tb + 1, pid_n)
    if p.HAS_LOWRANK:
        p.lowrank.producer_acquire(lr)
        bar = p.lowrank.ready_bar(lr)
        mbarrier.expect(bar, p.s_desc.block_type.nbytes + p.b_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(p.s_desc, [off_m, 0], bar, p.s_bufs.index(lr.index))
        tma.async_copy_global_to_shared(p.b_desc, [off_n, 0], bar, p.b_bufs.index(lr.index))
        lr = lr.next()
    return off_m, off_n, lr


@gluon.jit
def _loader_partition(p):
    """TMA only: per tile the LOWRANK slot, then per K step the MAIN x tile (2l / F8) and the RAW packed
    tiles. PAIRED: tiles go in pairs (t, t+1) whose K steps interleave on MAIN — the order the two
    consumers, one tile each, consume them concurrently."""
    sched = _scheduler(p)
    k_tiles = gl.cdiv(p.K, p.BLOCK_K)
    main = producer_state(p.main.num_stages)
    raw = producer_state(p.raw.num_stages)
    lr = producer_state(p.lowrank.num_stages)
    it = 0
    n_tiles = sched.get_num_tiles()
    if p.PAIRED:
        for t in range(0, n_tiles, 2):
            off_m, off_n, lr = _load_tile_head(p, sched, t, lr)
            has1 = t + 1 < n_tiles
            off_m1 = off_m
            off_n1 = off_n
            if has1:
                off_m1, off_n1, lr = _load_tile_head(p, sched, t + 1, lr)
            for kk in range(k_tiles):
                main, raw, it = _load_step(p, main, raw, off_m, off_n, kk, it)
                if has1:
                    main, raw, it = _load_step(p, main, raw, off_m1, off_n1, kk, it)
    else:
        for t in range(n_tiles):
            off_m, off_n, lr = _load_tile_head(p, sched, t, lr)
            for kk in range(k_tiles):
                main, raw, it = _load_step(p, main, raw, off_m, off_n, kk, it)


@gluon.jit
def _nibbles(packed, u, HAS_U: gl.constexpr, SWAR: gl.constexpr):
    """(low, high) sign-extended nibbles of ``packed`` int8 [R, C], × ``u`` [R] when HAS_U. SWAR: four bytes
    per instruction (kernels/int4_unpack.py explains the byte arithmetic and the same-row assumption)."""
    if SWAR:
        if HAS_U:
            ub = u[:, None]
            lo = gl.inline_asm_elementwise(LO_MUL_ASM, "=r,r,r", [packed, ub], dtype=gl.int8, is_pure=True, pack=4)
            hi = gl.inline_asm_elementwise(HI_MUL_ASM, "=r,r,r", [packed, ub], dtype=gl.int8, is_pure=True, pack=4)
        else:
            lo = gl.inline_asm_elementwise(LO_ASM, "=r,r", [packed], dtype=gl.int8, is_pure=True, pack=4)
            hi = gl.inline_asm_elementwise(HI_ASM, "=r,r", [packed], dtype=gl.int8, is_pure=True, pack=4)
    else:
        lo = (packed << 4) >> 4     # arithmetic shifts sign-extend the two's-complement nibbles
        hi = packed >> 4
        if HAS_U:
            lo = lo * u[:, None]
            hi = hi * u[:, None]
    return lo, hi


@gluon.jit
def _offset_nibbles_f8(packed, SWAR: gl.constexpr):
    """(low, high) OFFSET nibbles n' = q + 8 of ``packed`` int8 as e4m3 bit patterns (= n'·2⁻⁹): one LOP3 per four
    bytes (two for the high nibbles), kernels/int4_unpack.py. Layout-agnostic (no per-row operand)."""
    if SWAR:
        lo = gl.inline_asm_elementwise(LO_OFFSET_ASM, "=r,r", [packed], dtype=gl.int8, is_pure=True, pack=4)
        hi = gl.inline_asm_elementwise(HI_OFFSET_ASM, "=r,r", [packed], dtype=gl.int8, is_pure=True, pack=4)
    else:
        lo = (packed & 0x0F) ^ 0x08
        hi = ((packed >> 4) & 0x0F) ^ 0x08
    return lo.to(gl.float8e4nv, bitcast=True), hi.to(gl.float8e4nv, bitcast=True)


@gluon.jit
def _expand_into(dst, src, layout: gl.constexpr, ROWS: gl.constexpr, BK: gl.constexpr, mult_ptrs, mult_mask, k0,
                 G2: gl.constexpr, mult_stride, u_smem, u_slot, SWAR: gl.constexpr):
    """dst [ROWS, BK] int8 ← int4 nibbles of src [ROWS, BK/2] uint8; 2l only (``mult_ptrs`` not None):
    × u[g, row] with g = level-2 group of each 64-wide block, read from ``u_smem`` rows u_slot·UR + j (the
    RAW slot's TMA copy of u rows k0/G2 + j) when given, else from global memory through ``mult_ptrs`` [ROWS]
    (pointing at u[0, rows]). In each 64-wide K block b, source byte j holds k = 64b + j (low) and
    64b + 32 + j (high): the two nibble tiles go to two 32-column slices of dst, no register shuffles."""
    for b in gl.static_range(BK // _PACK):
        packed = src.slice(b * (_PACK // 2), _PACK // 2, dim=1).load(layout).to(gl.int8, bitcast=True)
        if mult_ptrs is not None:
            # A tile of BK > G2 spans several level-2 groups (one u row each); a 64-wide block never
            # straddles two (G2 % 64 == 0). One u row per whole tile was the H200 r3 error (0.579).
            if u_smem is not None:
                j = (k0 + b * _PACK) // G2 - k0 // G2
                u = u_smem.index(u_slot * _u_rows(BK, G2) + j).load(gl.SliceLayout(1, layout)).to(gl.int8)
            else:
                g = (k0 + b * _PACK) // G2
                u = gl.load(mult_ptrs + g * mult_stride, mask=mult_mask, other=0).to(gl.int8)   # u ≤ 15
            lo, hi = _nibbles(packed, u, True, SWAR)
        else:
            lo, hi = _nibbles(packed, packed, False, SWAR)
        dst.slice(b * _PACK, _PACK // 2, dim=1).store(lo)
        dst.slice(b * _PACK + _PACK // 2, _PACK // 2, dim=1).store(hi)


@gluon.jit
def _expand_offset_into(dst, src, layout: gl.constexpr, BK: gl.constexpr, SWAR: gl.constexpr):
    """dst [ROWS, BK] e4m3 ← offset nibbles n' = q + 8 of src [ROWS, BK/2] uint8 (F8 path, module doc): the
    bit pattern n' ∈ [0, 15] IS the e4m3 encoding of n'·2⁻⁹, so one LOP3 per four bytes (two for the high
    nibbles) expands them. Same block layout as :func:`_expand_into`."""
    for b in gl.static_range(BK // _PACK):
        packed = src.slice(b * (_PACK // 2), _PACK // 2, dim=1).load(layout).to(gl.int8, bitcast=True)
        lo, hi = _offset_nibbles_f8(packed, SWAR)
        dst.slice(b * _PACK, _PACK // 2, dim=1).store(lo)
        dst.slice(b * _PACK + _PACK // 2, _PACK // 2, dim=1).store(hi)


@gluon.jit
def _expander_f8_strided(p, E: gl.constexpr):
    """Expander E of two (EXPANDERS=2, F8 only): MAIN/RAW uses E, E+2, … of the flat K-step sequence. The f8
    expansion needs no tile information, so a step is just a slot pair; both expanders trace into the
    expander row at the global use number, which makes the combined trace the single expander's."""
    nw: gl.constexpr = gl.num_warps()
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [nw, 1], [1, 0])
    sched = GroupedTileScheduler.initialize(p.M, p.N, p.BLOCK_M, p.BLOCK_N, p.GROUP_M)
    steps = sched.get_num_tiles() * gl.cdiv(p.K, p.BLOCK_K)
    raw = consumer_state(p.raw.num_stages).advance(E)
    main = producer_state(p.main.num_stages).advance(E)
    for s in range(E, steps, 2):
        if p.DEBUG:
            debug_record(p.dbg_ptr, ROLE_EXPANDER, s, main, p.DEBUG_ITERS)
        p.raw.consumer_wait(raw)
        p.main.producer_acquire(main)
        _expand_offset_into(p.w_bufs.index(main.index), p.wp_bufs.index(raw.index), layout, p.BLOCK_K, p.SWAR)
        fence_async_shared()
        p.raw.consumer_release(raw)
        p.main.producer_commit(main)
        raw = raw.advance(2)
        main = main.advance(2)


@gluon.jit
def _expander1(p):
    _expander_f8_strided(p, 1)


@gluon.jit
def _expander_partition(p):
    BK: gl.constexpr = p.BLOCK_K
    BN: gl.constexpr = p.BLOCK_N
    nw: gl.constexpr = gl.num_warps()
    # 16 contiguous bytes per thread: one 128-bit shared load per thread per 32-byte row slice.
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [nw, 1], [1, 0])
    sched = GroupedTileScheduler.initialize(p.M, p.N, p.BLOCK_M, p.BLOCK_N, p.GROUP_M)
    k_tiles = gl.cdiv(p.K, BK)
    if p.EXPANDERS == 2:
        _expander_f8_strided(p, 0)
        return
    raw = consumer_state(p.raw.num_stages)
    main = producer_state(p.main.num_stages)
    it = 0
    for t in range(sched.get_num_tiles()):
        pid_m, pid_n = sched.get_tile(t)
        off_n = pid_n * BN
        for kk in range(k_tiles):
            if p.DEBUG:
                debug_record(p.dbg_ptr, ROLE_EXPANDER, it, main, p.DEBUG_ITERS)
            it += 1
            p.raw.consumer_wait(raw)
            p.main.producer_acquire(main)
            if p.FMT == _FMT_INT4_2L:
                offs_n = off_n + gl.arange(0, BN, gl.SliceLayout(1, layout))
                if p.SCALE_TMA:
                    u_smem = p.sx_bufs
                else:
                    u_smem = None
                _expand_into(p.w_bufs.index(main.index), p.wp_bufs.index(raw.index), layout, BN, BK,
                             p.wmult_ptr + offs_n, offs_n < p.N, kk * BK, p.G2, p.N, u_smem, raw.index, p.SWAR)
            elif p.F8:
                _expand_offset_into(p.w_bufs.index(main.index), p.wp_bufs.index(raw.index), layout, BK, p.SWAR)
            else:
                _expand_into(p.w_bufs.index(main.index), p.wp_bufs.index(raw.index), layout, BN, BK,
                             None, None, 0, p.G2, 0, None, 0, p.SWAR)
                _expand_into(p.x_bufs.index(main.index), p.xp_bufs.index(raw.index), layout, p.BLOCK_M, BK,
                             None, None, 0, p.G2, 0, None, 0, p.SWAR)
            # Generic-proxy SMEM reads of RAW and writes of MAIN must be ordered before the async
            # proxy (next TMA fill of RAW, wgmma reads of MAIN): one fence covers both.
            fence_async_shared()
            p.raw.consumer_release(raw)
            p.main.producer_commit(main)
            raw = raw.next()
            main = main.next()


@gluon.jit
def _mainloop_2l(p, main, mma: gl.constexpr, k_tiles, it, ROLE: gl.constexpr):
    """int32 accumulation straight through K, one wgmma in flight (slot released one step late).
    The slot to release is recomputed from ``main`` (``prev()``), never kept in a ``prev = main``
    variable: that alias is not loop-carried (skeleton docstring, loop-carry pitfall) — every release
    then hit the tile's first slot, and the ring hung as soon as k_tiles > STAGES (H200 r4–r7)."""
    acc = gl.zeros([p.BLOCK_M, p.BLOCK_N], gl.int32, mma)
    for kk in range(k_tiles):
        it = consumer_step(p, main, ROLE, it)
        tok = warpgroup_mma(p.x_bufs.index(main.index), p.w_bufs.index(main.index).permute((1, 0)), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(1, deps=(tok, ))
        p.main.consumer_release(main.prev(), pred=kk > 0)   # step kk-1's wgmma has retired
        main = main.next()
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    p.main.consumer_release(main.prev())                     # the last step's slot
    return acc.to(gl.float32), main, it


@gluon.jit
def _next_use(p, main, stride):
    # PAIRED: this consumer's K steps are every other MAIN use while its tile's partner exists
    if p.PAIRED:
        return main.advance(stride)
    else:
        return main.next()


@gluon.jit
def _mainloop_g(p, main, mma: gl.constexpr, k_tiles, off_m, off_n, it, ROLE: gl.constexpr, stride):
    """One K step = one group: int32 partial, then fp32 acc += partial ⊙ xs ⊗ ws. The scale loads
    are issued while the wgmma runs; the other consumer's MMA overlaps this one's rescale."""
    offs_m = off_m + gl.arange(0, p.BLOCK_M, gl.SliceLayout(1, mma))
    offs_n = off_n + gl.arange(0, p.BLOCK_N, gl.SliceLayout(0, mma))
    acc = gl.zeros([p.BLOCK_M, p.BLOCK_N], gl.float32, mma)
    part = gl.zeros([p.BLOCK_M, p.BLOCK_N], gl.int32, mma)   # loop-carried so its registers are reused
    for kk in range(k_tiles):
        it = consumer_step(p, main, ROLE, it)
        tok = warpgroup_mma(p.x_bufs.index(main.index), p.w_bufs.index(main.index).permute((1, 0)), part,
                            use_acc=False, is_async=True)
        if p.SCALE_TMA:   # landed with the slot (rows past M / N read as 0 from TMA's zero fill)
            xs = p.sx_bufs.index(main.index).load(gl.SliceLayout(1, mma)).to(gl.float32)
            ws = p.sw_bufs.index(main.index).load(gl.SliceLayout(0, mma)).to(gl.float32)
            fence_async_shared()    # plain reads before a TMA refill (skeleton.reads_done_before_refill)
        else:
            xs = gl.load(p.xscale_ptr + kk * p.M + offs_m, mask=offs_m < p.M, other=0.0).to(gl.float32)
            ws = gl.load(p.wscale_ptr + kk * p.N + offs_n, mask=offs_n < p.N, other=0.0).to(gl.float32)
        part = warpgroup_mma_wait(0, deps=(tok, ))
        p.main.consumer_release(main)
        main = _next_use(p, main, stride)
        acc = acc + part.to(gl.float32) * (xs[:, None] * ws[None, :])
    return acc, main, it


@gluon.jit
def _mainloop_g_f8(p, main, mma: gl.constexpr, k_tiles, off_m, off_n, it, ROLE: gl.constexpr, stride):
    """F8 variant of :func:`_mainloop_g` (module doc): the e4m3 wgmma returns the fp32 partial
    P' = 2⁻⁹·Σ q_x·(q_w + 8); acc += fma(P', a, b) · ws — two FFMAs per element, no I2F."""
    offs_m = off_m + gl.arange(0, p.BLOCK_M, gl.SliceLayout(1, mma))
    offs_n = off_n + gl.arange(0, p.BLOCK_N, gl.SliceLayout(0, mma))
    acc = gl.zeros([p.BLOCK_M, p.BLOCK_N], gl.float32, mma)
    part = gl.zeros([p.BLOCK_M, p.BLOCK_N], gl.float32, mma)
    C: gl.constexpr = 1 if ROLE == ROLE_CONSUMER1 else 0
    for kk in range(k_tiles):
        it = consumer_step(p, main, ROLE, it)
        tok = warpgroup_mma(_rows(p, p.x_bufs.index(main.index), C), p.w_bufs.index(main.index).permute((1, 0)),
                            part, use_acc=False, is_async=True)
        if p.SCALE_TMA:
            xa, xb, ws = _f8_rows(p, main.index, mma, C)
            fence_async_shared()    # skeleton.reads_done_before_refill's rule; here it waits while the MMA runs
        else:
            xa = gl.load(p.xscale_ptr + (2 * kk) * p.M + offs_m, mask=offs_m < p.M, other=0.0)
            xb = gl.load(p.xscale_ptr + (2 * kk + 1) * p.M + offs_m, mask=offs_m < p.M, other=0.0)
            ws = gl.load(p.wscale_ptr + kk * p.N + offs_n, mask=offs_n < p.N, other=0.0).to(gl.float32)
        part = warpgroup_mma_wait(0, deps=(tok, ))
        p.main.consumer_release(main)
        main = _next_use(p, main, stride)
        acc = _f8_fold_rows(acc, part, xa, xb, ws)
    return acc, main, it


@gluon.jit
def _f8_rows(p, slot, mma: gl.constexpr, C: gl.constexpr):
    """The slot's xab rows (this consumer's) and w_scale row (TMA'd with it), in registers."""
    xa = _rows(p, p.sx_bufs.index(2 * slot), C).load(gl.SliceLayout(1, mma))
    xb = _rows(p, p.sx_bufs.index(2 * slot + 1), C).load(gl.SliceLayout(1, mma))
    if p.WS_PERM:     # the row holds each thread's columns contiguously (ws_row_order): 128-bit loads
        ws = p.sw_bufs.index(slot)._reinterpret(gl.float32, [p.BLOCK_N], _ws_perm_layout(p.BLOCK_N)).load(
            gl.SliceLayout(0, mma))
    else:
        ws = p.sw_bufs.index(slot).load(gl.SliceLayout(0, mma)).to(gl.float32)
    return xa, xb, ws


@gluon.constexpr_function
def _ws_perm_layout(block_n):
    """Column c = 8j + 2q + e of a wgmma accumulator row (j < BN/8, q: the lane's quad position, e < 2) sits at
    position o = e + 2·(j mod 2) + 4q + 16·(j div 2) of a permuted w_scale row (:func:`ws_row_order`): a thread's
    columns come in runs of four (one 128-bit load each), and the four quad positions' runs are adjacent, so one
    load instruction reads 64 contiguous bytes (no bank conflict; a thread's BN/4 columns in ONE run put the quads
    128 bytes apart — the same banks — and ran 2× slower). Like every Triton layout this maps the hardware location to
    the logical index: ``offset_bases[i]`` is the column at position 2^i — bit 0 → e, bit 1 → j's low bit, bits 2–3
    → q, the rest → j's high bits. (Written the other way round, column → position, it read the wrong scales: the GPU
    bit-identity tests caught it.)"""
    bases = [[1], [8], [2], [4]] + [[16 << i] for i in range((block_n // 16).bit_length() - 1)]
    return gl.SharedLinearLayout(offset_bases=bases)


@gluon.jit
def _f8_issue(p, st, part, C: gl.constexpr):
    """The e4m3 wgmma of the group in slot ``st`` into ``part``'s registers (use_acc=False), left in flight."""
    return warpgroup_mma(_rows(p, p.x_bufs.index(st.index), C), p.w_bufs.index(st.index).permute((1, 0)), part,
                         use_acc=False, is_async=True)


@gluon.jit
def _f8_fold(p, acc, part, slot, mma: gl.constexpr, C: gl.constexpr):
    """acc += fma(P', a, b) · ws with the rows of ``slot`` — plain loads: the slot goes back to the loader only
    behind ``fence_async_shared()`` (the rule: skeleton.reads_done_before_refill). A8: acc += P · ws, one FFMA."""
    if p.A8:
        ws = p.sw_bufs.index(slot).load(gl.SliceLayout(0, mma)).to(gl.float32)
        acc = gl.fma(part, ws[None, :], acc)
    else:
        xa, xb, ws = _f8_rows(p, slot, mma, C)
        acc = _f8_fold_rows(acc, part, xa, xb, ws)
    return acc


@gluon.jit
def _f8_fold_rows(acc, part, xa, xb, ws):
    # two FFMAs per element: P' scaled and the weights' offset undone per row (a, b), then the column scale
    return gl.fma(gl.fma(part, xa[:, None], xb[:, None]), ws[None, :], acc)


@gluon.jit
def _f8_retire(p, acc, part, tok, st, last, it, WAIT: gl.constexpr, REFILL: gl.constexpr, ROLE: gl.constexpr, stride,
               mma: gl.constexpr, C: gl.constexpr):
    """One step of :func:`_f8_chain`: fold the group in slot ``st`` into ``acc`` once its MMA retired (``WAIT`` groups
    may stay in flight), then (``REFILL``) issue the slot use after ``last`` into the partial just freed. Returns
    (acc, part, its token, the partial's slot, the last slot issued, it)."""
    part = warpgroup_mma_wait(WAIT, deps=(tok, ))
    acc = _f8_fold(p, acc, part, st.index, mma, C)
    if REFILL:
        st = _next_use(p, last, stride)
        it = consumer_step(p, st, ROLE, it)
        tok = _f8_issue(p, st, part, C)
        last = st
    return acc, part, tok, st, last, it


@gluon.jit
def _f8_chain(p, main, acc, pa, pb, it, G: gl.constexpr, ROLE: gl.constexpr, stride, mma: gl.constexpr,
              C: gl.constexpr):
    """G consecutive groups with one MMA always in flight: groups 0 and 1 are issued into ``pa`` / ``pb``; group j is
    rescaled once its MMA retired (``wait(1)``: group j+1's still runs), and group j+2 is issued into the partial j
    just freed. So only the last fold of the G runs with no MMA of this consumer behind it (half of them in pairs,
    G = 2). Nothing is in flight when it returns: carrying an MMA over a loop's back edge (or handing one register
    set from step to step) made the compiler copy an accumulator in flight, and ptxas then serialized every wgmma
    (C7514) — measured 17 % slower than no overlap at all (NOTES.md, session 23). Slots go back in pairs, after the
    pair's second fold, behind one proxy fence for both slots' row reads (skeleton.reads_done_before_refill's rule):
    a fence per slot cost 3–6 % at fc1 / fc2 (NOTES.md, session 24). Groups fold in order, so any G gives the same
    bits. Returns (acc, pa, pb, the next slot use, it)."""
    sa = main
    it = consumer_step(p, sa, ROLE, it)
    ta = _f8_issue(p, sa, pa, C)
    last = sa
    sb = sa
    tb = ta
    if G > 1:
        sb = _next_use(p, sa, stride)
        it = consumer_step(p, sb, ROLE, it)
        tb = _f8_issue(p, sb, pb, C)
        last = sb
    rel = sa
    for j in gl.static_range(G):
        if j % 2 == 0:
            rel = sa
            acc, pa, ta, sa, last, it = _f8_retire(p, acc, pa, ta, sa, last, it, 0 if j == G - 1 else 1, j + 2 < G,
                                                   ROLE, stride, mma, C)
            if j == G - 1:               # odd G: the last group goes back alone
                fence_async_shared()
                p.main.consumer_release(rel)
        else:
            done = sb
            acc, pb, tb, sb, last, it = _f8_retire(p, acc, pb, tb, sb, last, it, 0 if j == G - 1 else 1, j + 2 < G,
                                                   ROLE, stride, mma, C)
            fence_async_shared()         # one fence for the pair's row reads, after both folds
            p.main.consumer_release(rel)
            p.main.consumer_release(done)
    return acc, pa, pb, _next_use(p, last, stride), it


@gluon.jit
def _mainloop_g_f8_inflight(p, main, mma: gl.constexpr, k_tiles, it, ROLE: gl.constexpr, stride):
    """:func:`_mainloop_g_f8` with two fp32 partials (``pa``, ``pb``: the register room EXPANDERS=0 frees) and
    ``p.INFLIGHT`` groups per loop body (:func:`_f8_chain`): each group's rescale runs while the next group's MMA
    does. The K steps left over run in pairs, then alone."""
    C: gl.constexpr = 1 if ROLE == ROLE_CONSUMER1 else 0
    acc = gl.zeros([p.BLOCK_M, p.BLOCK_N], gl.float32, mma)
    pa = gl.zeros([p.BLOCK_M, p.BLOCK_N], gl.float32, mma)
    pb = gl.zeros([p.BLOCK_M, p.BLOCK_N], gl.float32, mma)
    G: gl.constexpr = p.INFLIGHT
    for i in range(k_tiles // G):
        acc, pa, pb, main, it = _f8_chain(p, main, acc, pa, pb, it, G, ROLE, stride, mma, C)
    if G > 2:
        for i in range((k_tiles % G) // 2):
            acc, pa, pb, main, it = _f8_chain(p, main, acc, pa, pb, it, 2, ROLE, stride, mma, C)
    for i in range(k_tiles % 2):             # an odd step count leaves one group, run alone
        acc, pa, pb, main, it = _f8_chain(p, main, acc, pa, pb, it, 1, ROLE, stride, mma, C)
    return acc, main, it


@gluon.jit
def _a8t_issue(p, st, part, kk, offs_m, C: gl.constexpr):
    """TRANS: group ``kk``'s wgmma into ``part`` (left in flight) and its weight scales for this consumer's rows,
    loaded from global memory into registers (two per thread: the rows are the weights) while the MMA runs."""
    tok = warpgroup_mma(_rows(p, p.x_bufs.index(st.index), C), p.w_bufs.index(st.index).permute((1, 0)), part,
                        use_acc=False, is_async=True)
    ws = gl.load(p.wscale_ptr + kk * p.M + offs_m, mask=offs_m < p.M, other=0.0).to(gl.float32)
    return tok, ws


@gluon.jit
def _settled(x):
    """``x`` through an empty volatile asm: its producers (a fold's FFMAs) stay before the next wgmma issue, which is
    volatile too. Nothing else orders them on the trans route (no shared-memory read, no fence in its fold): LLVM sank
    all four folds of a four-group body below the refills, so four partials were live at once — ptxas serialized
    every wgmma (C7512) and spilled ~2.7 KB per thread (NOTES.md, session 42). No instruction in the SASS."""
    return gl.inline_asm_elementwise("", "=r,0", [x], dtype=gl.float32, is_pure=False, pack=1)


@gluon.jit
def _a8t_retire(p, acc, part, tok, ws, st, last, it, kk, offs_m, WAIT: gl.constexpr, REFILL: gl.constexpr,
                ROLE: gl.constexpr, stride, C: gl.constexpr):
    """One step of :func:`_a8t_chain`: fold the group in ``part`` once its MMA retired (``WAIT`` groups may stay in
    flight), give its slot back, then (``REFILL``) issue group ``kk`` into the partial just freed. Returns (acc,
    part, its token, its scales, its slot, the last slot issued, it)."""
    part = warpgroup_mma_wait(WAIT, deps=(tok, ))
    acc = gl.fma(part, ws[:, None], acc)
    if REFILL:                 # the partial's registers are reused next: the fold must be done first
        acc = _settled(acc)
    p.main.consumer_release(st)
    if REFILL:
        st = _next_use(p, last, stride)
        it = consumer_step(p, st, ROLE, it)
        tok, ws = _a8t_issue(p, st, part, kk, offs_m, C)
        last = st
    return acc, part, tok, ws, st, last, it


@gluon.jit
def _a8t_chain(p, main, acc, pa, pb, it, kk, offs_m, G: gl.constexpr, ROLE: gl.constexpr, stride,
               C: gl.constexpr):
    """TRANS (per-token e4m3 activations, the kernel computing Yᵀ): :func:`_f8_chain`'s order — G groups, the
    next group's MMA in flight while the previous one folds — with one FFMA per element (acc += P · ws[row]) and
    each slot released as soon as its MMA retired: nothing reads a slot with plain loads (the scales come from
    global memory), so no proxy fence — and nothing but :func:`_settled` keeps a fold ahead of the next refill.
    Nothing is in flight when it returns."""
    sa = main
    it = consumer_step(p, sa, ROLE, it)
    ta, wa = _a8t_issue(p, sa, pa, kk, offs_m, C)
    last = sa
    sb = sa
    tb = ta
    wb = wa
    if G > 1:
        sb = _next_use(p, sa, stride)
        it = consumer_step(p, sb, ROLE, it)
        tb, wb = _a8t_issue(p, sb, pb, kk + 1, offs_m, C)
        last = sb
    for j in gl.static_range(G):
        if j % 2 == 0:
            acc, pa, ta, wa, sa, last, it = _a8t_retire(p, acc, pa, ta, wa, sa, last, it, kk + j + 2, offs_m,
                                                        0 if j == G - 1 else 1, j + 2 < G, ROLE, stride, C)
        else:
            acc, pb, tb, wb, sb, last, it = _a8t_retire(p, acc, pb, tb, wb, sb, last, it, kk + j + 2, offs_m,
                                                        0 if j == G - 1 else 1, j + 2 < G, ROLE, stride, C)
    return acc, pa, pb, _next_use(p, last, stride), it


@gluon.jit
def _mainloop_a8t(p, main, mma: gl.constexpr, k_tiles, off_m, it, ROLE: gl.constexpr, stride):
    """:func:`_mainloop_g_f8_inflight` for TRANS (:func:`_a8t_chain`): bodies of ``p.INFLIGHT`` groups, the K steps
    left over in pairs, then alone."""
    C: gl.constexpr = 1 if ROLE == ROLE_CONSUMER1 else 0
    offs_m = off_m + gl.arange(0, p.BLOCK_M, gl.SliceLayout(1, mma))
    acc = gl.zeros([p.BLOCK_M, p.BLOCK_N], gl.float32, mma)
    pa = gl.zeros([p.BLOCK_M, p.BLOCK_N], gl.float32, mma)
    pb = gl.zeros([p.BLOCK_M, p.BLOCK_N], gl.float32, mma)
    G: gl.constexpr = p.INFLIGHT
    n_body = k_tiles // G
    for i in range(n_body):
        acc, pa, pb, main, it = _a8t_chain(p, main, acc, pa, pb, it, i * G, offs_m, G, ROLE, stride, C)
    kk = n_body * G
    if G > 2:
        for i in range((k_tiles % G) // 2):
            acc, pa, pb, main, it = _a8t_chain(p, main, acc, pa, pb, it, kk + 2 * i, offs_m, 2, ROLE, stride, C)
        kk += (k_tiles % G) // 2 * 2
    for i in range(k_tiles % 2):
        acc, pa, pb, main, it = _a8t_chain(p, main, acc, pa, pb, it, kk, offs_m, 1, ROLE, stride, C)
    return acc, main, it


@gluon.jit
def _store_trans(p, acc, off_m, off_n, CONSUMER: gl.constexpr, mma: gl.constexpr):
    """TRANS: the tile is Yᵀ (rows: output channels, columns: tokens) — + bias per row, then stored transposed into
    out [tokens, channels]: through this consumer's staging buffer [BLOCK_N, BLOCK_M] by TMA, or from registers."""
    offs_m = off_m + gl.arange(0, p.BLOCK_M, gl.SliceLayout(1, mma))
    if p.HAS_BIAS:
        bias = gl.load(p.bias_ptr + offs_m, mask=offs_m < p.M, other=0.0).to(gl.float32)
        acc = acc + bias[:, None]
    if p.EPI_TMA:
        epi = p.epi_bufs.index(CONSUMER)
        tma.store_wait(0)
        epi.store(gl.permute(acc.to(p.out_desc.dtype), (1, 0)))
        fence_async_shared()
        tma.async_copy_shared_to_global(p.out_desc, [off_n, off_m], epi)
    else:
        offs_n = off_n + gl.arange(0, p.BLOCK_N, gl.SliceLayout(0, mma))
        mask = (offs_m[:, None] < p.M) & (offs_n[None, :] < p.N)
        gl.store(p.out_ptr + offs_n[None, :] * p.stride_om + offs_m[:, None], acc.to(p.out_ptr.dtype.element_ty),
                 mask=mask)


@gluon.jit
def _epilogue(p, acc, lr, off_m, off_n, CONSUMER: gl.constexpr, mma: gl.constexpr):
    """row/col scales → + s·lora_upᵀ (bf16/fp16 wgmma, K = BLOCK_R) → + bias → store."""
    offs_m = off_m + gl.arange(0, p.BLOCK_M, gl.SliceLayout(1, mma))
    offs_n = off_n + gl.arange(0, p.BLOCK_N, gl.SliceLayout(0, mma))
    if p.FMT == _FMT_INT4_2L:
        xs = gl.load(p.xscale_ptr + offs_m, mask=offs_m < p.M, other=0.0).to(gl.float32)
        ws = gl.load(p.wscale_ptr + offs_n, mask=offs_n < p.N, other=0.0).to(gl.float32)
        acc = acc * xs[:, None] * ws[None, :]
    if p.A8 and not p.TRANS:     # the per-token scale t of the e4m3 activations (TRANS: the column scale)
        xs = gl.load(p.xscale_ptr + offs_m, mask=offs_m < p.M, other=0.0)
        acc = acc * xs[:, None]
    if p.HAS_COL_SCALE:
        cs = gl.load(p.col_scale_ptr + offs_n, mask=offs_n < p.N, other=0.0).to(gl.float32)
        acc = acc * cs[None, :]
    if p.HAS_LOWRANK:
        lr_dtype: gl.constexpr = p.b_desc.dtype
        mma16: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                        instr_shape=[16, p.BLOCK_N, 16])
        s_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma16, k_width=2)
        acc16 = gl.convert_layout(acc, mma16, assert_trivial=True)
        p.lowrank.consumer_wait(lr)
        s = _rows(p, p.s_bufs.index(lr.index), CONSUMER).load(s_layout).to(lr_dtype)  # rounded like an unfused s @ B.T
        acc16 = warpgroup_mma(s, p.b_bufs.index(lr.index).permute((1, 0)), acc16)
        p.lowrank.consumer_release(lr)
        acc = gl.convert_layout(acc16, mma, assert_trivial=True)
    if p.TRANS:
        _store_trans(p, acc, off_m, off_n, CONSUMER, mma)
    else:
        bias_and_store(p, acc, off_m, off_n, CONSUMER, mma)


@gluon.jit
def _consumer_partition(p, CONSUMER: gl.constexpr):
    """Local tiles CONSUMER, CONSUMER + 2, ...; the MAIN and LOWRANK rings are shared in tile order,
    so this consumer's states skip the other consumer's slot uses (PAIRED: MAIN in interleaved pair order)."""
    ROLE: gl.constexpr = ROLE_CONSUMER0 if CONSUMER == 0 else ROLE_CONSUMER1
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                  instr_shape=[16, p.BLOCK_N, 32])
    sched = _scheduler(p)
    k_tiles = gl.cdiv(p.K, p.BLOCK_K)
    n_tiles = sched.get_num_tiles()
    if p.COOP:
        _consumer_coop(p, sched, k_tiles, n_tiles, CONSUMER, ROLE, mma)
        return
    main = consumer_state(p.main.num_stages).advance(CONSUMER * k_tiles)
    lr = consumer_state(p.lowrank.num_stages).advance(CONSUMER)
    it = 0
    for t in range(CONSUMER, n_tiles, 2):
        pid_m, pid_n = sched.get_tile(t)
        off_m = pid_m * p.BLOCK_M
        off_n = pid_n * p.BLOCK_N
        if p.PAIRED:
            # both consumers run their K loops at once (one's rescale overlaps the other's MMA): tile pair
            # t//2 owns MAIN uses [pair·2·k_tiles, …), its K steps interleaved (stride 2; 1 for a lone last tile)
            pair = t // 2
            stride = gl.where(pair * 2 + 1 < n_tiles, 2, 1)
            main = consumer_state(p.main.num_stages).advance(pair * 2 * k_tiles + CONSUMER)
        else:
            stride = 1
            p.order.acquire(CONSUMER, t)     # the other consumer is done with tile t-1's MAIN slots
        if p.FMT == _FMT_INT4_2L:
            acc, main, it = _mainloop_2l(p, main, mma, k_tiles, it, ROLE)
        elif p.TRANS:
            acc, main, it = _mainloop_a8t(p, main, mma, k_tiles, off_m, it, ROLE, stride)
        elif p.INFLIGHT:
            acc, main, it = _mainloop_g_f8_inflight(p, main, mma, k_tiles, it, ROLE, stride)
        elif p.F8:
            acc, main, it = _mainloop_g_f8(p, main, mma, k_tiles, off_m, off_n, it, ROLE, stride)
        else:
            acc, main, it = _mainloop_g(p, main, mma, k_tiles, off_m, off_n, it, ROLE, stride)
        if not p.PAIRED:
            p.order.release(CONSUMER)        # its K loop may start while this epilogue runs
            main = main.advance(k_tiles)
        _epilogue(p, acc, lr, off_m, off_n, CONSUMER, mma)
        lr = lr.advance(2)
    if p.EPI_TMA:
        tma.store_wait(0)


@gluon.jit
def _consumer_coop(p, sched, k_tiles, n_tiles, CONSUMER: gl.constexpr, ROLE: gl.constexpr, mma: gl.constexpr):
    """COOP: both consumers walk every tile and every MAIN / LOWRANK slot together, each on its half of the rows
    (the slot's weight tile, w_scale row and lora_up tile are shared; both release, so the rings' empty barriers
    count two arrivals). Lock-step on shared slots needs no ConsumerOrder hand-off."""
    main = consumer_state(p.main.num_stages)
    lr = consumer_state(p.lowrank.num_stages)
    it = 0
    for t in range(n_tiles):
        pid_m, pid_n = sched.get_tile(t)
        off_m = pid_m * _tile_m(p.BLOCK_M, p.COOP) + CONSUMER * p.BLOCK_M
        off_n = pid_n * p.BLOCK_N
        if p.TRANS:
            acc, main, it = _mainloop_a8t(p, main, mma, k_tiles, off_m, it, ROLE, 1)
        elif p.INFLIGHT:
            acc, main, it = _mainloop_g_f8_inflight(p, main, mma, k_tiles, it, ROLE, 1)
        else:
            acc, main, it = _mainloop_g_f8(p, main, mma, k_tiles, off_m, off_n, it, ROLE, 1)
        _epilogue(p, acc, lr, off_m, off_n, CONSUMER, mma)
        lr = lr.next()


@gluon.jit
def _consumer0(p):
    _consumer_partition(p, 0)


@gluon.jit
def _consumer1(p):
    _consumer_partition(p, 1)


# M, N, K, stride_om are W4A4Args fields typed gl.tensor: Triton would turn a value of 1 into a constexpr
# (M=1 decode) and the aggregate would reject it, so they are never specialized.
@gluon.jit(do_not_specialize=["M", "N", "K", "stride_om"])
def w4a4_ws_kernel(x_desc, w_desc, s_desc, b_desc, out_desc, sc_desc, sw_desc,
                   out_ptr, stride_om,                          # [M, N] (used when not EPI_TMA)
                   xscale_ptr, wscale_ptr, wmult_ptr,           # see module doc per FMT
                   col_scale_ptr, bias_ptr,                     # [N], [N]
                   dbg_ptr, dbg_tiles_ptr,                      # int32 (DEBUG only)
                   M, N, K,
                   FMT: gl.constexpr, G2: gl.constexpr,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, BLOCK_R: gl.constexpr,
                   GROUP_M: gl.constexpr, STAGES: gl.constexpr, LOWRANK_STAGES: gl.constexpr,
                   HAS_LOWRANK: gl.constexpr, HAS_COL_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr,
                   EPI_TMA: gl.constexpr, DEBUG: gl.constexpr, DEBUG_ITERS: gl.constexpr,
                   DEBUG_TILES: gl.constexpr, SCALE_TMA: gl.constexpr = False, SWAR: gl.constexpr = False,
                   RAW_STAGES_N: gl.constexpr = 2, CONSUMER_ORDER: gl.constexpr = True, F8: gl.constexpr = False,
                   PAIRED: gl.constexpr = False, EXPANDERS: gl.constexpr = 1, INFLIGHT: gl.constexpr = False,
                   COOP: gl.constexpr = False, WS_PERM: gl.constexpr = False, ODD_RINGS_OK: gl.constexpr = False,
                   A8: gl.constexpr = False, TRANS: gl.constexpr = False):
    gl.static_assert(BLOCK_K % _PACK == 0, "BLOCK_K must be a multiple of the 64-wide pack block")
    gl.static_assert(LOWRANK_STAGES >= 1, "the LOWRANK ring needs a slot even when unused")
    # Every SMEM buffer and barrier of the kernel is declared here (plan.smem ledger mirrors it).
    gl.static_assert(not F8 or FMT == _FMT_INT4_G, "F8 (e4m3 MMA) is the int4_g path's variant")
    # PAIRED: the expander walks RAW → MAIN in fill order without knowing tiles, which only holds for g
    # (2l expansion multiplies by the tile's u rows)
    gl.static_assert(not PAIRED or FMT == _FMT_INT4_G, "PAIRED main loops are an int4_g option")
    gl.static_assert(EXPANDERS == 1 or (F8 and EXPANDERS == 2) or (F8 and SCALE_TMA and EXPANDERS == 0),
                     "two expanders: the F8 path only; none (pre-expanded weights): F8 with SCALE_TMA")
    gl.static_assert(not INFLIGHT or (F8 and SCALE_TMA), "in-flight partials: the F8 path with SCALE_TMA")
    gl.static_assert(not COOP or (EXPANDERS == 0 and not PAIRED), "COOP: no expander, not PAIRED")
    gl.static_assert(not A8 or (F8 and EXPANDERS == 0 and INFLIGHT and not WS_PERM),
                     "A8 (per-token e4m3 activations): the no-expander in-flight e4m3 route")
    gl.static_assert(not TRANS or A8, "TRANS (the kernel computes Yᵀ): the A8 route's option")
    gl.static_assert(not WS_PERM or (SCALE_TMA and F8 and sw_desc.dtype == gl.float32),
                     "WS_PERM: fp32 w_scale rows through the ring (ws_f32)")
    # rings two roles walk with stride 2 need an even slot count (skeleton docstring, "Strided roles");
    # ODD_RINGS_OK only reproduces the hazard (scripts/_v2_stage_check.py), never set it otherwise
    gl.static_assert(ODD_RINGS_OK or not (PAIRED or EXPANDERS == 2) or STAGES % 2 == 0,
                     "MAIN under two expanders / paired consumers: an even stage count")
    gl.static_assert(ODD_RINGS_OK or EXPANDERS != 2 or RAW_STAGES_N % 2 == 0,
                     "RAW under two expanders: an even stage count")
    TILE_M: gl.constexpr = _tile_m(BLOCK_M, COOP)
    op_dtype: gl.constexpr = gl.float8e4nv if F8 else gl.int8
    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TILE_M, BLOCK_K], op_dtype)
    w_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], op_dtype)
    x_bufs = gl.allocate_shared_memory(op_dtype, [STAGES, TILE_M, BLOCK_K], x_layout)
    w_bufs = gl.allocate_shared_memory(op_dtype, [STAGES, BLOCK_N, BLOCK_K], w_layout)
    if FMT == _FMT_INT4_G and not F8:
        xp_bufs = gl.allocate_shared_memory(gl.uint8, [RAW_STAGES_N] + x_desc.block_type.shape, x_desc.layout)
    else:
        xp_bufs = x_bufs   # unused: 2l / F8 activations land in MAIN directly
    if EXPANDERS == 0:
        wp_bufs = w_bufs   # unused: the e4m3 weights land in MAIN directly
    else:
        wp_bufs = gl.allocate_shared_memory(gl.uint8, [RAW_STAGES_N] + w_desc.block_type.shape, w_desc.layout)
    if HAS_LOWRANK:
        s_bufs = gl.allocate_shared_memory(s_desc.dtype, [LOWRANK_STAGES] + s_desc.block_type.shape, s_desc.layout)
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [LOWRANK_STAGES] + b_desc.block_type.shape, b_desc.layout)
    else:
        s_bufs = x_bufs
        b_bufs = w_bufs
    if EPI_TMA:
        epi_bufs = gl.allocate_shared_memory(out_desc.dtype, [2] + out_desc.block_type.shape, out_desc.layout)
    else:
        epi_bufs = x_bufs

    if SCALE_TMA:
        if FMT == _FMT_INT4_2L:
            sx_bufs = gl.allocate_shared_memory(sc_desc.dtype, [RAW_STAGES_N * _u_rows(BLOCK_K, G2)] + sc_desc.block_type.shape,
                                                sc_desc.layout)
            sw_bufs = sx_bufs
        else:
            # F8: two fp32 rows (a, b) per slot; int8 g: one 16-bit x_scale row
            if A8:
                sx_bufs = x_bufs      # no activation rows
            else:
                sx_bufs = gl.allocate_shared_memory(sc_desc.dtype, [STAGES * (2 if F8 else 1)]
                                                    + sc_desc.block_type.shape, sc_desc.layout)
            if TRANS:
                sw_bufs = x_bufs      # the weight scales come from global memory
            else:
                sw_bufs = gl.allocate_shared_memory(sw_desc.dtype, [STAGES] + sw_desc.block_type.shape,
                                                    sw_desc.layout)
    else:
        sx_bufs = x_bufs
        sw_bufs = x_bufs

    # MAIN fills: 2l / F8 = loader's expect (x by TMA) + expander's arrive (w); g = expander only, plus the
    # loader's expect of the scale rows with SCALE_TMA; no expander = the loader's expect alone.
    main = make_pipeline(STAGES, 2 if (FMT == _FMT_INT4_2L or SCALE_TMA or F8) and EXPANDERS != 0 else 1,
                         2 if COOP else 1)
    raw = make_pipeline(RAW_STAGES_N, 1, 1)
    lowrank = make_pipeline(LOWRANK_STAGES, 1, 2 if COOP else 1)
    order = make_consumer_order(CONSUMER_ORDER)   # False only to reproduce the parity hang (bisect)

    p = W4A4Args(x_desc, w_desc, s_desc, b_desc, out_desc, x_bufs, w_bufs, xp_bufs, wp_bufs, s_bufs, b_bufs,
                 epi_bufs, sc_desc, sw_desc, sx_bufs, sw_bufs, main, raw, lowrank, order, out_ptr, stride_om, xscale_ptr, wscale_ptr, wmult_ptr,
                 col_scale_ptr, bias_ptr, dbg_ptr, dbg_tiles_ptr, M, N, K, FMT, G2, BLOCK_M, BLOCK_N, BLOCK_K,
                 BLOCK_R, GROUP_M, HAS_LOWRANK, HAS_COL_SCALE, HAS_BIAS, EPI_TMA, DEBUG, DEBUG_ITERS, DEBUG_TILES,
                 SCALE_TMA, SWAR, F8, PAIRED, EXPANDERS, INFLIGHT, COOP, WS_PERM, A8, TRANS)
    if EXPANDERS == 0:
        gl.warp_specialize([
            (_consumer0, (p, )),
            (_loader_partition, (p, )),
            (_consumer1, (p, )),
        ], WORKER_WARPS_0X, WORKER_REGS_0X)
    elif EXPANDERS == 2:
        gl.warp_specialize([
            (_consumer0, (p, )),
            (_loader_partition, (p, )),
            (_expander_partition, (p, )),
            (_consumer1, (p, )),
            (_expander1, (p, )),
        ], WORKER_WARPS_2X, WORKER_REGS_2X)
    else:
        gl.warp_specialize([
            (_consumer0, (p, )),
            (_loader_partition, (p, )),
            (_expander_partition, (p, )),
            (_consumer1, (p, )),
        ], WORKER_WARPS, WORKER_REGS)


# =============================================================================================
# Host side: plan (ledger), validate, launch.
_BITS = {torch.bfloat16: 16, torch.float16: 16, torch.float32: 32}


def _fmt_id(fmt) -> int:
    if isinstance(fmt, int):
        return fmt
    if fmt not in FORMATS:
        raise ValueError(f"unknown W4A4 format {fmt!r}; expected one of {sorted(FORMATS)}")
    return FORMATS[fmt]


def w4a4_ledger(config: KernelConfig, *, fmt, out_dtype=torch.bfloat16, has_lowrank: bool = True,
                lowrank_dtype=torch.bfloat16, n_out: int = 8, scale_tma: bool = False,
                group_size: int = 64, raw_stages: int = RAW_STAGES, f8: bool = False,
                expanders: int = 1, coop: bool = False, ws_bits: int = 16, a8: bool = False,
                trans: bool = False) -> SmemLedger:
    """Every byte ``w4a4_ws_kernel`` allocates, itemized (mirrors the allocations in the kernel). ``a8``: per-token
    e4m3 activations, whose slots carry no activation rows (the token scale is read in the epilogue); ``trans``
    (with a8): no w_scale row either (the consumers load their rows' scales from global memory).
    ``expanders=0``: the e4m3 weights arrive in MAIN by TMA, no RAW tiles (its barriers remain). ``coop``: a slot's
    activation rows, xab rows and s tile cover both consumers (2·block_m rows); the weight side is shared."""
    f = _fmt_id(fmt)
    bn, bk, br = config.block_n, config.block_k, config.block_r
    bm = 2 * config.block_m if coop else config.block_m
    s, lr = config.num_stages, max(1, config.lowrank_stages)
    op = "e4m3" if f8 else "int8"
    terms = [SmemTerm(f"{Ring.MAIN}.x_{op}", tile_bytes(bm, bk, 8), s),
             SmemTerm(f"{Ring.MAIN}.w_{op}", tile_bytes(bn, bk, 8), s)]
    if f == FMT_INT4_G and not f8:
        terms.append(SmemTerm(f"{Ring.RAW}.x_packed", tile_bytes(bm, bk // 2, 8), raw_stages))
    if expanders:
        terms.append(SmemTerm(f"{Ring.RAW}.w_packed", tile_bytes(bn, bk // 2, 8), raw_stages))
    if scale_tma:
        if f8:
            if not a8:
                terms.append(SmemTerm(f"{Ring.MAIN}.x_ab_rows", tile_bytes(2, bm, 32), s))
            if not trans:
                terms.append(SmemTerm(f"{Ring.MAIN}.w_scale_row", tile_bytes(1, bn, ws_bits), s))
        elif f == FMT_INT4_G:
            terms += [SmemTerm(f"{Ring.MAIN}.x_scale_row", tile_bytes(1, bm, 16), s),
                      SmemTerm(f"{Ring.MAIN}.w_scale_row", tile_bytes(1, bn, 16), s)]
        else:
            terms.append(SmemTerm(f"{Ring.RAW}.u_rows", tile_bytes(u_rows(bk, group_size), bn, 8), raw_stages))
    if has_lowrank:
        terms += [SmemTerm(f"{Ring.LOWRANK}.s_fp32", tile_bytes(bm, br, 32), lr),
                  SmemTerm(f"{Ring.LOWRANK}.lora_up", tile_bytes(bn, br, _BITS[lowrank_dtype]), lr)]
    if _epi_tma(out_dtype, n_out):
        terms.append(SmemTerm(f"{Ring.EPILOGUE}.out", tile_bytes(config.block_m, bn, _BITS[out_dtype]), 1,
                              Scope.PER_CONSUMER))
    # ready + empty per slot of MAIN, RAW, LOWRANK, and the consumers' two ORDER barriers
    terms.append(SmemTerm("barriers", barrier_bytes(2 * (s + raw_stages + lr) + NUM_CONSUMERS)))
    return SmemLedger(tuple(terms), consumers=NUM_CONSUMERS, label=f"w4a4 v2 {fmt}{' a8t' if trans else ' a8' if a8 else ' f8' if f8 else ''}{'' if expanders else ' w8'}"
                                                                     f"{' coop' if coop else ''} {bm}x{bn}x{bk}")


def u_rows(block_k: int, group_size: int) -> int:
    """Rows of the 2l multiplier table u [K/G2, N] one K step of ``block_k`` needs."""
    return max(1, block_k // group_size)


def scale_tma_ok(x_scale, w_scale, w_mul, fmt) -> bool:
    """Whether the scale rows can come by TMA. They are read through 1-D views with box starts at
    row·len + tile offset, and every box start must be 16-byte aligned (the H200 raised "illegal
    instruction" for M=60: a g64 row start at 120 B): g needs M, N % 8 == 0 (16-bit tables), 2l
    N % 16 == 0 (uint8 u); plus contiguous tables at 16-byte aligned addresses. ``x_scale`` may be the
    pre-expanded xab [K/G, 2, M] of the e4m3 path (same M rule, so both forms pick the same kernel: without
    TMA'd rows the g64 f8 GEMM is ~6× slower, 4.9 ms vs 0.76 at fc1)."""
    if _fmt_id(fmt) == FMT_INT4_2L:
        ts, ok = (w_mul, ), w_mul is not None and w_mul.dim() == 2 and w_mul.shape[1] % 16 == 0
    elif x_scale.dim() == 1:     # per-token e4m3 activations (A8): only the w_scale rows ride in the ring
        ts, ok = (w_scale, ), w_scale.dim() == 2 and w_scale.shape[1] % 8 == 0
    else:
        ts = (x_scale, w_scale)
        xab = x_scale.dim() == 3 and x_scale.shape[1] == 2
        ok = (x_scale.dim() == 2 or xab) and x_scale.shape[-1] % 8 == 0 and w_scale.dim() == 2 \
            and w_scale.shape[1] % 8 == 0
    return ok and all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in ts)


def _epi_tma(out_dtype, N: int = 8) -> bool:
    # A 16-bit tile per consumer fits next to the operand rings; an fp32 one (2 × 64 KiB) does not.
    # TMA also needs 16-byte row strides (N % 8 == 0); otherwise the consumer stores from registers.
    return _BITS[out_dtype] == 16 and N % 8 == 0


def default_config_v2(fmt, group_size: int = 64) -> KernelConfig:
    if _fmt_id(fmt) == FMT_INT4_2L:
        return KernelConfig(block_m=128, block_n=128, block_k=128, block_r=16, group_m=8, num_warps=4,
                            num_stages=4, lowrank_stages=2, persistent=True)
    # int4_g: the int32 partial and the fp32 accumulator both live in registers → 64×128 per consumer
    return KernelConfig(block_m=64, block_n=128, block_k=group_size, block_r=16, group_m=8, num_warps=4,
                        num_stages=4, lowrank_stages=2, persistent=True)


def plan_w4a4_v2(fmt, *, rank: int, group_size: int = 64, out_dtype=torch.bfloat16,
                 lowrank_dtype=torch.bfloat16, config: KernelConfig | None = None,
                 verbose: bool = False, n_out: int = 8, scale_tma: bool = False,
                 raw_stages: int = RAW_STAGES, f8: bool = False, expanders: int = 1,
                 coop: bool = False, ws_bits: int = 16, paired: bool = False, a8: bool = False,
                 trans: bool = False) -> KernelConfig:
    """Tile sizes from ``config`` (or the default); stage counts from the ledger: the deepest MAIN
    ring first, then the deepest LOWRANK ring. MAIN gets an even slot count when two roles walk it with
    stride 2 — two expanders or ``paired`` consumers (``skeleton.strided_ring_stages``). Raises SmemError
    with the table if nothing fits. A pure function of its arguments: cached (the stage search builds ~13 ledgers,
    ~0.2 ms of host time per eager call before it was)."""
    args = (fmt, rank, group_size, out_dtype, lowrank_dtype, config, n_out, scale_tma, raw_stages, f8, expanders,
            coop, ws_bits, paired, a8, trans)
    if verbose:
        cfg, ledger = _plan_v2(*args)
        print(ledger.table())
        return cfg
    return _plan_v2(*args)[0]


@functools.lru_cache(maxsize=1024)
def _plan_v2(fmt, rank, group_size, out_dtype, lowrank_dtype, config, n_out, scale_tma, raw_stages, f8, expanders,
             coop, ws_bits, paired, a8=False, trans=False) -> tuple[KernelConfig, SmemLedger]:
    base = config or default_config_v2(fmt, group_size)
    br = rank_block(rank)
    base = base.replace(block_r=max(base.block_r, br))
    has_lr = rank > 0

    def build(main_stages, lr_stages):
        return w4a4_ledger(base.replace(num_stages=main_stages, lowrank_stages=lr_stages), fmt=fmt,
                           out_dtype=out_dtype, has_lowrank=has_lr, lowrank_dtype=lowrank_dtype, n_out=n_out,
                           scale_tma=scale_tma, group_size=group_size, raw_stages=raw_stages, f8=f8,
                           expanders=expanders, coop=coop, ws_bits=ws_bits, a8=a8, trans=trans)

    main, lr, ledger = solve_stages(build, min_main=2, max_main=8, min_lowrank=1 if not has_lr else 2,
                                    max_lowrank=1 if not has_lr else 4)
    if paired or expanders == 2:
        main = strided_ring_stages(main)
        ledger = build(main, lr)
    return base.replace(num_stages=main, lowrank_stages=lr), ledger


@functools.lru_cache(maxsize=1024)   # a pure check of hashable values (a failure raises again on every call)
def _check_config(config: KernelConfig, M, N, K, rank, fmt, group_size, out_dtype, lowrank_dtype, wmult_rows=None,
                  scale_tma: bool = False, raw_stages: int = RAW_STAGES, f8: bool = False, expanders: int = 1,
                  inflight: bool = False, coop: bool = False, ws_bits: int = 16, a8: bool = False,
                  trans: bool = False):
    """Raise ValueError/SmemError naming the violated constraint (expected vs got)."""
    f = _fmt_id(fmt)
    if f8 and f != FMT_INT4_G:
        raise ValueError(f"w4a4 v2: the fp8 MMA path (f8=True) is for int4_g formats, got {fmt!r}")
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    if config.num_warps != DEFAULT_WARPS:
        raise ValueError(f"w4a4 v2: num_warps is the consumer warpgroup size {DEFAULT_WARPS}, got {config.num_warps}")
    if bm not in (64, 128) or bn not in (64, 128, 256):
        raise ValueError(f"w4a4 v2: block_m ∈ {{64, 128}}, block_n ∈ {{64, 128, 256}}; got {bm}×{bn}")
    if bk % PACK:
        raise ValueError(f"w4a4 v2: block_k must be a multiple of {PACK}, got {bk}")
    if K % PACK:
        raise ValueError(f"w4a4 v2: K must be a multiple of {PACK} (int4 pack block), got K={K}")
    acc_regs = bm * bn // 128 * ((3 if inflight else 2) if f == FMT_INT4_G else 1)
    limit = 200 if expanders == 0 else 160      # of the 232 / 208 registers a consumer gets (skeleton roles)
    if acc_regs > limit:
        raise ValueError(f"w4a4 v2: {bm}×{bn} accumulators need {acc_regs} registers/thread per consumer "
                         f"(limit {limit} with {expanders} expander warpgroup(s){', in-flight partials' if inflight else ''})")
    if f == FMT_INT4_G:
        if bk != group_size:
            raise ValueError(f"w4a4 v2 int4_g: block_k must equal the group size {group_size}, got {bk}")
    else:
        if not (bk % group_size == 0 or group_size % bk == 0) or group_size % PACK:
            raise ValueError(f"w4a4 v2 int4_2l: level-2 group {group_size} must be a multiple of {PACK} "
                             f"and divide or be divided by block_k={bk}")
    if rank > config.block_r:
        raise ValueError(f"w4a4 v2: rank {rank} exceeds block_r {config.block_r}")
    w4a4_ledger(config, fmt=fmt, out_dtype=out_dtype, has_lowrank=rank > 0, lowrank_dtype=lowrank_dtype,
                n_out=N, scale_tma=scale_tma, group_size=group_size, raw_stages=raw_stages, f8=f8,
                expanders=expanders, coop=coop, ws_bits=ws_bits, a8=a8, trans=trans).check()


def can_implement_v2(config: KernelConfig, shape) -> bool:
    """``shape``: dict with M, N, K, rank, and optionally fmt ("int4_g64"), group_size (64),
    out_dtype (bf16), lowrank_dtype (bf16)."""
    try:
        _check_config(config, shape["M"], shape["N"], shape["K"], shape.get("rank", 0), shape.get("fmt", "int4_g64"),
                      shape.get("group_size", 64), shape.get("out_dtype", torch.bfloat16),
                      shape.get("lowrank_dtype", torch.bfloat16))
        return True
    except (ValueError, SmemError):
        return False


def _row_desc(t, box: int):
    # A 1-D view (box starts at row·len + offset; scale_tma_ok keeps them 16-byte aligned): the SMEM copy
    # is a plain 1-D slot the consumer loads straight into a slice layout.
    bits = t.element_size() * 8
    return desc(t.reshape(-1), (box, ), flat_layout(bits))




def _expect(cond, msg):
    if not cond:                              # msg: a string or a callable building it (w4a4_gemm._expect)
        raise ValueError(f"w4a4 v2: {msg() if callable(msg) else msg}")


def check_out(out, col_scale, M: int, N: int, device):
    """The launchers' output and col_scale contract (this kernel's and gluon/w4a4_quad.py's)."""
    _expect(out.dtype in _BITS and tuple(out.shape) == (M, N) and out.is_contiguous() and out.device == device,
            lambda: f"out must be contiguous bf16/fp16/fp32 [M, N] = {[M, N]} on {device}, got {out.dtype} "
            f"{list(out.shape)} on {out.device}")
    _expect(col_scale is None or (tuple(col_scale.shape) == (N, ) and col_scale.device == out.device),
            lambda: f"col_scale must be [N={N}] on {out.device}, got "
                    f"{None if col_scale is None else list(col_scale.shape)}")


def _f8_operands(x_q, x_scale, group_size: int, f8: bool, who: str):
    """The activation operands the kernel reads. The e4m3 path (``f8``) takes x8 e4m3 [M, K] + xab fp32
    [K/G, 2, M] (``w4_expand.expand_act_f8``'s outputs); a caller that already holds them (act_quant can emit
    them directly) passes them as (x_q, x_scale) and saves the expansion launch, otherwise it runs here."""
    if x_q.dtype == torch.float8_e4m3fn:
        _expect(f8, lambda: f"{who}: pre-expanded e4m3 activations need the e4m3 path (f8=True), got f8={f8}")
        return x_q, x_scale
    if not f8:
        return x_q, x_scale
    from ..w4_expand import expand_act_f8
    return expand_act_f8(x_q, x_scale, group_size)


def _pad_rank(t, r8):
    # TMA rows must be 16-byte multiples: rank padded with zeros to a multiple of 8 (adds nothing).
    return t if t.shape[1] == r8 else torch.nn.functional.pad(t, (0, r8 - t.shape[1]))


def kernel_args_v2(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt, group_size,
                   config=None, *, col_scale=None, debug: bool = False, debug_iters: int = DEBUG_ITERS_DEFAULT,
                   debug_tiles: int = DEBUG_TILES_DEFAULT, grid: int | None = None, consumer_order: bool = True,
                   scale_tma: bool | None = None, swar: bool = True, raw_stages: int | None = None,
                   f8: bool | None = None, paired: bool | None = None, expanders: int | None = None,
                   inflight: bool | None = None, w_f8=None, coop: bool | None = None, ws_f32: bool | None = None,
                   ws_perm: bool | None = None, fuse_ws: bool | None = None, trans: bool | None = None,
                   _dims: tuple | None = None):
    """Validate (the v1 contract's own checks; ``_dims``: (M, N, K, r) already checked by the GEMM op), plan and
    build one launch.
    ``expanders`` (f8 only; None = :func:`f8_expanders_default`): 2 runs a second expander warpgroup on the odd
    K steps (skeleton.ROLES_TWO_EXPANDERS); 0 runs none: the weights are expanded once per call into a transient
    e4m3 [N, K] buffer of offset nibbles (``w4_expand.expand_w4(offset=True)``, or ``w_f8`` when the caller
    holds one) that the loader TMAs into MAIN next to the activations (skeleton.ROLES_NO_EXPANDER).
    ``inflight`` (needs f8 and TMA'd scale rows; None = :func:`inflight_default`): each consumer issues the next
    group's wgmma before it rescales the current one (two fp32 partials in flight); True runs :data:`INFLIGHT_DEPTH`
    groups per loop body, an int n ≥ 2 runs n (only the body's last rescale has no MMA behind it).
    ``coop`` (needs expanders=0, not paired; None = :func:`coop_default`): the two consumers share each slot's
    weight tile, each on its half of a 2·block_m-row CTA tile — a third less L2 → SMEM traffic per MMA.
    ``ws_f32`` (expanders=0 only; None = :func:`ws_f32_default`): the w_scale rows go through the ring as fp32 (one
    conversion per call, exact), so the consumers' rescale loads them without a bf16 → fp32 step per element.
    ``ws_perm`` (ws_f32 with N % block_n == 0 only; None = :func:`ws_perm_default` where it applies): the fp32 rows
    come permuted (:func:`ws_row_order`, in the same conversion) so each thread loads its columns 128 bits at a time.
    ``fuse_ws`` (None = :func:`fuse_ws_default`): the unpermuted fp32 rows are written by the per-call weight
    expansion's launch (``expand_w4(scales=...)``) instead of a conversion of their own (only where this call expands).
    ``paired`` (int4_g only; None = :func:`paired_default`): the two consumers run the K loops of a tile pair at
    the same time, the pair's K steps interleaved on MAIN, so one consumer's rescale overlaps the other's MMA
    (otherwise they hand the ring over per tile and only the epilogues overlap).
    ``f8`` (int4_g only; None = :func:`f8_default`): e4m3 MMA with the activations pre-expanded by
    ``kernels.w4_expand.expand_act_f8`` (module doc); False = int8 MMA on in-kernel expanded activations.
    ``scale_tma`` (None = whenever the strides allow, :func:`scale_tma_ok`): the group scales (g) / level-2
    multipliers (2l) come through the rings by TMA instead of per-step global loads. ``swar``: int4
    expansion four bytes per instruction (kernels/int4_unpack.py); False = element-wise shifts.
    ``consumer_order=False`` drops the consumers' ring hand-off: it reproduces the parity hang
    (scripts/bisect_gluon.py), never use it otherwise. Returns (grid, args, constexprs, config, (dbg, dbg_tiles))."""
    from ..w4a4_gemm import check_gemm_args
    M, N, K, r = _dims or check_gemm_args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, group_size,
                                          fmt)
    f = _fmt_id(fmt)
    dev = out.device
    check_out(out, col_scale, M, N, x_q.device)
    # per-token e4m3 activations (W4A8: x_q e4m3 [M, K], x_scale fp32 [M]) run one route: no expander, in flight
    a8 = x_q.dtype == torch.float8_e4m3fn and x_scale.dim() == 1
    if a8:
        _expect(f8 in (None, True) and expanders in (None, 0) and inflight is not False and paired in (None, False)
                and ws_perm in (None, False),
                lambda: f"per-token e4m3 activations run the no-expander in-flight e4m3 route, got f8={f8}, "
                        f"expanders={expanders}, inflight={inflight}, paired={paired}, ws_perm={ws_perm}")
        f8, expanders, paired, ws_perm = True, 0, False, False
    trans = (a8 and col_scale is None and a8_trans_default(K)) if trans is None else trans
    if a8 and inflight is None:
        inflight = a8_inflight_default(trans, K)
    _expect(not trans or (a8 and col_scale is None),
            lambda: f"trans (the kernel computing Yᵀ) is an option of per-token e4m3 activations without col_scale, got "
                    f"a8={a8}, col_scale={'set' if col_scale is not None else None}")
    for name, t in (("x_q", x_q), ("w_q", w_q), ("out", out)):
        _expect(t.data_ptr() % 16 == 0, lambda: f"{name} must be 16-byte aligned for TMA, got address {t.data_ptr():#x}")
    lr_dtype = lora_up.dtype if r else torch.bfloat16
    ok = scale_tma_ok(x_scale, w_scale, w_mul, f)
    _expect(not scale_tma or ok, "scale_tma needs contiguous, 16-byte aligned scale tables and 16-byte aligned "
                                 f"row starts (g: M, N % 8 == 0; 2l: N % 16 == 0), got M={M}, N={N}")
    scale_tma = ok if scale_tma is None else scale_tma
    _expect(not a8 or scale_tma, lambda: f"per-token e4m3 activations need TMA'd w_scale rows (N % 8 == 0, "
                                         f"contiguous, 16-byte aligned), got N={N}")
    f8 = (f == FMT_INT4_G and f8_default()) if f8 is None else f8
    if raw_stages is None:
        raw_stages = RAW_STAGES_F8 if f8 else RAW_STAGES
    expanders = (f8_expanders_default(M) if f8 and scale_tma else 1) if expanders is None else expanders
    _expect(expanders == 1 or (f8 and expanders == 2) or (f8 and scale_tma and expanders == 0),
            lambda: f"expanders=2 needs the f8 path and expanders=0 the f8 path with TMA'd scale rows, got "
                    f"expanders={expanders}, f8={f8}, scale_tma={scale_tma}")
    inflight = inflight_default(expanders) if inflight is None else inflight_depth(inflight)
    if coop is None:           # an explicit paired=True asks for the paired kernel
        coop = coop_default(expanders) and not paired
    _expect(not inflight or (f8 and scale_tma), lambda: f"in-flight partials need the f8 path with TMA'd scale rows, "
                                                        f"got f8={f8}, scale_tma={scale_tma}")
    # (defaults only with TMA'd scale rows: the global-load variant spills when paired)
    paired = (f == FMT_INT4_G and f8 and scale_tma and not coop and paired_default()) if paired is None else paired
    _expect(not coop or (expanders == 0 and not paired),
            lambda: f"coop (shared weight tiles) needs expanders=0 and paired=False, got expanders={expanders}, "
                    f"paired={paired}")
    _expect(not paired or f == FMT_INT4_G, lambda: f"paired main loops are an int4_g option, got fmt={fmt!r}")
    _expect(raw_stages >= 1, lambda: f"raw_stages must be ≥ 1, got {raw_stages}")
    _expect(expanders != 2 or raw_stages % 2 == 0,
            lambda: f"two expanders take alternate RAW slot uses, so raw_stages must be even "
                    f"(skeleton.strided_ring_stages), got {raw_stages}")
    if expanders == 0:
        raw_stages = 1     # barriers only: nothing lands in RAW
    ws_f32 = (expanders == 0 and not trans and ws_f32_default()) if ws_f32 is None else ws_f32
    _expect(not (trans and ws_f32), "trans loads its 16-bit weight scales itself (ws_f32 must be off)")
    _expect(not ws_f32 or expanders == 0, lambda: f"ws_f32 is an expanders=0 option, got expanders={expanders}")
    ws_bits = 32 if ws_f32 else _BITS.get(w_scale.dtype, 16)
    config = plan_w4a4_v2(f, rank=r, group_size=group_size, out_dtype=out.dtype, lowrank_dtype=lr_dtype,
                          config=config, n_out=N, scale_tma=scale_tma, raw_stages=raw_stages, f8=f8,
                          expanders=expanders, coop=coop, ws_bits=ws_bits, paired=paired, a8=a8, trans=trans)
    _check_config(config, M, N, K, r, f, group_size, out.dtype, lr_dtype, scale_tma=scale_tma, raw_stages=raw_stages,
                  f8=f8, expanders=expanders, inflight=inflight, coop=coop, ws_bits=ws_bits, a8=a8, trans=trans)
    if ws_perm is None:
        ws_perm = ws_f32 and ws_perm_default() and N % config.block_n == 0
    _expect(not ws_perm or (ws_f32 and N % config.block_n == 0),
            lambda: f"ws_perm (permuted fp32 w_scale rows) needs ws_f32 and N % block_n == 0, got ws_f32={ws_f32}, "
                    f"N={N}, block_n={config.block_n}")
    if fuse_ws is None:
        fuse_ws = fuse_ws_default()
    # the fp32 rows come out of the per-call weight expansion's own launch where there is one (one launch fewer)
    fuse_ws = (fuse_ws and ws_f32 and not ws_perm and w_f8 is None and w_scale.dtype in (torch.bfloat16, torch.float16)
               and w_scale.is_contiguous())
    if ws_perm:
        w_scale = ws_row_order(w_scale, config.block_n)
    elif ws_f32 and not fuse_ws:
        w_scale = w_scale.float()      # exact; the kernel's .to(fp32) of the row is then a no-op

    bm, bn, bk, br = config.block_m, config.block_n, config.block_k, config.block_r
    tm = 2 * bm if coop else bm          # rows of a CTA tile (the loader's boxes)
    x_q, x_scale = _f8_operands(x_q, x_scale, group_size, f8, "w4a4 v2")
    x_desc = desc(x_q, (tm, bk) if (f == FMT_INT4_2L or f8) else (tm, bk // 2))
    if expanders == 0:
        if w_f8 is None:
            from ..w4_expand import expand_w4
            if fuse_ws:
                w_f8, w_scale = expand_w4(w_q, None, group_size, "int4_g64", torch.float8_e4m3fn, offset=not a8,
                                          scales=w_scale)
            else:     # A8 folds P · ws with signed weights; the int4 route undoes the offset with its xab rows
                w_f8 = expand_w4(w_q, None, group_size, "int4_g64", torch.float8_e4m3fn, offset=not a8)
        _expect(w_f8.dtype == torch.float8_e4m3fn and tuple(w_f8.shape) == (N, K) and w_f8.is_contiguous()
                and w_f8.device == w_q.device and w_f8.data_ptr() % 16 == 0,
                lambda: f"w_f8 must be the contiguous, 16-byte aligned e4m3 [N, K] = {[N, K]} "
                        f"{'signed' if a8 else 'offset-nibble'} expansion of w_q on {w_q.device}, got {w_f8.dtype} {list(w_f8.shape)} on {w_f8.device}")
        w_desc = desc(w_f8, (bn, bk))
        if trans:     # the weights are the kernel's rows (the consumers' halves), the tokens its columns
            x_desc, w_desc = desc(w_f8, (tm, bk)), desc(x_q, (bn, bk))
    else:
        _expect(w_f8 is None, "w_f8 (pre-expanded weights) is read only with expanders=0")
        w_desc = desc(w_q, (bn, bk // 2))
    r8 = -(-r // 8) * 8
    row_lr, col_lr = lowrank_act, lora_up
    if trans and r:   # Yᵀ += lora_up · Sᵀ: lora_up is the rows' operand (fp32, exact), S rounded to its dtype first
        row_lr, col_lr = lora_up.float(), lowrank_act.to(lr_dtype)
    s_desc = desc(_pad_rank(row_lr, r8) if r else dummy(dev, torch.float32, (tm, br)), (tm, br))
    b_desc = desc(_pad_rank(col_lr, r8) if r else dummy(dev, lr_dtype, (bn, br)), (bn, br))
    epi_tma = _epi_tma(out.dtype, N)
    out_box = (bn, bm) if trans else (bm, bn)      # trans: the tile goes out transposed
    out_desc = desc(out if epi_tma else dummy(dev, torch.bfloat16, out_box), out_box)
    if scale_tma and f == FMT_INT4_2L:
        sc_desc = sw_desc = _row_desc(w_mul, bn)
    elif scale_tma and trans:
        sc_desc = sw_desc = _row_desc(dummy(dev, torch.float32, (16, )), 16)
    elif scale_tma:
        sc_desc = _row_desc(dummy(dev, torch.float32, (16, )), 16) if a8 else _row_desc(x_scale, tm)
        sw_desc = _row_desc(w_scale, bn)
    else:
        sc_desc = sw_desc = _row_desc(dummy(dev, torch.uint8, (16, )), 16)
    km, kn = (N, M) if trans else (M, N)           # the kernel's rows and columns
    if trans:
        col_scale = x_scale                        # the token scale t multiplies the kernel's columns
    tiles = cdiv(km, tm) * cdiv(kn, bn)
    grid = min(grid, tiles) if grid else persistent_grid(tiles, dev)
    dbg = dbg_tiles = None
    i32 = dummy(dev, torch.int32, (1, ))
    if debug:
        dbg = torch.full((grid, int(NUM_ROLES), debug_iters, 2), -1, dtype=torch.int32, device=dev)
        dbg_tiles = torch.full((grid, debug_tiles, 2), -1, dtype=torch.int32, device=dev)
    args = (x_desc, w_desc, s_desc, b_desc, out_desc, sc_desc, sw_desc, out, out.stride(0), x_scale, w_scale,
            w_mul if w_mul is not None else i32, col_scale if col_scale is not None else i32,
            bias if bias is not None else i32, dbg if debug else i32, dbg_tiles if debug else i32, km, kn, K)
    constexprs = dict(FMT=f, G2=group_size, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, BLOCK_R=br, GROUP_M=config.group_m,
                      STAGES=config.num_stages, LOWRANK_STAGES=max(1, config.lowrank_stages), HAS_LOWRANK=r > 0,
                      HAS_COL_SCALE=col_scale is not None, HAS_BIAS=bias is not None, EPI_TMA=epi_tma,
                      DEBUG=debug, DEBUG_ITERS=debug_iters, DEBUG_TILES=debug_tiles, SCALE_TMA=scale_tma,
                      SWAR=swar, RAW_STAGES_N=raw_stages, CONSUMER_ORDER=consumer_order, F8=f8, PAIRED=paired,
                      EXPANDERS=expanders, INFLIGHT=inflight, COOP=coop, WS_PERM=ws_perm, A8=a8, TRANS=trans)
    return grid, args, constexprs, config, (dbg, dbg_tiles)


def ws_row_order(w_scale: torch.Tensor, block_n: int) -> torch.Tensor:
    """w_scale [K/G, N] (N % block_n == 0) as fp32 (exact) with each block_n-column block permuted for the kernel's
    128-bit row loads (:func:`_ws_perm_layout`): column c = 16h + 8l + 2q + e goes to 16h + 4q + 2l + e. One copy."""
    g, n = w_scale.shape
    out = torch.empty((g, n), dtype=torch.float32, device=w_scale.device)
    nb, nh = n // block_n, block_n // 16
    out.view(g, nb, nh, 4, 2, 2).copy_(w_scale.view(g, nb, nh, 2, 4, 2).transpose(3, 4))
    return out


def f8_default() -> bool:
    """Whether int4_g v2 takes the fp8 MMA path by default (``LOWRANK_GEMM_V2_F8``, default on: H200, same
    process, fc1 GEMM 1206 → 883 µs, fc2 1250 → 978, M=64 decode 77.7 → 58.7; ``=0`` restores the int8 path)."""
    return getenv("LOWRANK_GEMM_V2_F8", "1") != "0"


# From this many tokens the f8 path runs without expanders (weights expanded per call, consumers sharing the weight
# tile, two partials in flight). The expansion costs one pass over the weights (fc1: 20.6 µs), the GEMM saves a
# fixed fraction of its M-proportional time, so the crossover is an M: H200, N = 12288, K = 3072, GEMM + expansion
# vs the two-expander kernel, same process (probes/s24/call5, both with their slot fences): M = 256 70.9 vs 56.3 µs,
# 384 90.8 vs 86.9, 512 91.0 vs 99.6, 640 111.6 vs 130.3, 768 131.3 vs 149.5 (session 23, before the fences and the
# fp32 rows: 512 89.5 vs 89.0 → 768).
W8_MIN_M = 512


def f8_expanders_default(m: int | None = None) -> int:
    """Expander warpgroups of the f8 path (``LOWRANK_GEMM_V2_F8_EXPANDERS`` pins it): 0 from :data:`W8_MIN_M` tokens,
    else 2. H200, same process: two expanders with paired consumer K loops fc1 885 → 754 µs, fc2 941 → 793, M=64
    58.5 → 55.0 against one; none (coop, in flight) fc1 746 → 574 + 20.6 (the per-call weight expansion)."""
    env = getenv("LOWRANK_GEMM_V2_F8_EXPANDERS", "")
    if env:
        return int(env)
    return 0 if m is not None and m >= W8_MIN_M else 2


def inflight_default(expanders: int) -> int:
    """Groups per in-flight loop body of the f8 consumers (0: no second partial; ``LOWRANK_GEMM_V2_INFLIGHT``: 0 off,
    1 :data:`INFLIGHT_DEPTH`, n ≥ 2 that many; default: :data:`INFLIGHT_DEPTH` only without expanders, where the
    consumers have the registers for it). H200, coop, 16-bit rows, same process, with the slot fences: pairs take
    fc1 632 → 607 µs, fc2 634 → 607 (probes/s24/call4; session 23, unfenced: 604 → 574)."""
    v = getenv("LOWRANK_GEMM_V2_INFLIGHT", "")
    if v == "":
        return INFLIGHT_DEPTH if expanders == 0 else 0
    return inflight_depth(int(v))


def inflight_depth(v) -> int:
    """``inflight`` as the kernel takes it: False / 0 → 0, True / 1 → :data:`INFLIGHT_DEPTH`, n ≥ 2 → n."""
    n = int(v)
    if n < 0:
        raise ValueError(f"w4a4 v2: inflight is a bool or a group count ≥ 2, got {v!r}")
    return INFLIGHT_DEPTH if n == 1 else n


# H100, GEMM alone, same process, two runs (probes/s41f, s41g; trans pairs vs the default four groups per body):
# K = 3072: fc1 461 / 457 vs 512 / 504 µs, 3072→9216 368 / 356 vs 404 / 390, 3072² 129 / 129 vs 130 / 130;
# K = 12288 (fc2): trans pairs 529 / 532 vs 514 / 506 untransposed. H200 (probes/s44, one process): trans with four
# groups per body takes fc2 to 495.6 against 505.8 untransposed, so trans runs up to this K, deep above
# A8_TRANS_DEEP_K.
A8_TRANS_MAX_K = 12288


# Groups per in-flight body on the trans route: pairs up to K = A8_TRANS_DEEP_K, four above. H200, probes/s44, GEMM
# µs pairs / four: fc1 446.1 / 451.6, 3072² 125.2 / 126.3, 3072→9216 355.2 / 341.9 (K = 3072: pairs win two of
# three, kept); fc2 four 495.6 (pairs lost to the untransposed route on H100, above).
A8_TRANS_DEPTH = 2
A8_TRANS_DEEP_DEPTH = 4
A8_TRANS_DEEP_K = 4096


def a8_inflight_default(trans: bool, k: int | None = None) -> int:
    """Groups per in-flight body of the A8 route, which always runs in flight: ``LOWRANK_GEMM_V2_INFLIGHT`` = n ≥ 1
    (as :func:`inflight_default`), else — unset or 0, the int4 routes' "off" — for trans :data:`A8_TRANS_DEPTH` up to
    K = :data:`A8_TRANS_DEEP_K` and :data:`A8_TRANS_DEEP_DEPTH` above, and :data:`INFLIGHT_DEPTH` without trans."""
    v = getenv("LOWRANK_GEMM_V2_INFLIGHT", "")
    if v not in ("", "0"):
        return inflight_depth(int(v))
    if not trans:
        return INFLIGHT_DEPTH
    return A8_TRANS_DEEP_DEPTH if k is not None and k > A8_TRANS_DEEP_K else A8_TRANS_DEPTH


def a8_trans_default(k: int | None = None) -> bool:
    """Whether the A8 route computes Yᵀ (``trans``: the weights as the kernel's rows, so each consumer thread rescales
    with two weight scales per group, loaded from global memory, and releases slots without a proxy fence):
    ``LOWRANK_GEMM_V2_A8_TRANS`` = 0 / 1, else K ≤ :data:`A8_TRANS_MAX_K`."""
    v = getenv("LOWRANK_GEMM_V2_A8_TRANS", "")
    if v != "":
        return v == "1"
    return k is not None and k <= A8_TRANS_MAX_K


def ws_f32_default() -> bool:
    """fp32 w_scale rows on the no-expander path (``LOWRANK_GEMM_V2_WS_F32``: default on, ``=0`` off): the consumers
    read each column's scale without a bf16 → fp32 conversion per group (the row is converted once per call, exactly).
    H200, coop in flight, same process, with the slot fences: fc1 607 → 562 µs, fc2 607 → 553, bit-identical
    (probes/s24/call4)."""
    return getenv("LOWRANK_GEMM_V2_WS_F32", "1") != "0"


def ws_perm_default() -> bool:
    """Whether fp32 w_scale rows come permuted for 128-bit loads (:func:`ws_row_order`; ``LOWRANK_GEMM_V2_WS_PERM=1``
    on where N is a multiple of block_n; default off: H200, same process, GEMM alone 0 to −1.3 % with pairs and
    +0.2…+1.5 % with four groups per in-flight body, where ptxas spills 32 bytes of the consumers' registers at fc1;
    probes/s25/call4)."""
    return getenv("LOWRANK_GEMM_V2_WS_PERM", "0") == "1"


def fuse_ws_default() -> bool:
    """Whether the fp32 w_scale rows come out of the weight expansion's launch (``LOWRANK_GEMM_V2_FUSE_WS``: default
    on, ``=0`` a conversion launch of their own). H200, same process, GEMM with its per-call expansion: fc1 559.8 →
    554.9 µs, fc2 551.7 → 546.1, 3072² 153.2 → 149.6, 9216 419.4 → 414.5, bit-identical (probes/s25/fusews)."""
    return getenv("LOWRANK_GEMM_V2_FUSE_WS", "1") != "0"


def coop_default(expanders: int) -> bool:
    """Whether the no-expander kernel shares weight tiles between its consumers (``LOWRANK_GEMM_V2_COOP``: 1 / 0;
    default: whenever there is no expander). H200, paired → coop, with the slot fences: fc1 654 → 632 µs, fc2 657 →
    634 (probes/s24/call4)."""
    v = getenv("LOWRANK_GEMM_V2_COOP", "")
    return expanders == 0 and v != "0"


def paired_default() -> bool:
    """Whether the int4_g f8 path pairs its consumers' K loops by default (``LOWRANK_GEMM_V2_PAIRED``, default on).
    With one expander it measured within noise (fc1 910 vs 923 µs: the expander bounded the kernel); with two
    expanders it takes fc1 935 → 754 µs (:func:`f8_expanders_default`)."""
    return getenv("LOWRANK_GEMM_V2_PAIRED", "1") != "0"


def two_level_enabled() -> bool:
    """int4_2l v2 hung on the H200 in session 1; after the two fixes (benchmarks/NOTES.md) the bisect ladder
    (r3–r7) and tests/test_gluon_gpu.py passed on the H200 in session 2, so it is on by default.
    ``LOWRANK_GEMM_GLUON_2L=0`` turns it off again (instant fallback to v1 without a code change)."""
    return getenv("LOWRANK_GEMM_GLUON_2L", "1") != "0"


def launch_w4a4_v2(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt: str,
                   group_size: int, config: KernelConfig | None = None, *, col_scale=None, debug: bool = False,
                   grid: int | None = None, consumer_order: bool = True, scale_tma: bool | None = None,
                   swar: bool = True, raw_stages: int | None = None, f8: bool | None = None,
                   paired: bool | None = None, expanders: int | None = None, inflight: bool | None = None,
                   w_f8=None, coop: bool | None = None, ws_f32: bool | None = None, ws_perm: bool | None = None,
                   fuse_ws: bool | None = None, quad: bool | None = None, trans: bool | None = None,
                   _dims: tuple | None = None):
    """out [M, N] ← W4A4 v2; the argument contract of ``kernels.w4a4_gemm`` (its module docstring),
    plus ``col_scale`` [N] (optional per-column factor on the main product). Returns ``out``, or
    ``(out, (dbg [grid, roles, iters, 2] int32, tiles [grid, DEBUG_TILES, 2] int32))`` with ``debug``.
    ``quad`` (None = :func:`w4a4_quad.quad_default` where the call resolves to the no-expander int4_g64 route with
    no option of the other kernels pinned): the four-consumer kernel (gluon/w4a4_quad.py) runs it instead.
    ``_dims``: (M, N, K, r) already checked by the GEMM op (``w4a4_gemm.check_gemm_args``)."""
    from .w4a4_quad import launch_w4a4_quad, quad_default, quad_route
    if quad is None:
        quad = quad_default() and quad_route(x_q, w_q, lowrank_act, fmt, group_size, dict(
            config=config, debug=debug, grid=grid, scale_tma=scale_tma, f8=f8, paired=paired, expanders=expanders,
            inflight=inflight, coop=coop, ws_f32=ws_f32, ws_perm=ws_perm, raw_stages=raw_stages))
    if quad:
        _expect(not debug, "quad has no debug trace (debug=True runs the other kernels)")
        return launch_w4a4_quad(x_q, x_scale, w_q, w_scale, lowrank_act, lora_up, bias, out, group_size,
                                col_scale=col_scale, w_f8=w_f8, grid=grid)
    g, args, cx, _, dbgs = kernel_args_v2(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out,
                                           fmt, group_size, config, col_scale=col_scale, debug=debug, grid=grid,
                                           consumer_order=consumer_order, scale_tma=scale_tma, swar=swar,
                                           raw_stages=raw_stages, f8=f8, paired=paired, expanders=expanders,
                                           inflight=inflight, w_f8=w_f8, coop=coop, ws_f32=ws_f32, ws_perm=ws_perm,
                                           fuse_ws=fuse_ws, trans=trans, _dims=_dims)
    if _fmt_id(fmt) == FMT_INT4_2L and not two_level_enabled():
        raise NotImplementedError("int4_2l v2 is switched off by LOWRANK_GEMM_GLUON_2L=0; use impl='v1'")
    launch(w4a4_ws_kernel, (g, ), *args, **cx, num_warps=DEFAULT_WARPS)
    return (out, dbgs) if debug else out


# =============================================================================================
# Test/bench support.
def reference_v2(ops: dict) -> torch.Tensor:
    """float64 spec (``reference.w4a4_gemm_ref``) of a :func:`make_operands_v2` problem, on the CPU;
    ``col_scale`` (v2's optional extra) multiplies the main product only."""
    from ...reference import w4a4_gemm_ref
    c = {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in ops.items()}
    main = w4a4_gemm_ref(c["x_q"], c["x_scale"], c["w_q"], c["w_scale"], w_mul=c["w_mul"],
                         group_size=c["group_size"], fmt=c["fmt"])
    if c.get("col_scale") is not None:
        main = main * c["col_scale"].double()
    from ...reference import lowrank_epilogue_ref
    s = c["lowrank_act"].to(c["lora_up"].dtype) if c["lowrank_act"] is not None else None
    return lowrank_epilogue_ref(main, s, c["lora_up"], bias=c["bias"])


def make_operands_v2(fmt, M, N, K, rank, group_size=64, *, device="cuda", bias=True, col_scale=False,
                     out_dtype=torch.bfloat16, lowrank_dtype=torch.bfloat16, seed=0, a8=False):
    """Random, non-degenerate operands in the launcher contract (kwargs of :func:`launch_w4a4_v2`);
    ``out`` is poisoned with NaN so unwritten elements fail the comparison. ``a8`` (int4_g64): per-token e4m3
    activations (x_q e4m3 [M, K] over its whole range, x_scale float32 [M])."""
    from ...formats.int4 import pack_int4
    if fmt == "int4_g":
        fmt = "int4_g64"
    g = torch.Generator().manual_seed(seed)
    wq = pack_int4(torch.randint(-8, 8, (N, K), generator=g, dtype=torch.int8))
    if _fmt_id(fmt) == FMT_INT4_2L:
        xq = torch.randint(-120, 121, (M, K), generator=g, dtype=torch.int8)
        xs = torch.rand(M, generator=g) * 0.02 + 0.005
        ws = torch.rand(N, generator=g) * 0.02 + 0.005
        wmul = torch.randint(1, 16, (K // group_size, N), generator=g, dtype=torch.uint8)
    else:
        xq = pack_int4(torch.randint(-8, 8, (M, K), generator=g, dtype=torch.int8))
        xs = (torch.rand(K // group_size, M, generator=g) * 0.1 + 0.02).to(torch.bfloat16)
        ws = (torch.rand(K // group_size, N, generator=g) * 0.1 + 0.02).to(torch.bfloat16)
        wmul = None
    if a8:
        xq = (torch.randn(M, K, generator=g) * 120).clamp(-448, 448).to(torch.float8_e4m3fn)
        xs = torch.rand(M, generator=g) * 0.002 + 0.0005
    s = torch.randn(M, rank, generator=g) if rank else None
    up = (torch.randn(N, rank, generator=g) * 0.1).to(lowrank_dtype) if rank else None
    b = torch.randn(N, generator=g).to(torch.bfloat16) if bias else None
    cs = (torch.rand(N, generator=g) + 0.5) if col_scale else None
    out = torch.full((M, N), float("nan"), dtype=out_dtype)
    ops = dict(x_q=xq, x_scale=xs, w_q=wq, w_scale=ws, w_mul=wmul, lowrank_act=s, lora_up=up, bias=b, out=out,
               fmt=fmt, group_size=group_size, col_scale=cs)
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in ops.items()}


# =============================================================================================
# Ahead-of-time compile (CI, CPU): signature from CPU stand-in tensors of a small problem.
def aot_signature_v2(fmt, config: KernelConfig | None = None, *, M=96, N=160, K=384, rank=16, group_size=64,
                     out_dtype=torch.bfloat16, bias=True, col_scale=True, debug=False, scale_tma=None, swar=True,
                     raw_stages=None, f8=None, paired=None, expanders=None, inflight=None, coop=None, ws_f32=None,
                     ws_perm=None, a8=False, trans=None):
    """(signature, constexprs, config) for ``kernels.aot.compile_sm90`` of :func:`w4a4_ws_kernel` (``a8``: per-token
    e4m3 activations)."""
    import inspect
    from triton.runtime.jit import mangle_type
    ops = make_operands_v2(fmt, M, N, K, rank, group_size, device="cpu", bias=bias, col_scale=col_scale,
                           out_dtype=out_dtype, a8=a8)
    _, args, cx, cfg, _ = kernel_args_v2(**ops, config=config, debug=debug, scale_tma=scale_tma, swar=swar,
                                         raw_stages=raw_stages, f8=f8, paired=paired, expanders=expanders,
                                         inflight=inflight, coop=coop, ws_f32=ws_f32, ws_perm=ws_perm, trans=trans)
    names = [n for n in inspect.signature(w4a4_ws_kernel.fn).parameters if n not in cx]
    sig = {n: (mangle_type(a) if not isinstance(a, int) else "i32") for n, a in zip(names, args)}
    return sig, cx, cfg
