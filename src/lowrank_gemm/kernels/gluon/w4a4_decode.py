"""W4A4 decode GEMM (M ≤ 64, both formats): swap-AB with the weights as the REGISTER operand of wgmma.

    outᵀ[N, M] = epilogue( W[N, K] · x[M, K]ᵀ )        (same launcher contract as kernels/w4a4_gemm.py)

Why a separate kernel: at decode sizes the whole cost is streaming 4-bit weights (K=4096, N=28672: 58.7 MB,
≈ 14 µs at the H200's copy bandwidth). The v2 kernel (w4a4_ws) keeps only two packed stages in flight per SM
(its SMEM goes to the expanded 8-bit ring the wgmma reads) and reached 56–69 µs; the v1 swap-AB kernel
95–101 µs (Triton serializes the unpack with the MMA). Here no expanded weight ever touches shared memory:

- one ring of STAGES slots, each the TMA copies of one K step: packed weights [BN, BK/2], the token tile
  (int4_2l: int8 x [BT, BK], the wgmma B operand read in place; int4_g64: packed [BT, BK/2], expanded once per
  step into one int8 tile), and the [K/G, N] row table of the step's groups (2l: multipliers u; g64: w_scale);
- the consumer loads each 64-wide packed block straight into the wgmma A-operand register layout
  (k_width 4: every 32-bit register holds four consecutive K bytes of one weight row), expands it in
  registers (SWAR, kernels/int4_unpack.py: low nibbles → K 0–31 of the block, high → 32–63, so no shuffles;
  2l multiplies by u in the same step) and issues two register-A wgmmas (m64nBTk32) against x's two 32-column
  slices. int4_2l accumulates int32 through K (async wgmmas); int4_g64 rescales a per-block int32 partial by
  w_scale ⊗ x_scale into fp32 (cheap here: BN·BT/128 elements per thread);
- int4_g64 with ``F8`` (e4m3 MMA; the v2 kernel's trick, gluon/w4a4_ws.py module doc): the tokens arrive
  pre-expanded (``w4_expand.expand_act_f8``: x8 e4m3 [M, K], exact q) and are TMA-copied straight into the
  ring as the wgmma B operand (no per-step expansion, fence or barrier), with the per-group rows
  xab [K/G, 2, M] = (2⁹·xs, −8·R·xs) instead of x_scale. The weights become OFFSET nibbles n' = q + 8 (one
  LOP3 per four bytes), whose bit patterns are e4m3 n'·2⁻⁹; per group a fresh fp32 partial
  P' = 2⁻⁹·Σ q_x·(q_w + 8) comes out of the e4m3 wgmmas and acc = fma(fma(P', a[m], b[m]), ws[n], acc):
  no I2F. Group j's wgmmas are issued before group j−1 is waited for and rescaled, so the MMA latency hides
  behind the next group's ldmatrix + expansion;
- no warp specialization: the ring keeps STAGES−1 steps of TMA in flight, and two CTAs share an SM, so one
  CTA's expansion overlaps the other's loads. A slot is refilled once every warp has passed its SMEM reads
  (thread barrier) and the wgmmas that read it retired. H200 profile (NOTES.md, session 3): latency-bound,
  ≈ 2.2 TB/s of weights at M ≤ 16;
- epilogue in registers: (2l: × t[m] × s[n]) × col_scale[n], + Σ_r up[n, r]·S[m, r] (S rounded to lora_up's
  dtype like the unfused reference; r ≤ 64 FMAs per element), + bias[n], then a masked store of the
  transposed tile (M ≤ 64 rows: the output is < 4 MB).
Deterministic: one program per output tile, fixed K order, no atomics.
"""

from __future__ import annotations

import os

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from ...plan.config import KernelConfig
from ...plan.smem import SmemLedger, SmemTerm, barrier_bytes, tile_bytes
from ..schedule import cdiv
from .host import desc, dummy
from .skeleton import alloc_barriers
from .w4a4_ws import _f8_operands, _nibbles, _offset_nibbles_f8

__all__ = ["decode_ledger", "plan_decode", "default_decode_config", "launch_w4a4_decode", "w4a4_decode_kernel",
           "decode_enabled", "aot_signature_decode", "check_decode_config", "decode_f8_default", "F8_DEFAULT"]

PACK = 64                 # formats.int4.PACK_BLOCK
WARPS = 4                 # one warpgroup
CTAS_PER_SM = 2           # the default ring depth leaves room for this many CTAs per SM
SM90_SMEM_PER_SM = 228 * 1024
_PACK = gl.constexpr(PACK)
FMT_INT4_G = 0            # w4a4_ws's format ids
FMT_INT4_2L = 1
_FMT_G = gl.constexpr(FMT_INT4_G)
_FMT_2L = gl.constexpr(FMT_INT4_2L)
U_ROW = 128               # bytes per SMEM row of u (≥ block_n; TMA destinations are 128-byte aligned)
_U_ROW = gl.constexpr(U_ROW)
F8_DEFAULT = True         # int4_g64 takes the e4m3 path when f8=None: H200, same process, GEMM 43.7 → 33.7 µs
                          # (M=1), 44.9 → 35.2 (M=16), outputs equal to the int8 path's in fp32 (probe_decode
                          # session 4); env LOWRANK_GEMM_DECODE_F8=0/1 overrides


@gluon.jit
def _issue_step(step, x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, off_t, off_n, N, k_tiles,
                STAGES: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, G2: gl.constexpr, pred,
                FMT: gl.constexpr, F8: gl.constexpr = False):
    """TMA copies of K step ``step`` into slot step % STAGES (predicated off past the last step). The row tables
    (2l: u [K/G, N] uint8; g: w_scale [K/G, N] 16-bit) come through a 1-D view (box starts row·N + off_n:
    16-byte aligned as N % 16 == 0), each into its own 128-byte-aligned SMEM row (TMA destinations must be;
    a 64-byte pitch faulted on the H200)."""
    UR: gl.constexpr = BLOCK_K // G2
    slot = step % STAGES
    ok = (step < k_tiles) & pred
    bar = ready.index(slot)
    mbarrier.expect(bar, x_desc.block_type.nbytes + w_desc.block_type.nbytes + UR * u_desc.block_type.nbytes,
                    pred=ok)
    if FMT == _FMT_2L or F8:     # 8-bit tokens [BT, BK] (2l int8, F8 e4m3)
        tma.async_copy_global_to_shared(x_desc, [off_t, step * BLOCK_K], bar, x_bufs.index(slot), pred=ok)
    else:
        tma.async_copy_global_to_shared(x_desc, [off_t, step * (BLOCK_K // 2)], bar, x_bufs.index(slot), pred=ok)
    tma.async_copy_global_to_shared(w_desc, [off_n, step * (BLOCK_K // 2)], bar, w_bufs.index(slot), pred=ok)
    for j in gl.static_range(UR):
        dst = u_bufs.index(slot * UR + j).slice(0, BLOCK_N)
        tma.async_copy_global_to_shared(u_desc, [((step * BLOCK_K) // G2 + j) * N + off_n], bar, dst, pred=ok)


@gluon.jit
def _token_scales(xscale_ptr, step, k_tiles, off_t, M, BLOCK_T: gl.constexpr, BLOCK_K: gl.constexpr,
                  G2: gl.constexpr, mma: gl.constexpr):
    """g: the token scales x_scale[g, off_t:off_t+BT] of step ``step``'s groups as rows of a [16, BT] fp32 tile in
    the accumulator layout (row j = the step's j-th group; rows ≥ BK/G and steps ≥ k_tiles are 0)."""
    UR: gl.constexpr = BLOCK_K // G2
    rows = gl.arange(0, 16, gl.SliceLayout(1, mma))
    offs_t = off_t + gl.arange(0, BLOCK_T, gl.SliceLayout(0, mma))
    g = (step * BLOCK_K) // G2 + rows
    mask = (rows < UR)[:, None] & (offs_t < M)[None, :] & (step < k_tiles)
    return gl.load(xscale_ptr + g[:, None] * M + offs_t[None, :], mask=mask, other=0.0).to(gl.float32)


@gluon.jit
def _mainloop_2l(x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, off_t, off_n, N, k_tiles,
                 STAGES: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_T: gl.constexpr, BLOCK_K: gl.constexpr,
                 G2: gl.constexpr, SWAR: gl.constexpr, MMA_ASYNC: gl.constexpr,
                 mma: gl.constexpr):
    """int32 accumulation of (q⊙u)·xᵀ straight through K (t ⊗ s applied in the epilogue)."""
    NB: gl.constexpr = BLOCK_K // _PACK
    UR: gl.constexpr = BLOCK_K // G2
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    acc = gl.zeros([BLOCK_N, BLOCK_T], gl.int32, mma)
    for kk in range(k_tiles):
        slot = kk % STAGES
        mbarrier.wait(ready.index(slot), (kk // STAGES) & 1)
        wp = w_bufs.index(slot)
        xb = x_bufs.index(slot)
        for b in gl.static_range(NB):
            packed = wp.slice(b * (_PACK // 2), _PACK // 2, dim=1).load(a_layout).to(gl.int8, bitcast=True)
            u = u_bufs.index(slot * UR + (b * _PACK) // G2).slice(0, BLOCK_N).load(gl.SliceLayout(1, a_layout))
            lo, hi = _nibbles(packed, u.to(gl.int8), True, SWAR)   # q·u: one IMUL per four bytes
            xl = xb.slice(b * _PACK, _PACK // 2, dim=1).permute((1, 0))
            xh = xb.slice(b * _PACK + _PACK // 2, _PACK // 2, dim=1).permute((1, 0))
            if MMA_ASYNC:
                # ptxas keeps the register operands of an in-flight wgmma intact (PTX registers are virtual;
                # it serializes only if it runs out), so the next block's expansion overlaps these MMAs
                acc = warpgroup_mma(lo, xl, acc, is_async=True)
                acc = warpgroup_mma(hi, xh, acc, is_async=True)
            else:
                acc = warpgroup_mma(lo, xl, acc)
                acc = warpgroup_mma(hi, xh, acc)
        if MMA_ASYNC:
            # step kk-1's wgmmas have retired (this step's 2·NB groups may still run): refill its slot
            acc = warpgroup_mma_wait(2 * NB, deps=(acc, ))
            gl.thread_barrier()      # every warp is past step kk-1's SMEM reads too
            _issue_step(kk - 1 + STAGES, x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, off_t, off_n, N,
                        k_tiles, STAGES, BLOCK_N, BLOCK_K, G2, kk > 0, _FMT_2L)
        else:
            # this step's wgmmas retired and every warp is past its SMEM reads: refill the slot with step
            # kk + STAGES (the other STAGES - 1 slots are in flight meanwhile)
            gl.thread_barrier()
            _issue_step(kk + STAGES, x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, off_t, off_n, N,
                        k_tiles, STAGES, BLOCK_N, BLOCK_K, G2, True, _FMT_2L)
    if MMA_ASYNC:
        acc = warpgroup_mma_wait(0, deps=(acc, ))
    return acc.to(gl.float32)


@gluon.jit
def _mainloop_g(x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, xe, ready, xscale_ptr, off_t, off_n, M, N,
                k_tiles, STAGES: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_T: gl.constexpr,
                BLOCK_K: gl.constexpr, G2: gl.constexpr, SWAR: gl.constexpr, mma: gl.constexpr):
    """SVDQuant standard format: per 64-wide block an int32 partial (two register-A wgmmas), then
    acc += partial ⊙ w_scale[g, n] ⊗ x_scale[g, m] in fp32 — the per-group rescale is only BN·BT/128
    elements per thread here, which is why this format is cheap at decode sizes. The packed token tile is
    expanded once per step into ``xe`` (the wgmma B operand must be in shared memory)."""
    NB: gl.constexpr = BLOCK_K // _PACK
    UR: gl.constexpr = BLOCK_K // G2
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    nw: gl.constexpr = gl.num_warps()
    x_layout: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [nw, 1], [1, 0])
    acc = gl.zeros([BLOCK_N, BLOCK_T], gl.float32, mma)
    zero = gl.zeros([BLOCK_N, BLOCK_T], gl.int32, mma)
    rows = gl.arange(0, 16, gl.SliceLayout(1, mma))
    xs_next = _token_scales(xscale_ptr, 0, k_tiles, off_t, M, BLOCK_T, BLOCK_K, G2, mma)
    for kk in range(k_tiles):
        xs_step = xs_next
        xs_next = _token_scales(xscale_ptr, kk + 1, k_tiles, off_t, M, BLOCK_T, BLOCK_K, G2, mma)   # prefetch
        slot = kk % STAGES
        mbarrier.wait(ready.index(slot), (kk // STAGES) & 1)
        xp = x_bufs.index(slot)
        for b in gl.static_range(NB):
            packed_x = xp.slice(b * (_PACK // 2), _PACK // 2, dim=1).load(x_layout).to(gl.int8, bitcast=True)
            xlo, xhi = _nibbles(packed_x, packed_x, False, SWAR)
            xe.slice(b * _PACK, _PACK // 2, dim=1).store(xlo)
            xe.slice(b * _PACK + _PACK // 2, _PACK // 2, dim=1).store(xhi)
        fence_async_shared()
        gl.thread_barrier()          # every warp's expanded bytes are in xe before any wgmma reads them
        wp = w_bufs.index(slot)
        for b in gl.static_range(NB):
            packed = wp.slice(b * (_PACK // 2), _PACK // 2, dim=1).load(a_layout).to(gl.int8, bitcast=True)
            lo, hi = _nibbles(packed, packed, False, SWAR)
            part = warpgroup_mma(lo, xe.slice(b * _PACK, _PACK // 2, dim=1).permute((1, 0)), zero,
                                 use_acc=False, is_async=True)
            part = warpgroup_mma(hi, xe.slice(b * _PACK + _PACK // 2, _PACK // 2, dim=1).permute((1, 0)), part,
                                 is_async=True)
            ws = u_bufs.index(slot * UR + (b * _PACK) // G2).slice(0, BLOCK_N).load(gl.SliceLayout(1, mma))
            xs = gl.sum(gl.where((rows == (b * _PACK) // G2)[:, None], xs_step, 0.0), axis=0)
            part = warpgroup_mma_wait(0, deps=(part, ))
            acc = acc + part.to(gl.float32) * ws.to(gl.float32)[:, None] * xs[None, :]
        # every wgmma of this step retired (waited above); all warps past their SMEM reads → refill
        gl.thread_barrier()
        _issue_step(kk + STAGES, x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, off_t, off_n, N,
                    k_tiles, STAGES, BLOCK_N, BLOCK_K, G2, True, _FMT_G)
    return acc


@gluon.jit
def _mainloop_g_f8(x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, xab_ptr, off_t, off_n, M, N, K,
                   k_tiles, STAGES: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_T: gl.constexpr,
                   BLOCK_K: gl.constexpr, G2: gl.constexpr, SWAR: gl.constexpr, mma: gl.constexpr):
    """int4_g64 on e4m3 wgmmas (module doc). Per group j of a step: 2·G/64 register-A wgmmas (m64nBTk32,
    .e4m3.e4m3) chain into a fresh fp32 partial; then group j−1's partial is waited for (everything but group
    j's wgmmas retires) and folded in: acc = fma(fma(P', a, b), ws, acc) — so the tensor cores run under the
    next group's ldmatrix + LOP3s. The step's last group is waited for in full before the step ends: an
    in-flight partial carried over the loop's back edge makes ptxas serialize EVERY wgmma (C7514 "non wgmma
    instructions reading accumulator registers"; seen with the carried variant). Then the slot is refilled.
    The rows a, b: two [BT] loads per group straight into the accumulator's column layout, two groups ahead
    (an L2 hit hides behind two groups' work); rows of groups past K/G and tokens ≥ M load as 0, so their
    partials (0 by TMA's zero fill) add exactly 0. (One [16, BT] tile per step with rows picked by a masked sum
    cost ~250 more SASS instructions per loop at BT = 16: 969 vs 826.)"""
    UR: gl.constexpr = BLOCK_K // G2
    BPG: gl.constexpr = G2 // _PACK       # 64-wide blocks per group
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    NG = K // G2
    acc = gl.zeros([BLOCK_N, BLOCK_T], gl.float32, mma)
    zero = gl.zeros([BLOCK_N, BLOCK_T], gl.float32, mma)
    offs_t = off_t + gl.arange(0, BLOCK_T, gl.SliceLayout(0, mma))
    t_ok = offs_t < M
    a1 = gl.load(xab_ptr + offs_t, mask=t_ok & (NG > 0), other=0.0)          # group 0
    b1 = gl.load(xab_ptr + M + offs_t, mask=t_ok & (NG > 0), other=0.0)
    a2 = gl.load(xab_ptr + 2 * M + offs_t, mask=t_ok & (NG > 1), other=0.0)  # group 1
    b2 = gl.load(xab_ptr + 3 * M + offs_t, mask=t_ok & (NG > 1), other=0.0)
    for kk in range(k_tiles):
        slot = kk % STAGES
        mbarrier.wait(ready.index(slot), (kk // STAGES) & 1)
        wp = w_bufs.index(slot)
        xb = x_bufs.index(slot)
        for j in gl.static_range(UR):
            part = zero
            for b in gl.static_range(j * BPG, (j + 1) * BPG):    # the group's 64-wide blocks
                packed = wp.slice(b * (_PACK // 2), _PACK // 2, dim=1).load(a_layout).to(gl.int8, bitcast=True)
                lo, hi = _offset_nibbles_f8(packed, SWAR)
                part = warpgroup_mma(lo, xb.slice(b * _PACK, _PACK // 2, dim=1).permute((1, 0)), part,
                                     use_acc=b > j * BPG, is_async=True)
                part = warpgroup_mma(hi, xb.slice(b * _PACK + _PACK // 2, _PACK // 2, dim=1).permute((1, 0)), part,
                                     is_async=True)
            ws = u_bufs.index(slot * UR + j).slice(0, BLOCK_N).load(gl.SliceLayout(1, mma)).to(gl.float32)
            a = a1
            bv = b1
            a1 = a2
            b1 = b2
            g2 = kk * UR + j + 2        # two groups ahead (the flat rows of xab [K/G, 2, M] are 2g, 2g + 1)
            a2 = gl.load(xab_ptr + (2 * g2) * M + offs_t, mask=t_ok & (g2 < NG), other=0.0)
            b2 = gl.load(xab_ptr + (2 * g2 + 1) * M + offs_t, mask=t_ok & (g2 < NG), other=0.0)
            if j > 0:
                done = warpgroup_mma_wait(2 * BPG, deps=(prev, ))   # all but group j's wgmmas retired
                acc = gl.fma(gl.fma(done, pa[None, :], pb[None, :]), pw[:, None], acc)
            prev = part
            pa = a
            pb = bv
            pw = ws
        done = warpgroup_mma_wait(0, deps=(prev, ))
        acc = gl.fma(gl.fma(done, pa[None, :], pb[None, :]), pw[:, None], acc)
        # every wgmma of this step retired and every warp is past its SMEM reads: refill the slot with step
        # kk + STAGES (the other STAGES − 1 slots are in flight meanwhile)
        gl.thread_barrier()
        _issue_step(kk + STAGES, x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, off_t, off_n, N,
                    k_tiles, STAGES, BLOCK_N, BLOCK_K, G2, True, _FMT_G, True)
    return acc


@gluon.jit(do_not_specialize=["M", "N", "K", "stride_om", "stride_sm", "stride_un", "R"])
def w4a4_decode_kernel(x_desc, w_desc, u_desc,
                       out_ptr, stride_om, xscale_ptr, wscale_ptr, col_scale_ptr, bias_ptr,
                       s_ptr, stride_sm, up_ptr, stride_un,
                       M, N, K, R,
                       G2: gl.constexpr, BLOCK_T: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                       STAGES: gl.constexpr, HAS_LOWRANK: gl.constexpr,
                       HAS_COL_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr, SWAR: gl.constexpr,
                       MMA_ASYNC: gl.constexpr = True, FMT: gl.constexpr = 1, F8: gl.constexpr = False):
    gl.static_assert(BLOCK_K % _PACK == 0, "BLOCK_K must be a multiple of the 64-wide pack block")
    gl.static_assert(BLOCK_K % G2 == 0, "a K step covers whole groups")
    gl.static_assert(not F8 or FMT == _FMT_G, "F8 (e4m3 MMA) is the int4_g64 path's variant")
    pid_n = gl.program_id(0)
    pid_t = gl.program_id(1)
    off_n = pid_n * BLOCK_N
    off_t = pid_t * BLOCK_T
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                  instr_shape=[16, BLOCK_T, 32])
    # Every SMEM buffer and barrier of the kernel is declared here (decode_ledger mirrors it).
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(gl.uint8, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    UR: gl.constexpr = BLOCK_K // G2
    EB: gl.constexpr = u_desc.dtype.primitive_bitwidth // 8
    ROW: gl.constexpr = BLOCK_N if BLOCK_N * EB >= _U_ROW else _U_ROW // EB
    u_bufs = gl.allocate_shared_memory(u_desc.dtype, [STAGES * UR, ROW], u_desc.layout)
    ready = alloc_barriers(STAGES, 1)

    k_tiles = gl.cdiv(K, BLOCK_K)
    for i in gl.static_range(STAGES):
        _issue_step(i, x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, off_t, off_n, N, k_tiles,
                    STAGES, BLOCK_N, BLOCK_K, G2, True, FMT, F8)
    if F8:   # xscale_ptr = xab [K/G, 2, M] fp32
        acc = _mainloop_g_f8(x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, xscale_ptr, off_t, off_n, M, N, K,
                             k_tiles, STAGES, BLOCK_N, BLOCK_T, BLOCK_K, G2, SWAR, mma)
    elif FMT == _FMT_2L:
        acc = _mainloop_2l(x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, off_t, off_n, N, k_tiles,
                           STAGES, BLOCK_N, BLOCK_T, BLOCK_K, G2, SWAR, MMA_ASYNC, mma)
    else:
        xe_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_T, BLOCK_K], gl.int8)
        xe = gl.allocate_shared_memory(gl.int8, [BLOCK_T, BLOCK_K], xe_layout)
        acc = _mainloop_g(x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, xe, ready, xscale_ptr, off_t, off_n,
                          M, N, k_tiles, STAGES, BLOCK_N, BLOCK_T, BLOCK_K, G2, SWAR, mma)

    # ---- epilogue (registers; the tile is [BLOCK_N weight rows, BLOCK_T tokens]) ----
    offs_n = off_n + gl.arange(0, BLOCK_N, gl.SliceLayout(1, mma))
    offs_t = off_t + gl.arange(0, BLOCK_T, gl.SliceLayout(0, mma))
    n_ok = offs_n < N
    t_ok = offs_t < M
    if FMT == _FMT_2L:
        ts = gl.load(xscale_ptr + offs_t, mask=t_ok, other=0.0)
        ws = gl.load(wscale_ptr + offs_n, mask=n_ok, other=0.0)
        acc = acc * ws[:, None] * ts[None, :]
    if HAS_COL_SCALE:
        acc = acc * gl.load(col_scale_ptr + offs_n, mask=n_ok, other=0.0).to(gl.float32)[:, None]
    out = acc
    if HAS_LOWRANK:
        for r in range(R):
            up = gl.load(up_ptr + offs_n * stride_un + r, mask=n_ok, other=0.0).to(gl.float32)
            sv = gl.load(s_ptr + offs_t * stride_sm + r, mask=t_ok, other=0.0)
            sv = sv.to(up_ptr.dtype.element_ty).to(gl.float32)     # rounded like an unfused s @ B.T
            out = out + up[:, None] * sv[None, :]
    if HAS_BIAS:
        out = out + gl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(gl.float32)[:, None]
    mask = n_ok[:, None] & t_ok[None, :]
    gl.store(out_ptr + offs_t[None, :] * stride_om + offs_n[:, None], out.to(out_ptr.dtype.element_ty), mask=mask)


# =============================================================================================
# Host side
_BITS = {torch.bfloat16: 16, torch.float16: 16, torch.float32: 32}


def default_decode_config(M: int, group_size: int = 64, fmt: str = "int4_2l", f8: bool = False) -> KernelConfig:
    """Token tile = M rounded up to 16, 32 or 64 (a wgmma N; KernelConfig tiles are ≥ 16). Measured on the H200
    (probes/probe_decode_s3b, K=4096, N=28672, async wgmmas): M ≤ 16 best at 128 weight rows × 256 K × 4 stages
    (29.9 µs at M=1; 64×256×4 30.8, 128×512×2 35.5); M = 64 at 128×128×6 (47.1; 128×256×4 65.7: two CTAs
    of 133 KB no longer share an SM). The ring is then cut to what lets CTAS_PER_SM CTAs share an SM. ``f8``
    (int4_g64 on e4m3) starts from the same tiles (its ring holds 8-bit instead of packed tokens, and no
    expanded token tile)."""
    bt = 16 if M <= 16 else 32 if M <= 32 else 64
    bk, stages = (256, 4) if bt == 16 else (128, 6)
    # f8 keeps two fp32 partials beside acc (one in flight while the other is folded): at 128 × 64 that is 192
    # registers per thread and ptxas spills (sm_90 AOT: 255 regs, ~500 B); 64 weight rows do not (236)
    bn = 64 if (f8 and bt > 16) else 128
    base = KernelConfig(block_m=bt, block_n=bn, block_k=bk, block_r=16, group_m=1, num_warps=WARPS,
                        num_stages=stages, lowrank_stages=0, persistent=False)
    while stages > 2 and CTAS_PER_SM * decode_ledger(base.replace(num_stages=stages), group_size, fmt, f8).total() \
            > SM90_SMEM_PER_SM:
        stages -= 1
    return base.replace(num_stages=stages)


def decode_ledger(config: KernelConfig, group_size: int = 64, fmt: str = "int4_2l", f8: bool = False) -> SmemLedger:
    """Every byte ``w4a4_decode_kernel`` allocates (one CTA; several share an SM). ``f8`` (int4_g64): the ring
    holds e4m3 token tiles [BT, BK] (the wgmma B operand, by TMA) and there is no expanded token tile; the
    a/b rows come from global memory (L2) into registers, no SMEM."""
    bt, bn, bk, s = config.block_m, config.block_n, config.block_k, config.num_stages
    g = fmt != "int4_2l"
    f8 = bool(f8) and g
    row_bits = 16 if g else 8          # g: w_scale rows (16-bit); 2l: u rows (uint8)
    row = max(bn, U_ROW * 8 // row_bits)
    if f8:
        x_term = SmemTerm("ring.x_e4m3", tile_bytes(bt, bk, 8), s)
    else:
        x_term = SmemTerm("ring.x_packed" if g else "ring.x_int8", tile_bytes(bt, bk // 2 if g else bk, 8), s)
    terms = [x_term,
             SmemTerm("ring.w_packed", tile_bytes(bn, bk // 2, 8), s),
             SmemTerm("ring.w_scale_rows" if g else "ring.u_rows", tile_bytes(bk // group_size, row, row_bits), s)]
    if g and not f8:
        terms.append(SmemTerm("x_int8", tile_bytes(bt, bk, 8), 1))   # the step's expanded token tile
    terms.append(SmemTerm("barriers", barrier_bytes(s)))
    return SmemLedger(tuple(terms), consumers=1, label=f"w4a4 decode {fmt}{' f8' if f8 else ''} {bt}x{bn}x{bk}")


def check_decode_config(config: KernelConfig, M: int, N: int, K: int, group_size: int, fmt: str = "int4_2l",
                        f8: bool = False):
    """Raise ValueError / SmemError naming the violated constraint (expected vs got)."""
    bt, bn, bk = config.block_m, config.block_n, config.block_k
    if config.num_warps not in (4, 8) or bn < 16 * config.num_warps:
        raise ValueError(f"w4a4 decode: num_warps must be 4 or 8 (one or two warpgroups of 64 weight rows each; "
                         f"block_n ≥ 16·num_warps), got {config.num_warps} with block_n={bn}")
    if bt not in (16, 32, 64) or bn not in (64, 128):
        raise ValueError(f"w4a4 decode: block_m (tokens) ∈ {{16, 32, 64}}, block_n ∈ {{64, 128}}; got {bt}×{bn}")
    if bk % PACK or bk % group_size or bk > 512:
        raise ValueError(f"w4a4 decode: block_k must be a multiple of {PACK} and of the group size {group_size}, "
                         f"≤ 512; got {bk}")
    if config.num_stages < 2:
        raise ValueError(f"w4a4 decode: num_stages ≥ 2, got {config.num_stages}")
    if N % 16:
        raise ValueError(f"w4a4 decode: N must be a multiple of 16 (scale rows by TMA), got N={N}")
    if f8 and fmt != "int4_g64":
        raise ValueError(f"w4a4 decode: the e4m3 path (f8=True) is for int4_g64, got fmt={fmt!r}")
    decode_ledger(config, group_size, fmt, f8).check()


def plan_decode(M: int, config: KernelConfig | None = None, group_size: int = 64,
                fmt: str = "int4_2l", f8: bool = False) -> KernelConfig:
    return config or default_decode_config(M, group_size, fmt, f8)


def decode_enabled() -> bool:
    """``LOWRANK_GEMM_DECODE=0`` routes decode back to the v2/v1 kernels (instant fallback)."""
    return os.environ.get("LOWRANK_GEMM_DECODE", "1") != "0"


def decode_f8_default() -> bool:
    """Whether int4_g64 decode takes the e4m3 path when ``f8=None``: ``LOWRANK_GEMM_DECODE_F8`` = 0/1, else the
    module-level :data:`F8_DEFAULT`."""
    env = os.environ.get("LOWRANK_GEMM_DECODE_F8", "")
    return env == "1" if env in ("0", "1") else bool(F8_DEFAULT)


def _args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt, group_size, config,
          col_scale=None, swar=True, mma_async=True, f8=None):
    from ..w4a4_gemm import FORMATS, check_gemm_args
    if fmt not in FORMATS:
        raise ValueError(f"w4a4 decode: fmt must be one of {FORMATS}, got {fmt!r}")
    g = fmt != "int4_2l"
    M, N, K, r = check_gemm_args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, group_size, fmt)
    dev = x_q.device
    if not (out.dtype in _BITS and tuple(out.shape) == (M, N) and out.is_contiguous() and out.device == dev):
        raise ValueError(f"w4a4 decode: out must be contiguous bf16/fp16/fp32 [M, N] = {[M, N]} on {dev}, got "
                         f"{out.dtype} {list(out.shape)} on {out.device}")
    if col_scale is not None and (tuple(col_scale.shape) != (N, ) or col_scale.device != dev):
        raise ValueError(f"w4a4 decode: col_scale must be [N={N}] on {dev}, got {list(col_scale.shape)}")
    rows = w_scale if g else w_mul       # the [K/G, N] table that rides in the ring
    if g and (x_scale.dtype != w_scale.dtype):
        raise ValueError(f"w4a4 decode: x_scale and w_scale must share a dtype, got {x_scale.dtype}, {w_scale.dtype}")
    for name, t in (("x_q", x_q), ("w_q", w_q), ("w_mul" if not g else "w_scale", rows)):
        if t.data_ptr() % 16:
            raise ValueError(f"w4a4 decode: {name} must be 16-byte aligned for TMA, got address {t.data_ptr():#x}")
    f8 = (g and decode_f8_default()) if f8 is None else bool(f8)   # f8 with int4_2l: check_decode_config raises
    config = plan_decode(M, config, group_size, fmt, f8)
    check_decode_config(config, M, N, K, group_size, fmt, f8)
    bt, bn, bk = config.block_m, config.block_n, config.block_k
    x_q, x_scale = _f8_operands(x_q, x_scale, group_size, f8, "w4a4 decode")
    x_desc = desc(x_q, (bt, bk // 2) if (g and not f8) else (bt, bk))
    w_desc = desc(w_q, (bn, bk // 2))
    bits = rows.element_size() * 8
    u_desc = desc(rows.reshape(-1), (bn, ), gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=1))
    f32 = dummy(dev, torch.float32, (1, ))
    grid = (cdiv(N, bn), cdiv(M, bt))
    args = (x_desc, w_desc, u_desc, out, out.stride(0), x_scale, w_scale,
            col_scale if col_scale is not None else f32, bias if bias is not None else f32,
            lowrank_act if r else f32, lowrank_act.stride(0) if r else 0,
            lora_up if r else dummy(dev, torch.bfloat16, (1, )), lora_up.stride(0) if r else 0, M, N, K, r)
    cx = dict(G2=group_size, BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk, STAGES=config.num_stages,
              HAS_LOWRANK=r > 0, HAS_COL_SCALE=col_scale is not None, HAS_BIAS=bias is not None, SWAR=swar,
              MMA_ASYNC=mma_async, FMT=FMT_INT4_G if g else FMT_INT4_2L, F8=f8)
    return grid, args, cx, config


def launch_w4a4_decode(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt: str,
                       group_size: int, config: KernelConfig | None = None, *, col_scale=None, swar: bool = True,
                       mma_async: bool = True, f8: bool | None = None):
    """out [M, N] ← the W4A4 layer's GEMM + epilogue (launcher contract of kernels/w4a4_gemm.py, both formats).
    ``mma_async=False`` (int4_2l): each wgmma waits for itself — the first H200 version, kept for A/B.
    ``f8`` (int4_g64; None = :func:`decode_f8_default`): e4m3 wgmmas on offset-encoded weights, the tokens
    pre-expanded by ``w4_expand.expand_act_f8`` (one extra launch); False = the int8 path."""
    grid, args, cx, cfg = _args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt, group_size,
                                config, col_scale, swar, mma_async, f8)
    w4a4_decode_kernel[grid](*args, **cx, num_warps=cfg.num_warps)
    return out


def aot_signature_decode(config: KernelConfig | None = None, *, M=5, N=160, K=512, rank=16, group_size=64,
                         bias=True, col_scale=True, swar=True, mma_async=True, fmt="int4_2l", f8=None):
    """(signature, constexprs, config) for ``kernels.aot.compile_sm90`` of :func:`w4a4_decode_kernel`."""
    import inspect
    from triton.runtime.jit import mangle_type
    from .w4a4_ws import make_operands_v2
    ops = make_operands_v2(fmt, M, N, K, rank, group_size, device="cpu", bias=bias, col_scale=col_scale)
    _, args, cx, cfg = _args(**ops, config=config, swar=swar, mma_async=mma_async, f8=f8)
    names = [n for n in inspect.signature(w4a4_decode_kernel.fn).parameters if n not in cx]
    sig = {n: (mangle_type(a) if not isinstance(a, int) else "i32") for n, a in zip(names, args)}
    return sig, cx, cfg
