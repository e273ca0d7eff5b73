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
- epilogue in registers: (2l: × t[m] × s[n]) × col_scale[n], + lora_up·Sᵀ as one register-A 16-bit wgmma on the
  accumulator (S rounded to lora_up's dtype like the unfused reference; session 32 — until then a loop over the
  rank, kept for ranks > 128 and f8 on 32/64-token tiles), + bias[n], then a masked store of the transposed tile
  (M ≤ 64 rows: the output is < 4 MB);
- f8 option ``xab_smem`` (off until measured): the a/b rows of every group copied into shared memory once per
  program instead of loaded from L2 in the K loop.
Deterministic: one program per output tile, fixed K order, no atomics.

Options (off by default until measured on the H200; ``scripts/probe_decode_split.py`` A/Bs them in one process):
- split-K / stream-K (``config.split_k`` > 1 / ``config.persistent``, or env ``LOWRANK_GEMM_DECODE_SPLIT`` for
  the default config): the grid's 224 tiles (N = 28672) on 132 SMs × 2 CTAs leave 92 SMs with two tiles and 40
  with one, every tile a 16-step K loop. Here program p owns the contiguous iterations [p·T // P, (p + 1)·T // P)
  of the T = tiles · k_tiles (tile, K step) space (:class:`DecodeWork`): split-K is P = tiles · split, stream-K
  P = #SMs × CTAs per SM (equal work per SM; a program may span two tiles, and its ring prefetches across the
  boundary). A tile shared by several programs is finished in ONE launch by the last to arrive (the protocol of
  kernels/splitk.py, whose helpers the kernel calls: partials in a workspace from the caching allocator, int32
  for 2l, fp32 for g; summed from zero in contributor order, so the bits never depend on the arrival order; one
  int32 ticket per tile, left at zero for the next launch and every CUDA-graph replay);
- PDL (``pdl``; None = ``kernels.pdl.pdl_enabled``): the weight and row-table copies of the first STAGES steps
  are issued before ``griddepcontrol.wait`` (their mbarrier expects the whole step, the token tile follows after
  the wait); nothing the previous kernel writes is read, and nothing global written, before it;
- ``nonempty_k`` (int4_2l): a K loop whose trip count is provably ≥ 1 — without it ptxas serializes every wgmma
  of the 2l kernel at M > 16 (C7515, ``_mainloop_one_acc``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from ...plan.config import KernelConfig
from ...plan.smem import SmemLedger, SmemTerm, barrier_bytes, tile_bytes
from ..env import env_switch, getenv
from ..epilogue import rank_block
from ..launch import launch
from ..pdl import gl_gdc_launch_dependents, gl_gdc_wait, pdl_enabled
from ..schedule import cdiv, next_pow2, num_sms
from ..splitk import splitk_arrive, splitk_reset, splitk_store, splitk_sum
from .host import desc, dummy, flat_layout
from .skeleton import alloc_barriers, reads_done_before_refill
from .w4a4_ws import _f8_operands, _nibbles, _offset_nibbles_f8

__all__ = ["decode_ledger", "plan_decode", "DecodeWork", "plan_decode_work", "simulate_decode_work",
           "decode_ctas_per_sm", "default_decode_config", "launch_w4a4_decode", "w4a4_decode_kernel",
           "decode_enabled", "aot_signature_decode", "decode_epi_mma_default", "EPI_MMA_DEFAULT",
           "EPI_MMA_MAX_RANK", "decode_xab_smem_default", "XAB_SMEM_DEFAULT", "xab_table_rows",
           "check_decode_config", "decode_f8_default", "F8_DEFAULT",
           "decode_nonempty_k_default", "NONEMPTY_K_DEFAULT", "decode_row_box_default", "ROW_BOX_DEFAULT",
           "SPLIT_ENV", "decode_f16_default", "F16_DEFAULT", "F16_MIN_M", "F16_MAX_M"]

PACK = 64                 # formats.int4.PACK_BLOCK
WARPS = 4                 # one warpgroup
CTAS_PER_SM = 2           # the default ring depth leaves room for this many CTAs per SM
SM90_SMEM_PER_SM = 228 * 1024
SM90_SMS = 132            # H100 SXM / H200 (AOT signatures and CPU planning; a GPU launch asks the device)
SM90_REGS_PER_SM = 65536
REGS_2L_16 = 168          # the most registers per thread the 2l kernel takes with 16-token tiles (sm_90 AOT: 106–134,
                          # checked in tests): three CTAs of 128 threads fit an SM's register file
_PACK = gl.constexpr(PACK)
FMT_INT4_G = 0            # w4a4_ws's format ids
FMT_INT4_2L = 1
_FMT_G = gl.constexpr(FMT_INT4_G)
_FMT_2L = gl.constexpr(FMT_INT4_2L)
TICKET_SCRATCH_ALIGN = 128  # the compiler puts the ticket's scalar-atomic scratch word this aligned after the buffers
U_ROW = 128               # bytes per SMEM row of u (≥ block_n; TMA destinations are 128-byte aligned)
_U_ROW = gl.constexpr(U_ROW)
NONEMPTY_K_DEFAULT = True    # int4_2l K loop with a provable trip count ≥ 1 (_mainloop_one_acc: no C7515 wgmma
                             # serialization at M > 16); env LOWRANK_GEMM_DECODE_NONEMPTY_K=0/1 overrides. H200
                             # (probe_decode_split, session 5): GEMM 47.0 → 45.2 µs at M=64, neutral at M ≤ 16
ROW_BOX_DEFAULT = True       # the row table (u / w_scale) as one 2-D TMA box per step instead of BK/G 1-D copies
                             # (_issue_step); env LOWRANK_GEMM_DECODE_ROW_BOX=0/1 overrides. H200, session 34
                             # (probe_decode_epi, bit-identical): GEMM 14.1 → 13.1 µs (2l, 4096², M=16),
                             # 40.2 → 35.9 (2l, K=14336), 13.8 → 12.4 (g64, 4096²), ≤ 1 % at N=28672;
                             # 49.2 → 50.1 (g64, K=14336)
EPI_MMA_DEFAULT = True    # the low-rank term as one register-A wgmma in the epilogue (_epilogue); env
                          # LOWRANK_GEMM_DECODE_EPI_MMA=0/1 overrides. Session 32: the per-rank loop it replaces held
                          # 21 % of the warps' stall samples at M = 16, K = 4096, N = 28672 (ncu)
XAB_SMEM_DEFAULT = True   # f8 with one token tile: the a/b rows of every group in shared memory (_fill_xab) rather
                          # than loaded from L2 in the K loop; env LOWRANK_GEMM_DECODE_XAB_SMEM=0/1 overrides; only
                          # where CTAS_PER_SM CTAs still share an SM (xab_table_rows). H200, session 34
                          # (probe_decode_epi, bit-identical): GEMM 24.7 → 21.2 µs (M=16, N=28672), 23.9 → 20.4
                          # (M=4), 17.1 → 13.8 (4096², M=16), equal at K=14336
SPLIT_ENV = "LOWRANK_GEMM_DECODE_SPLIT"   # default configs only: "2".."8" split-K, "stream[:stages]" stream-K
F16_DEFAULT = True        # int4_g64 takes the fp16 path (no per-group rescale, _mainloop_one_acc) when f16=None at
                          # F16_MIN_M ≤ M ≤ F16_MAX_M; env LOWRANK_GEMM_DECODE_F16=1 at every M ≤ F16_MAX_M, =0 never.
                          # H200 (session 38, probes/s38 + s38b, N = 28672, K = 4096), layer graph µs against the v2
                          # route: M = 48 56.1 → 50.8, M = 64 55.7 → 50.2 / 55.8 → 49.5. With act_quant writing the
                          # token operand (session 39, H100, probes/s39b): layer 54.0 → 38.1 (M = 32), 51.9 → 44.2
                          # (48), 50.7 → 46.8 (64); at M = 16 the e4m3 path stays ahead (31.4 vs 34.7: its expansion
                          # is one LOP3 per four bytes)
F16_MIN_M = 17            # above the e4m3 path's 16-token tiles
F16_MAX_M = 64            # the fp16 path's largest token tile
F8_DEFAULT = True         # int4_g64 takes the e4m3 path when f8=None: H200, same process, GEMM 43.7 → 33.7 µs
                          # (M=1), 44.9 → 35.2 (M=16), outputs equal to the int8 path's in fp32 (probe_decode
                          # session 4); env LOWRANK_GEMM_DECODE_F8=0/1 overrides


# _issue_step's PART: the whole step (expect + every copy), or, with PDL, the part that does not depend on the
# previous kernel (expect of the whole step's bytes + weights + row table) and, after griddepcontrol.wait, the
# token tile (its bytes were already expected, so the slot's phase cannot complete without it)
_PART_ALL = gl.constexpr(0)
_PART_WEIGHTS = gl.constexpr(1)
_PART_TOKENS = gl.constexpr(2)


@gluon.jit
def _issue_step(slot_step, step, x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, off_t, off_n, N, k_tiles,
                STAGES: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, G2: gl.constexpr, pred,
                FMT: gl.constexpr, F8: gl.constexpr = False, PART: gl.constexpr = _PART_ALL):
    """TMA copies of K step ``step`` of tile (off_n, off_t) into ring slot slot_step % STAGES (predicated off past
    the last step). One tile per program: slot_step = step; split-K / stream-K: slot_step counts the program's
    steps over all its tiles. The row tables (2l: u [K/G, N] uint8; g: w_scale [K/G, N] 16-bit) come either
    through a 1-D view (box starts row·N + off_n: 16-byte aligned as N % 16 == 0), each into its own
    128-byte-aligned SMEM row (TMA destinations must be; a 64-byte pitch faulted on the H200), or — ROW_BOX, a
    2-D descriptor over [K/G, N] — as ONE [BK/G, BN] box per step into the slot's rows (:func:`_row_slot_rows`):
    fewer copies, and Triton's barrier pass puts a bar.sync before each one."""
    UR: gl.constexpr = BLOCK_K // G2
    ROW_BOX: gl.constexpr = _is_row_box(u_desc.block_type.shape)
    ROW_COPIES: gl.constexpr = 1 if ROW_BOX else UR
    slot = slot_step % STAGES
    ok = (step < k_tiles) & pred
    bar = ready.index(slot)
    if PART != _PART_TOKENS:
        mbarrier.expect(bar, x_desc.block_type.nbytes + w_desc.block_type.nbytes
                        + ROW_COPIES * u_desc.block_type.nbytes, pred=ok)
    if PART != _PART_WEIGHTS:
        if FMT == _FMT_2L or F8:     # 8-bit tokens [BT, BK] (2l int8, F8 e4m3)
            tma.async_copy_global_to_shared(x_desc, [off_t, step * BLOCK_K], bar, x_bufs.index(slot), pred=ok)
        else:
            tma.async_copy_global_to_shared(x_desc, [off_t, step * (BLOCK_K // 2)], bar, x_bufs.index(slot),
                                            pred=ok)
    if PART != _PART_TOKENS:
        tma.async_copy_global_to_shared(w_desc, [off_n, step * (BLOCK_K // 2)], bar, w_bufs.index(slot), pred=ok)
        if ROW_BOX:   # the same bytes seen as [STAGES, slot rows, BN] in the box's (unswizzled) layout
            SR: gl.constexpr = u_bufs.shape[0] // STAGES
            boxes = u_bufs._reinterpret(u_desc.dtype, [STAGES, SR, BLOCK_N], u_desc.layout)
            tma.async_copy_global_to_shared(u_desc, [(step * BLOCK_K) // G2, off_n], bar,
                                            boxes.index(slot).slice(0, UR, dim=0), pred=ok)
        else:
            for j in gl.static_range(UR):
                dst = u_bufs.index(slot * UR + j).slice(0, BLOCK_N)
                tma.async_copy_global_to_shared(u_desc, [((step * BLOCK_K) // G2 + j) * N + off_n], bar, dst, pred=ok)


@gluon.constexpr_function
def _is_row_box(box_shape):
    """The row-table descriptor is 2-D ([K/G, N], one box per step) rather than the 1-D view of one row."""
    return len(box_shape) == 2


@gluon.jit
def _row(u_bufs, slot, j, STAGES: gl.constexpr, BLOCK_N: gl.constexpr):
    """Row ``j`` (the step's j-th group) of ring slot ``slot`` of the row table u_bufs [STAGES · slot rows, ROW]
    (1-D layout; ROW_BOX: rows of BN elements, slots padded, :func:`_row_slot_rows`), as a [BLOCK_N] view."""
    return u_bufs.index(slot * (u_bufs.shape[0] // STAGES) + j).slice(0, BLOCK_N)


@gluon.constexpr_function
def _row_slot_rows(rows_per_step, row_bytes, row_box):
    """SMEM rows one ring slot of the row table takes: 1-D copies land one per row (rows ≥ 128 B, :data:`U_ROW`);
    a 2-D box lands densely, so the slot is padded to whole 128-byte units (every TMA destination starts
    128-byte aligned: a 64-byte row, BN = 64 u bytes, with an odd row count per step would break it)."""
    if not row_box:
        return rows_per_step
    unit = max(1, 128 // row_bytes)        # U_ROW (a literal: the dependency check rejects module globals here)
    return -(-rows_per_step // unit) * unit


@gluon.jit
def _refill(c, k, pred, n_local, tiles_t, off_t, off_n, x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, N,
            k_tiles, STAGES: gl.constexpr, BLOCK_T: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
            G2: gl.constexpr, FMT: gl.constexpr, F8: gl.constexpr, STREAM: gl.constexpr,
            PART: gl.constexpr = _PART_ALL):
    """Issue the program's ring step ``c``: K step ``k`` counted from the start of tile (off_n, off_t). One tile
    per program: k = c. STREAM: the program owns n_local consecutive iterations of the tile-major (tile = pid_n ·
    tiles_t + pid_t, K step fastest) iteration space, so k ≥ k_tiles means a following tile — the ring prefetches
    across tile boundaries (host mirror: DecodeWork). Only then are there divisions (a branch, taken by the last
    STAGES refills before each boundary), not in every step."""
    if STREAM:
        pid_n = off_n // BLOCK_N
        pid_t = off_t // BLOCK_T
        if k >= k_tiles:
            tile = pid_n * tiles_t + pid_t + k // k_tiles
            k = k % k_tiles
            pid_n = tile // tiles_t
            pid_t = tile - pid_n * tiles_t
        _issue_step(c, k, x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, pid_t * BLOCK_T, pid_n * BLOCK_N, N,
                    k_tiles, STAGES, BLOCK_N, BLOCK_K, G2, pred & (c < n_local), FMT, F8, PART)
    else:
        _issue_step(c, c, x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, off_t, off_n, N, k_tiles,
                    STAGES, BLOCK_N, BLOCK_K, G2, pred, FMT, F8, PART)


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


# Every main loop consumes the program's ring steps c0 .. c0 + n_steps − 1, which are K steps k0 .. of the tile
# (off_n, off_t), and refills each slot it frees through _refill with the step STAGES ahead (n_local, tiles_t: the
# STREAM mapping). One tile per program: c0 = k0 = 0, n_steps = k_tiles (constants: the loops are the ones before
# split-K existed).

@gluon.jit
def _mainloop_one_acc(x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, off_t, off_n, N, k_tiles, c0, n_steps,
                      k0, n_local, tiles_t, STAGES: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_T: gl.constexpr,
                      BLOCK_K: gl.constexpr, G2: gl.constexpr, SWAR: gl.constexpr, MMA_ASYNC: gl.constexpr,
                      mma: gl.constexpr, STREAM: gl.constexpr, NONEMPTY_K: gl.constexpr, F16: gl.constexpr = False):
    """One accumulator straight through K, the scales applied once in the epilogue. int4_2l: int32 accumulation of
    (q⊙u)·xᵀ (t ⊗ s to come; split-K partials stay exact integers). F16 (int4_g64 on exact fp16 operands,
    w4_expand's F16 section): fp32 accumulation of (q·w16)·x16ᵀ — the packed weights loaded in the 8-bit register
    layout, expanded to fp16 in registers (:func:`_f16_planes`) and relabelled as 16-bit A fragments
    (:func:`_as_k16_fragment`), two register-A wgmmas (m64nBTk16 ×2) per plane against the ring's x16 tile (t ⊗ c
    to come); always async. Returns the tile in ``mma``'s layout.
    NONEMPTY_K: the trip count is max(n_steps, 1), which the caller guarantees anyway — so LLVM emits no zero-trip
    path. That path's zero-fill of the accumulator is laid out
    between the loop's in-flight wgmmas and their final wait, and ptxas then serializes EVERY wgmma (C7515,
    "non wgmma instructions defining accumulator registers"): today's one-tile-per-program kernel at
    BLOCK_T ≥ 32 (M > 16) and at BLOCK_K = 512 (sm_90 AOT; 16-token tiles with BLOCK_K ≤ 256 escape it)."""
    NB: gl.constexpr = BLOCK_K // _PACK
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    nw: gl.constexpr = gl.num_warps()
    mma16: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[nw, 1],
                                                    instr_shape=[16, BLOCK_T, 16])
    a16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma16, k_width=2)
    RFMT: gl.constexpr = _FMT_G if F16 else _FMT_2L       # the ring's token tiles: x16 [BT, BK] / int8 [BT, BK]
    if F16:
        acc = gl.zeros([BLOCK_N, BLOCK_T], gl.float32, mma16)
    else:
        acc = gl.zeros([BLOCK_N, BLOCK_T], gl.int32, mma)
    if NONEMPTY_K:
        n_steps = gl.maximum(n_steps, 1)
    for kk in range(c0, c0 + n_steps):
        slot = kk % STAGES
        mbarrier.wait(ready.index(slot), (kk // STAGES) & 1)
        wp = w_bufs.index(slot)
        xb = x_bufs.index(slot)
        for b in gl.static_range(NB):
            packed = wp.slice(b * (_PACK // 2), _PACK // 2, dim=1).load(a_layout).to(gl.int8, bitcast=True)
            u = _row(u_bufs, slot, (b * _PACK) // G2, STAGES, BLOCK_N).load(gl.SliceLayout(1, a_layout))
            if F16:     # u: the fp16 scale row w16
                lo_h, hi_h = _f16_planes(packed, u, SWAR)
                lo_b = _as_k16_fragment(lo_h, a16)
                hi_b = _as_k16_fragment(hi_h, a16)
            else:
                lo_b, hi_b = _nibbles(packed, u.to(gl.int8), True, SWAR)   # q·u: one IMUL per four bytes
            xl = xb.slice(b * _PACK, _PACK // 2, dim=1).permute((1, 0))
            xh = xb.slice(b * _PACK + _PACK // 2, _PACK // 2, dim=1).permute((1, 0))
            if MMA_ASYNC or F16:
                # ptxas keeps the register operands of an in-flight wgmma intact (PTX registers are virtual;
                # it serializes only if it runs out), so the next block's expansion overlaps these MMAs
                acc = warpgroup_mma(lo_b, xl, acc, is_async=True)
                acc = warpgroup_mma(hi_b, xh, acc, is_async=True)
            else:
                acc = warpgroup_mma(lo_b, xl, acc)
                acc = warpgroup_mma(hi_b, xh, acc)
        if MMA_ASYNC or F16:
            # step kk-1's wgmmas have retired (this step's 2·NB groups may still run): refill its slot
            acc = warpgroup_mma_wait(2 * NB, deps=(acc, ))
            reads_done_before_refill()   # every warp is past step kk-1's SMEM reads too
            _refill(kk - 1 + STAGES, k0 + (kk - 1 - c0) + STAGES, kk > c0, n_local, tiles_t, off_t, off_n, x_desc,
                    w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, N, k_tiles, STAGES, BLOCK_T, BLOCK_N, BLOCK_K, G2,
                    RFMT, F16, STREAM)
        else:
            # this step's wgmmas retired and every warp is past its SMEM reads: refill the slot with step
            # kk + STAGES (the other STAGES - 1 slots are in flight meanwhile)
            reads_done_before_refill()
            _refill(kk + STAGES, k0 + (kk - c0) + STAGES, True, n_local, tiles_t, off_t, off_n, x_desc, w_desc,
                    u_desc, x_bufs, w_bufs, u_bufs, ready, N, k_tiles, STAGES, BLOCK_T, BLOCK_N, BLOCK_K, G2, _FMT_2L,
                    False, STREAM)
    if MMA_ASYNC or F16:
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        if STREAM:   # the last step's slot now, not in the next tile's first step (the finish runs between)
            reads_done_before_refill()
            _refill(c0 + n_steps - 1 + STAGES, k0 + n_steps - 1 + STAGES, n_steps > 0, n_local, tiles_t, off_t, off_n,
                    x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, N, k_tiles, STAGES, BLOCK_T, BLOCK_N,
                    BLOCK_K, G2, RFMT, F16, STREAM)
    if F16:
        acc = gl.convert_layout(acc, mma, assert_trivial=True)
    return acc


@gluon.jit
def _mainloop_g(x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, xe, ready, xscale_ptr, off_t, off_n, M, N,
                k_tiles, c0, n_steps, k0, n_local, tiles_t, STAGES: gl.constexpr, BLOCK_N: gl.constexpr,
                BLOCK_T: gl.constexpr, BLOCK_K: gl.constexpr, G2: gl.constexpr, SWAR: gl.constexpr, mma: gl.constexpr,
                STREAM: gl.constexpr):
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
    xs_next = _token_scales(xscale_ptr, k0, k_tiles, off_t, M, BLOCK_T, BLOCK_K, G2, mma)
    for kk in range(c0, c0 + n_steps):
        xs_step = xs_next
        xs_next = _token_scales(xscale_ptr, k0 + (kk - c0) + 1, k_tiles, off_t, M, BLOCK_T, BLOCK_K, G2,
                                mma)   # prefetch
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
            lo_b, hi_b = _nibbles(packed, packed, False, SWAR)
            part = warpgroup_mma(lo_b, xe.slice(b * _PACK, _PACK // 2, dim=1).permute((1, 0)), zero,
                                 use_acc=False, is_async=True)
            part = warpgroup_mma(hi_b, xe.slice(b * _PACK + _PACK // 2, _PACK // 2, dim=1).permute((1, 0)), part,
                                 is_async=True)
            ws = _row(u_bufs, slot, (b * _PACK) // G2, STAGES, BLOCK_N).load(gl.SliceLayout(1, mma))
            xs = gl.sum(gl.where((rows == (b * _PACK) // G2)[:, None], xs_step, 0.0), axis=0)
            part = warpgroup_mma_wait(0, deps=(part, ))
            acc = acc + part.to(gl.float32) * ws.to(gl.float32)[:, None] * xs[None, :]
        # every wgmma of this step retired (waited above); all warps past their SMEM reads → refill
        reads_done_before_refill()
        _refill(kk + STAGES, k0 + (kk - c0) + STAGES, True, n_local, tiles_t, off_t, off_n, x_desc, w_desc, u_desc,
                x_bufs, w_bufs, u_bufs, ready, N, k_tiles, STAGES, BLOCK_T, BLOCK_N, BLOCK_K, G2, _FMT_G, False, STREAM)
    return acc


@gluon.jit
def _mainloop_g_f8(x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, xab_ptr, off_t, off_n, M, N, K,
                   k_tiles, c0, n_steps, k0, n_local, tiles_t, STAGES: gl.constexpr, BLOCK_N: gl.constexpr,
                   BLOCK_T: gl.constexpr, BLOCK_K: gl.constexpr, G2: gl.constexpr, SWAR: gl.constexpr,
                   mma: gl.constexpr, STREAM: gl.constexpr, xab_s, XAB_ROWS: gl.constexpr = 0):
    """int4_g64 on e4m3 wgmmas (module doc). Per group j of a step: 2·G/64 register-A wgmmas (m64nBTk32,
    .e4m3.e4m3) chain into a fresh fp32 partial; then group j−1's partial is waited for (everything but group
    j's wgmmas retires) and folded in: acc = fma(fma(P', a, b), ws, acc) — so the tensor cores run under the
    next group's ldmatrix + LOP3s. The step's last group is waited for in full before the step ends: an
    in-flight partial carried over the loop's back edge makes ptxas serialize EVERY wgmma (C7514 "non wgmma
    instructions reading accumulator registers"; seen with the carried variant). Then the slot is refilled.
    The rows a, b: two [BT] loads per group straight into the accumulator's column layout, two groups ahead
    (an L2 hit hides behind two groups' work); rows of groups past K/G and tokens ≥ M load as 0, so their
    partials (0 by TMA's zero fill) add exactly 0. (One [16, BT] tile per step with rows picked by a masked sum
    cost ~250 more SASS instructions per loop at BT = 16: 969 vs 826.)
    XAB_ROWS > 0: the rows come from ``xab_s``, the token tile's whole table copied into shared memory once per
    program (:func:`_fill_xab`), one ld.shared each — no 64-bit address arithmetic, masks or L2 round trips in
    the loop (those were ~130 of its 615 SASS instructions per step at M = 16, ncu, session 32)."""
    UR: gl.constexpr = BLOCK_K // G2
    BPG: gl.constexpr = G2 // _PACK       # 64-wide blocks per group
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    NG = K // G2
    g0 = k0 * UR                          # the tile's first group of this main loop
    acc = gl.zeros([BLOCK_N, BLOCK_T], gl.float32, mma)
    zero = gl.zeros([BLOCK_N, BLOCK_T], gl.float32, mma)
    offs_t = off_t + gl.arange(0, BLOCK_T, gl.SliceLayout(0, mma))
    t_ok = offs_t < M
    row_l: gl.constexpr = gl.SliceLayout(0, mma)
    if XAB_ROWS > 0:
        a1 = gl.zeros([BLOCK_T], gl.float32, row_l)   # (unused: the rows are read from xab_s in the loop)
        b1 = a1
        a2 = a1
        b2 = a1
    else:
        a1 = gl.load(xab_ptr + (2 * g0) * M + offs_t, mask=t_ok & (NG > g0), other=0.0)              # group g0
        b1 = gl.load(xab_ptr + (2 * g0 + 1) * M + offs_t, mask=t_ok & (NG > g0), other=0.0)
        a2 = gl.load(xab_ptr + (2 * g0 + 2) * M + offs_t, mask=t_ok & (NG > g0 + 1), other=0.0)      # group g0 + 1
        b2 = gl.load(xab_ptr + (2 * g0 + 3) * M + offs_t, mask=t_ok & (NG > g0 + 1), other=0.0)
    for kk in range(c0, c0 + n_steps):
        slot = kk % STAGES
        mbarrier.wait(ready.index(slot), (kk // STAGES) & 1)
        wp = w_bufs.index(slot)
        xb = x_bufs.index(slot)
        for j in gl.static_range(UR):
            part = zero
            for b in gl.static_range(j * BPG, (j + 1) * BPG):    # the group's 64-wide blocks
                packed = wp.slice(b * (_PACK // 2), _PACK // 2, dim=1).load(a_layout).to(gl.int8, bitcast=True)
                lo_b, hi_b = _offset_nibbles_f8(packed, SWAR)
                part = warpgroup_mma(lo_b, xb.slice(b * _PACK, _PACK // 2, dim=1).permute((1, 0)), part,
                                     use_acc=b > j * BPG, is_async=True)
                part = warpgroup_mma(hi_b, xb.slice(b * _PACK + _PACK // 2, _PACK // 2, dim=1).permute((1, 0)),
                                     part, is_async=True)
            ws = _row(u_bufs, slot, j, STAGES, BLOCK_N).load(gl.SliceLayout(1, mma)).to(gl.float32)
            if XAB_ROWS > 0:
                g = (k0 + (kk - c0)) * UR + j    # this group's rows 2g, 2g + 1 of the table
                a = xab_s.index(2 * g).load(row_l)
                bv = xab_s.index(2 * g + 1).load(row_l)
            else:
                a = a1
                bv = b1
                a1 = a2
                b1 = b2
                g2 = (k0 + (kk - c0)) * UR + j + 2   # two groups ahead (the flat rows of xab [K/G, 2, M]: 2g, 2g + 1)
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
        reads_done_before_refill()
        _refill(kk + STAGES, k0 + (kk - c0) + STAGES, True, n_local, tiles_t, off_t, off_n, x_desc, w_desc, u_desc,
                x_bufs, w_bufs, u_bufs, ready, N, k_tiles, STAGES, BLOCK_T, BLOCK_N, BLOCK_K, G2, _FMT_G, True, STREAM)
    return acc


# Packed bytes b0..b3 of one weight row (K positions p..p+3 of a 64-block's low / high nibble plane) × their fp16
# scales → the fp16 values q·s of the four low nibbles ($0, $1) and the four high ones ($2, $3). Each nibble goes
# into the mantissa of 1024 with its sign bit flipped (lop3 (n & 0xF) ^ 0x6408 = fp16 1024 + (q + 8)), the
# subtraction of 1032 leaves q exactly, and q·s is exact in fp16 (w4_expand.f16_weight_operands).
F16_ASM = gl.constexpr("""{
.reg .b32 u, v, c, z;
mov.b32 z, 0;
mov.b32 c, 0x64086408;
prmt.b32 u, $4, z, 0x4140;
prmt.b32 v, $4, z, 0x4342;
lop3.b32 $0, u, 0x000F000F, 0x64086408, 0x6a;
lop3.b32 $1, v, 0x000F000F, 0x64086408, 0x6a;
shr.u32 u, u, 4;
shr.u32 v, v, 4;
lop3.b32 $2, u, 0x000F000F, 0x64086408, 0x6a;
lop3.b32 $3, v, 0x000F000F, 0x64086408, 0x6a;
sub.f16x2 $0, $0, c;
sub.f16x2 $1, $1, c;
sub.f16x2 $2, $2, c;
sub.f16x2 $3, $3, c;
mul.f16x2 $0, $0, $5;
mul.f16x2 $1, $1, $6;
mul.f16x2 $2, $2, $5;
mul.f16x2 $3, $3, $6;
}""")


@gluon.jit
def _f16_planes(packed, scale, SWAR: gl.constexpr):
    """(low, high) nibble planes of ``packed`` int8 [R, C] as fp16 q·scale[R], exact (F16_ASM, four bytes per
    instance; the plain element-wise path otherwise)."""
    sb = scale[:, None]
    if SWAR:
        lo, hi = gl.inline_asm_elementwise(F16_ASM, "=r,=r,=r,=r,r,r,r", [packed, sb],
                                           dtype=(gl.float16, gl.float16), is_pure=True, pack=4)
    else:
        lo = ((packed << 4) >> 4).to(gl.float16) * sb
        hi = (packed >> 4).to(gl.float16) * sb
    return lo, hi


@gluon.jit
def _as_k16_fragment(v, layout: gl.constexpr):
    """[R, 32] values in the 8-bit A-fragment layout (thread q of a quad holds K 4q..4q+3 and 16 + 4q..) → the same
    registers as a [R, 32] tensor in the 16-bit A-fragment ``layout`` (thread q: K 2q, 2q+1, 8 + 2q, 9 + 2q, …), K
    relabelled ℓ = 8j + 2q + i for p = 4q + 2j + i inside each 16 (w4_expand.F16_K_PERM, the order the token
    operand is stored in). A reshape and a permute: no value moves between threads."""
    R: gl.constexpr = v.shape[0]
    v = v.reshape([R, 2, 4, 2, 2])          # p = 16h + 4q + 2j + i
    v = v.permute((0, 1, 3, 2, 4))          # ℓ = 16h + 8j + 2q + i
    return gl.convert_layout(v.reshape([R, 32]), layout)


@gluon.jit
def _mainloop(x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, xe, ready, xscale_ptr, off_t, off_n, M, N, K,
              k_tiles, c0, n_steps, k0, n_local, tiles_t, STAGES: gl.constexpr, BLOCK_N: gl.constexpr,
              BLOCK_T: gl.constexpr, BLOCK_K: gl.constexpr, G2: gl.constexpr, SWAR: gl.constexpr,
              MMA_ASYNC: gl.constexpr, FMT: gl.constexpr, F8: gl.constexpr, mma: gl.constexpr,
              STREAM: gl.constexpr, NONEMPTY_K: gl.constexpr, xab_s=None, XAB_ROWS: gl.constexpr = 0,
              F16: gl.constexpr = False):
    """The format's main loop over ring steps c0 .. c0 + n_steps − 1 (K steps k0 .. of the tile): the [BN, BT]
    accumulator, int32 for 2l (t ⊗ s come in the epilogue), fp32 for g (already rescaled; F16: t ⊗ c to come)."""
    if F8:   # xscale_ptr = xab [K/G, 2, M] fp32
        acc = _mainloop_g_f8(x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, xscale_ptr, off_t, off_n, M, N,
                             K, k_tiles, c0, n_steps, k0, n_local, tiles_t, STAGES, BLOCK_N, BLOCK_T, BLOCK_K,
                             G2, SWAR, mma, STREAM, xab_s, XAB_ROWS)
    elif FMT == _FMT_2L or F16:
        acc = _mainloop_one_acc(x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, ready, off_t, off_n, N, k_tiles, c0,
                                n_steps, k0, n_local, tiles_t, STAGES, BLOCK_N, BLOCK_T, BLOCK_K, G2, SWAR, MMA_ASYNC,
                                mma, STREAM, NONEMPTY_K, F16)
    else:
        acc = _mainloop_g(x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, xe, ready, xscale_ptr, off_t, off_n, M, N,
                          k_tiles, c0, n_steps, k0, n_local, tiles_t, STAGES, BLOCK_N, BLOCK_T, BLOCK_K, G2, SWAR,
                          mma, STREAM)
    return acc


@gluon.jit
def _epilogue(acc, off_n, off_t, M, N, R, out_ptr, stride_om, xscale_ptr, wscale_ptr, col_scale_ptr, bias_ptr,
              s_ptr, stride_sm, up_ptr, stride_un, s16, BLOCK_N: gl.constexpr, BLOCK_T: gl.constexpr,
              FMT: gl.constexpr, HAS_LOWRANK: gl.constexpr, HAS_COL_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr,
              mma: gl.constexpr, BLOCK_R: gl.constexpr = 0, F16: gl.constexpr = False):
    """Registers → out: the tile is [BLOCK_N weight rows, BLOCK_T tokens] of the fp32 main product (2l: still
    without t ⊗ s; F16: without the powers of two t ⊗ c, xscale_ptr / wscale_ptr [M] / [N] fp32); masked store of
    the transposed tile.

    The low-rank term (BLOCK_R > 0, the rank padded to a power of two ≥ 16) is ONE register-A wgmma onto the
    accumulator, as in every other kernel (kernels/epilogue.py): acc[BN, BT] += lora_up[BN, R] · S[BT, R]ᵀ, the
    lora_up tile loaded straight into the A-operand registers, S rounded to lora_up's dtype (like an unfused
    ``s @ B.T``) and staged in ``s16`` [BT, BLOCK_R] as the B operand. Both loads go out together, one L2 round trip.
    BLOCK_R = 0 keeps the session-3 loop over the rank (one dependent pair of loads per rank column: 21 % of
    the warps' stall samples at M = 16, K = 4096, N = 28672, ncu, session 32), for A/B."""
    offs_n = off_n + gl.arange(0, BLOCK_N, gl.SliceLayout(1, mma))
    offs_t = off_t + gl.arange(0, BLOCK_T, gl.SliceLayout(0, mma))
    n_ok = offs_n < N
    t_ok = offs_t < M
    if FMT == _FMT_2L or F16:
        ts = gl.load(xscale_ptr + offs_t, mask=t_ok, other=0.0)
        ws = gl.load(wscale_ptr + offs_n, mask=n_ok, other=0.0)
        acc = acc * ws[:, None] * ts[None, :]
    if HAS_COL_SCALE:
        acc = acc * gl.load(col_scale_ptr + offs_n, mask=n_ok, other=0.0).to(gl.float32)[:, None]
    out = acc
    if HAS_LOWRANK:
        if BLOCK_R > 0:
            nw: gl.constexpr = gl.num_warps()
            lr_dtype: gl.constexpr = up_ptr.dtype.element_ty
            mma16: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[nw, 1],
                                                            instr_shape=[16, BLOCK_T, 16])
            up_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma16, k_width=2)
            RC: gl.constexpr = 32 if BLOCK_R > 32 else BLOCK_R    # rank columns per wgmma: ≤ 16 A registers
            un = off_n + gl.arange(0, BLOCK_N, gl.SliceLayout(1, up_layout))
            ur = gl.arange(0, RC, gl.SliceLayout(0, up_layout))
            up = gl.load(up_ptr + un[:, None] * stride_un + ur[None, :], mask=(un < N)[:, None] & (ur < R)[None, :],
                         other=0.0)
            s_layout: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [nw, 1], [1, 0])
            st = off_t + gl.arange(0, BLOCK_T, gl.SliceLayout(1, s_layout))
            sr = gl.arange(0, BLOCK_R, gl.SliceLayout(0, s_layout))
            sv = gl.load(s_ptr + st[:, None] * stride_sm + sr[None, :], mask=(st < M)[:, None] & (sr < R)[None, :],
                         other=0.0)
            gl.thread_barrier()          # (stream-K: a program's previous tile) every warp is past its read of s16
            s16.store(sv.to(lr_dtype))
            fence_async_shared()
            gl.thread_barrier()          # every warp's rows of s16 are in before the wgmma reads them
            out16 = gl.convert_layout(out, mma16, assert_trivial=True)
            out16 = warpgroup_mma(up, s16.slice(0, RC, dim=1).permute((1, 0)), out16)
            for c in gl.static_range(1, BLOCK_R // RC):    # rank 64 / 128 at BT = 64 would spill as one A tile
                up = gl.load(up_ptr + un[:, None] * stride_un + (c * RC + ur)[None, :],
                             mask=(un < N)[:, None] & (c * RC + ur < R)[None, :], other=0.0)
                out16 = warpgroup_mma(up, s16.slice(c * RC, RC, dim=1).permute((1, 0)), out16)
            out = gl.convert_layout(out16, mma, assert_trivial=True)
        else:
            for r in range(R):
                up = gl.load(up_ptr + offs_n * stride_un + r, mask=n_ok, other=0.0).to(gl.float32)
                sv = gl.load(s_ptr + offs_t * stride_sm + r, mask=t_ok, other=0.0)
                sv = sv.to(up_ptr.dtype.element_ty).to(gl.float32)     # rounded like an unfused s @ B.T
                out = out + up[:, None] * sv[None, :]
    if HAS_BIAS:
        out = out + gl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(gl.float32)[:, None]
    mask = n_ok[:, None] & t_ok[None, :]
    gl.store(out_ptr + offs_t[None, :] * stride_om + offs_n[:, None], out.to(out_ptr.dtype.element_ty), mask=mask)


XAB_FILL_ROWS = 32       # rows of the xab table per load in _fill_xab (a [32, BT] fp32 tile: ≤ 16 per thread)
_XAB_FILL_ROWS = gl.constexpr(XAB_FILL_ROWS)


@gluon.jit
def _fill_xab(xab_s, xab_ptr, M, K, G2: gl.constexpr, BLOCK_T: gl.constexpr, XAB_ROWS: gl.constexpr):
    """xab [K/G, 2, M] (fp32, row 2g = a, 2g + 1 = b of group g) → xab_s [XAB_ROWS, BT]: tokens 0 .. BT−1 (the
    launch has one token tile), rows past 2·K/G and tokens ≥ M zero — so groups past K (the last step's TMA zero
    fill) fold in exactly 0, as with the masked loads of the other path."""
    FR: gl.constexpr = _XAB_FILL_ROWS
    nw: gl.constexpr = gl.num_warps()
    fill_l: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (BLOCK_T // 4), BLOCK_T // 4], [nw, 1], [1, 0])
    rows = gl.arange(0, FR, gl.SliceLayout(1, fill_l))
    cols = gl.arange(0, BLOCK_T, gl.SliceLayout(0, fill_l))
    n_rows = 2 * (K // G2)
    tiles = xab_s._reinterpret(gl.float32, [XAB_ROWS, BLOCK_T], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
    for c in gl.static_range(XAB_ROWS // FR):
        r = c * FR + rows
        v = gl.load(xab_ptr + r[:, None] * M + cols[None, :], mask=(r < n_rows)[:, None] & (cols < M)[None, :],
                    other=0.0)
        tiles.slice(c * FR, FR, dim=0).store(v)
    gl.thread_barrier()     # every warp's rows are in before any warp reads them


@gluon.jit
def _finish_tile(acc, tile, whole, pid, n_programs, total, k_tiles, ws_ptr, cnt_ptr, max_contrib,
                 BLOCK_N: gl.constexpr, BLOCK_T: gl.constexpr, mma: gl.constexpr):
    """STREAM: the tile's accumulator over this program's K range → (ready, acc): the whole tile's sum once it is
    complete. A program that owns the whole tile has it. Otherwise the tile's contributors — programs
    p_first .. p_last, in iteration order — each park their partial in slot p − p_first of the tile's workspace
    and take a ticket; the last to arrive sums slots 0 .. n−1 from zero in slot order (kernels/splitk.py: the
    bits do not depend on who arrives last; 2l partials are int32, exact in any order), resets the ticket and
    finishes the tile. (p_first/p_last: the owner of iteration i is ((i + 1)·P − 1) // T, host:
    DecodeWork.owner.)"""
    IN_FLIGHT: gl.constexpr = 2 if BLOCK_N * BLOCK_T <= 4096 else 1   # ≤ 32 partial registers per thread
    TILE: gl.constexpr = BLOCK_N * BLOCK_T
    if whole:
        ready = whole
    else:
        p_first = ((tile * k_tiles + 1) * n_programs - 1) // total
        n_contrib = (((tile + 1) * k_tiles) * n_programs - 1) // total - p_first + 1
        rows = gl.arange(0, BLOCK_N, gl.SliceLayout(1, mma))
        cols = gl.arange(0, BLOCK_T, gl.SliceLayout(0, mma))
        offs = rows[:, None] * BLOCK_T + cols[None, :]
        every = gl.full([BLOCK_N, BLOCK_T], True, gl.int1, mma)
        base = ws_ptr + tile.to(gl.int64) * max_contrib * TILE
        splitk_store(base, offs, TILE, pid - p_first, acc, every)
        ready = splitk_arrive(cnt_ptr + tile, n_contrib)
        if ready:
            acc = splitk_sum(base, offs, TILE, every, n_contrib, gl.zeros_like(acc), IN_FLIGHT)
            splitk_reset(cnt_ptr + tile)
    return ready, acc


@gluon.jit(do_not_specialize=["M", "N", "K", "stride_om", "stride_sm", "stride_un", "R", "n_programs",
                              "max_contrib"])
def w4a4_decode_kernel(x_desc, w_desc, u_desc,
                       out_ptr, stride_om, xscale_ptr, wscale_ptr, col_scale_ptr, bias_ptr,
                       s_ptr, stride_sm, up_ptr, stride_un, ws_ptr, cnt_ptr,
                       M, N, K, R, n_programs, max_contrib,
                       G2: gl.constexpr, BLOCK_T: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                       STAGES: gl.constexpr, HAS_LOWRANK: gl.constexpr,
                       HAS_COL_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr, SWAR: gl.constexpr,
                       MMA_ASYNC: gl.constexpr = True, FMT: gl.constexpr = 1, F8: gl.constexpr = False,
                       STREAM: gl.constexpr = False, PDL: gl.constexpr = False, NONEMPTY_K: gl.constexpr = False,
                       BLOCK_R: gl.constexpr = 0, XAB_ROWS: gl.constexpr = 0, F16: gl.constexpr = False):
    """STREAM = False: one program per output tile, grid (cdiv(N, BN), cdiv(M, BT)). STREAM: grid (n_programs,),
    program p owns iterations [p·T // P, (p + 1)·T // P) of the T = tiles · k_tiles (tile, K step) iterations
    (split-K: P = tiles · split; stream-K: P = the programs that fit on the device at once); tiles split over
    programs meet in ws_ptr ([tiles, max_contrib, BN·BT], int32 for 2l, fp32 for g) with one int32 ticket per
    tile (cnt_ptr: zero on entry, left zero). PDL: the weight and row-table copies of the first STAGES steps go
    out before griddepcontrol.wait; everything the previous kernel writes (tokens, scales, lowrank_act) is read,
    and anything global written, only after it. BLOCK_R > 0: the low-rank term is one wgmma (:func:`_epilogue`).
    XAB_ROWS > 0 (F8, one token tile): the xab rows of every group in shared memory (:func:`_fill_xab`)."""
    gl.static_assert(BLOCK_K % _PACK == 0, "BLOCK_K must be a multiple of the 64-wide pack block")
    gl.static_assert(BLOCK_K % G2 == 0, "a K step covers whole groups")
    gl.static_assert(not F8 or FMT == _FMT_G, "F8 (e4m3 MMA) is the int4_g64 path's variant")
    gl.static_assert(not F16 or (FMT == _FMT_G and not F8), "F16 (fp16 MMA) is the int4_g64 path's other variant")
    XFULL: gl.constexpr = F8 or F16      # the ring holds whole [BT, BK] token tiles (not packed ones)
    if PDL:
        gl_gdc_launch_dependents()   # only lets the next grid be scheduled; its own wait still waits for us
    if STREAM:
        pid = gl.program_id(0)
    else:
        off_n = gl.program_id(0) * BLOCK_N
        off_t = gl.program_id(1) * BLOCK_T
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                  instr_shape=[16, BLOCK_T, 32])
    # Every SMEM buffer and barrier of the kernel is declared here (decode_ledger mirrors it).
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(gl.uint8, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    UR: gl.constexpr = BLOCK_K // G2
    EB: gl.constexpr = u_desc.dtype.primitive_bitwidth // 8
    ROW_BOX: gl.constexpr = _is_row_box(u_desc.block_type.shape)
    # 1-D copies: each row 128-byte aligned; a 2-D box: rows of BN elements, dense, slots padded (_row_slot_rows)
    ROW: gl.constexpr = BLOCK_N if (ROW_BOX or BLOCK_N * EB >= _U_ROW) else _U_ROW // EB
    SR: gl.constexpr = _row_slot_rows(UR, BLOCK_N * EB, ROW_BOX)
    rows_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=EB * 8, rank=1)
    u_bufs = gl.allocate_shared_memory(u_desc.dtype, [STAGES * SR, ROW], rows_layout)
    ready = alloc_barriers(STAGES, 1)
    if FMT == _FMT_G and not XFULL:     # the step's expanded token tile (the int8 path's wgmma B operand)
        xe_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_T, BLOCK_K], gl.int8)
        xe = gl.allocate_shared_memory(gl.int8, [BLOCK_T, BLOCK_K], xe_layout)
    else:
        xe = u_bufs   # unused
    if HAS_LOWRANK and BLOCK_R > 0:    # S rounded to lora_up's dtype: the epilogue wgmma's B operand
        lr_dtype: gl.constexpr = up_ptr.dtype.element_ty
        s16 = gl.allocate_shared_memory(lr_dtype, [BLOCK_T, BLOCK_R],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_T, BLOCK_R], lr_dtype))
    else:
        s16 = u_bufs  # unused
    if F8 and XAB_ROWS > 0:
        # rows read one at a time (a rank-1 layout of plain rows, as the row tables), filled as 2-D tiles
        xab_s = gl.allocate_shared_memory(gl.float32, [XAB_ROWS, BLOCK_T],
                                          gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1))
    else:
        xab_s = u_bufs  # unused

    k_tiles = gl.cdiv(K, BLOCK_K)
    tiles_t = gl.cdiv(M, BLOCK_T)
    if STREAM:
        total = gl.cdiv(N, BLOCK_N) * tiles_t * k_tiles
        lo = (pid * total) // n_programs
        hi = ((pid + 1) * total) // n_programs
        first = lo // k_tiles              # the program's first tile and K step: the prologue's origin
        pid_n = first // tiles_t
        off_n = pid_n * BLOCK_N
        off_t = (first - pid_n * tiles_t) * BLOCK_T
        k_first = lo - first * k_tiles
    else:
        lo = 0
        hi = k_tiles
        k_first = 0
    # the ring's first STAGES steps; with PDL the tokens only after the previous kernel is done
    for i in gl.static_range(STAGES):
        _refill(i, k_first + i, True, hi - lo, tiles_t, off_t, off_n, x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs,
                ready, N, k_tiles, STAGES, BLOCK_T, BLOCK_N, BLOCK_K, G2, FMT, XFULL, STREAM,
                _PART_WEIGHTS if PDL else _PART_ALL)
    if PDL:
        gl_gdc_wait()
        for i in gl.static_range(STAGES):
            _refill(i, k_first + i, True, hi - lo, tiles_t, off_t, off_n, x_desc, w_desc, u_desc, x_bufs, w_bufs,
                    u_bufs, ready, N, k_tiles, STAGES, BLOCK_T, BLOCK_N, BLOCK_K, G2, FMT, XFULL, STREAM, _PART_TOKENS)
    if F8 and XAB_ROWS > 0:    # (after the PDL wait: act_quant / the e4m3 expansion writes xab)
        _fill_xab(xab_s, xscale_ptr, M, K, G2, BLOCK_T, XAB_ROWS)

    if STREAM:
        for tile in range(lo // k_tiles, (hi - 1) // k_tiles + 1):
            t_lo = tile * k_tiles
            seg_lo = gl.maximum(lo, t_lo)
            seg_hi = gl.minimum(hi, t_lo + k_tiles)
            pid_n = tile // tiles_t
            tile_n = pid_n * BLOCK_N
            tile_t = (tile - pid_n * tiles_t) * BLOCK_T
            acc = _mainloop(x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, xe, ready, xscale_ptr, tile_t, tile_n,
                            M, N, K, k_tiles, seg_lo - lo, seg_hi - seg_lo, seg_lo - t_lo, hi - lo, tiles_t,
                            STAGES, BLOCK_N, BLOCK_T, BLOCK_K, G2, SWAR, MMA_ASYNC, FMT, F8, mma, STREAM, NONEMPTY_K,
                            xab_s, XAB_ROWS, F16)
            done, acc = _finish_tile(acc, tile, (seg_lo == t_lo) & (seg_hi == t_lo + k_tiles), pid, n_programs, total,
                                     k_tiles, ws_ptr, cnt_ptr, max_contrib, BLOCK_N, BLOCK_T, mma)
            if done:
                _epilogue(acc.to(gl.float32), tile_n, tile_t, M, N, R, out_ptr, stride_om, xscale_ptr, wscale_ptr,
                          col_scale_ptr, bias_ptr, s_ptr, stride_sm, up_ptr, stride_un, s16, BLOCK_N, BLOCK_T, FMT,
                          HAS_LOWRANK, HAS_COL_SCALE, HAS_BIAS, mma, BLOCK_R, F16)
    else:
        acc = _mainloop(x_desc, w_desc, u_desc, x_bufs, w_bufs, u_bufs, xe, ready, xscale_ptr, off_t, off_n, M, N, K,
                        k_tiles, 0, k_tiles, 0, k_tiles, tiles_t, STAGES, BLOCK_N, BLOCK_T, BLOCK_K, G2, SWAR,
                        MMA_ASYNC, FMT, F8, mma, STREAM, NONEMPTY_K, xab_s, XAB_ROWS, F16)
        _epilogue(acc.to(gl.float32), off_n, off_t, M, N, R, out_ptr, stride_om, xscale_ptr, wscale_ptr,
                  col_scale_ptr, bias_ptr, s_ptr, stride_sm, up_ptr, stride_un, s16, BLOCK_N, BLOCK_T, FMT, HAS_LOWRANK,
                  HAS_COL_SCALE, HAS_BIAS, mma, BLOCK_R, F16)


# =============================================================================================
# Host side
_BITS = {torch.bfloat16: 16, torch.float16: 16, torch.float32: 32}


@functools.lru_cache(maxsize=256)    # builds ledgers; the launch asks on every call
def default_decode_config(M: int, group_size: int = 64, fmt: str = "int4_2l", f8: bool = False,
                          lowrank_block: int = 0, f16: bool = False) -> KernelConfig:
    """Token tile = M rounded up to 16, 32 or 64 (a wgmma N; KernelConfig tiles are ≥ 16). Measured on the H200
    (probes/probe_decode_s3b, K=4096, N=28672, async wgmmas): M ≤ 16 best at 128 weight rows × 256 K × 4 stages
    (29.9 µs at M=1; 64×256×4 30.8, 128×512×2 35.5); M = 64 at 128×128×6 (47.1; 128×256×4 65.7: two CTAs
    of 133 KB no longer share an SM). The ring is then cut to what lets CTAS_PER_SM CTAs share an SM. ``f8``
    (int4_g64 on e4m3) starts from the same tiles (its ring holds 8-bit instead of packed tokens, and no
    expanded token tile). ``f16`` (int4_g64 on fp16, no per-group rescale): the same tiles, its ring holding
    16-bit token tiles (so fewer stages fit)."""
    bt = 16 if M <= 16 else 32 if M <= 32 else 64
    bk, stages = (256, 4) if bt == 16 else (128, 6)
    # f8 keeps two fp32 partials beside acc (one in flight while the other is folded): at 128 × 64 that is 192
    # registers per thread and ptxas spills (sm_90 AOT: 255 regs, ~500 B); 64 weight rows do not (236)
    bn = 64 if (f8 and bt > 16) else 128
    base = KernelConfig(block_m=bt, block_n=bn, block_k=bk, block_r=16, group_m=1, num_warps=WARPS,
                        num_stages=stages, lowrank_stages=0, persistent=False)
    while stages > 2 and CTAS_PER_SM * decode_ledger(base.replace(num_stages=stages), group_size, fmt, f8,
                                                     lowrank_block=lowrank_block, f16=f16).total() > SM90_SMEM_PER_SM:
        stages -= 1
    return base.replace(num_stages=stages)


def decode_ledger(config: KernelConfig, group_size: int = 64, fmt: str = "int4_2l", f8: bool = False,
                  row_box: bool = False, lowrank_block: int = 0, xab_rows: int = 0, f16: bool = False) -> SmemLedger:
    """Every byte ``w4a4_decode_kernel`` allocates (one CTA; several share an SM). ``f8`` (int4_g64): the ring
    holds e4m3 token tiles [BT, BK] (the wgmma B operand, by TMA) and there is no expanded token tile; the
    a/b rows come from global memory (L2) into registers unless ``xab_rows`` (below). ``row_box``: the row table
    lands as one dense [BK/G, BN] box per slot (padded to 128 bytes) instead of one 128-byte-aligned row per group.
    ``lowrank_block`` > 0 (the epilogue's low-rank wgmma, :func:`_epilogue`): S as its 16-bit B operand [BT, block].
    ``xab_rows`` > 0 (f8): the token tile's a/b rows of every group, fp32 [xab_rows, BT] (:func:`_fill_xab`).
    ``f16`` (int4_g64): the ring holds fp16 token tiles [BT, BK] (the wgmma B operand, by TMA) and the fp16 scale
    rows; no expanded token tile."""
    bt, bn, bk, s = config.block_m, config.block_n, config.block_k, config.num_stages
    g = fmt != "int4_2l"
    f8 = bool(f8) and g
    f16 = bool(f16) and g and not f8
    row_bits = 16 if g else 8          # g: w_scale rows (16-bit); 2l: u rows (uint8)
    row = bn if row_box else max(bn, U_ROW * 8 // row_bits)
    slot_rows = _row_slot_rows(bk // group_size, bn * row_bits // 8, row_box)
    if f8:
        x_term = SmemTerm("ring.x_e4m3", tile_bytes(bt, bk, 8), s)
    elif f16:
        x_term = SmemTerm("ring.x_f16", tile_bytes(bt, bk, 16), s)
    else:
        x_term = SmemTerm("ring.x_packed" if g else "ring.x_int8", tile_bytes(bt, bk // 2 if g else bk, 8), s)
    terms = [x_term,
             SmemTerm("ring.w_packed", tile_bytes(bn, bk // 2, 8), s),
             SmemTerm("ring.w_scale_rows" if g else "ring.u_rows", tile_bytes(slot_rows, row, row_bits), s)]
    if g and not f8 and not f16:
        terms.append(SmemTerm("x_int8", tile_bytes(bt, bk, 8), 1))   # the step's expanded token tile
    if lowrank_block:
        terms.append(SmemTerm("lowrank.s16", tile_bytes(bt, lowrank_block, 16), 1))
    if xab_rows and f8:
        terms.append(SmemTerm("xab_table", tile_bytes(xab_rows, bt, 32), 1))
    terms.append(SmemTerm("barriers", barrier_bytes(s)))
    if config.split_k > 1 or config.persistent:
        # the ticket (a scalar atomic: one thread's result, broadcast) gets a 4-byte scratch word that the
        # compiler places 128-byte aligned after every buffer above
        below = sum(t.total(1) for t in terms)
        terms.append(SmemTerm("ticket_scratch", -below % TICKET_SCRATCH_ALIGN + 4))
    return SmemLedger(tuple(terms), consumers=1, label=f"w4a4 decode {fmt}{' f8' if f8 else ' f16' if f16 else ''} "
                      f"{bt}x{bn}x{bk}"
                      + (" row-box" if row_box else "")
                      + (f" split{config.split_k}" if config.split_k > 1 else " stream-K" if config.persistent else ""))


@functools.lru_cache(maxsize=1024)   # a pure check of hashable values (a failure raises again on every call)
def check_decode_config(config: KernelConfig, M: int, N: int, K: int, group_size: int, fmt: str = "int4_2l",
                        f8: bool = False, row_box: bool = False, lowrank_block: int = 0, xab_rows: int = 0,
                        f16: bool = False):
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
    if K < 1:
        raise ValueError(f"w4a4 decode: K must be ≥ {PACK}, got K={K}")
    if f8 and fmt != "int4_g64":
        raise ValueError(f"w4a4 decode: the e4m3 path (f8=True) is for int4_g64, got fmt={fmt!r}")
    if f16 and (fmt != "int4_g64" or f8):
        raise ValueError(f"w4a4 decode: the fp16 path (f16=True) is for int4_g64 and excludes f8, got fmt={fmt!r}, "
                         f"f8={f8}")
    if config.split_k > 1 and config.persistent:
        raise ValueError(f"w4a4 decode: split_k={config.split_k} and persistent (stream-K) are two ways to deal the "
                         f"K steps to programs; pick one")
    if xab_rows and (not f8 or cdiv(M, bt) > 1 or xab_rows < _xab_rows_needed(K, bk, group_size)
                     or xab_rows & (xab_rows - 1) or xab_rows < XAB_FILL_ROWS):
        raise ValueError(f"w4a4 decode: the xab table needs the f8 path, one token tile (M ≤ block_m) and ≥ 2 rows per "
                         f"group of every K step, a power of two ≥ {XAB_FILL_ROWS} rows; got f8={f8}, M={M}, "
                         f"block_m={bt}, xab_rows={xab_rows}")
    decode_ledger(config, group_size, fmt, f8, row_box, lowrank_block, xab_rows, f16).check()


def plan_decode(M: int, config: KernelConfig | None = None, group_size: int = 64,
                fmt: str = "int4_2l", f8: bool = False, lowrank_block: int = 0, f16: bool = False) -> KernelConfig:
    """``config``, else the default one — dealt as ``LOWRANK_GEMM_DECODE_SPLIT`` says (unset: one program per
    tile; "2", "3", …: split-K; "stream": stream-K; "stream:3": stream-K on a 3-slot ring, i.e. three 2l CTAs per
    SM at M ≤ 16), so the layer op can be A/B'd without a config."""
    if config is not None:
        return config
    config = default_decode_config(M, group_size, fmt, f8, lowrank_block, f16)
    mode = getenv(SPLIT_ENV, "")
    if mode in ("", "1"):
        return config
    if mode == "stream":
        return config.replace(persistent=True)
    if mode.startswith("stream:") and mode[7:].isdigit() and int(mode[7:]) >= 2:
        return config.replace(persistent=True, num_stages=int(mode[7:]))
    if not mode.isdigit():
        raise ValueError(f"{SPLIT_ENV} must be a split count, 'stream' or 'stream:<ring stages>', got {mode!r}")
    return config.replace(split_k=int(mode))


@dataclass(frozen=True)
class DecodeWork:
    """How one launch deals its T = tiles · k_tiles (tile, K step) iterations to programs — the host mirror of the
    kernel's STREAM arithmetic (plain Python: the tests run the ticket protocol on it, tests/test_w4a4_decode.py).

    ``programs`` = 0: one program per tile, grid (tiles_n, tiles_t), no partials (today's default). Otherwise
    grid (programs,) and program p owns iterations [p·T // P, (p + 1)·T // P), tile-major (tile = pid_n ·
    tiles_t + pid_t, K step fastest): split-K is P = tiles · split (each program inside one tile), stream-K P =
    the programs resident at once (#SMs × CTAs per SM: equal work per SM, a program may span tiles). A tile
    owned by one program is finished by it; otherwise its contributors (consecutive programs) park partials in
    slots 0 .. n−1 of the tile's workspace, in iteration order, and the last to take the tile's ticket sums
    them in slot order and finishes the tile."""

    tiles_n: int
    tiles_t: int
    k_tiles: int
    programs: int = 0

    def __post_init__(self):
        if min(self.tiles_n, self.tiles_t, self.k_tiles) < 1 or not 0 <= self.programs <= self.total:
            raise ValueError(f"w4a4 decode: bad work split {self} (0 ≤ programs ≤ tiles·k_tiles = {self.total})")
        if self.programs * self.total >= 2**31:   # the kernel forms p·T in int32
            raise ValueError(f"w4a4 decode: programs·iterations = {self.programs * self.total} overflows int32")

    @property
    def stream(self) -> bool:
        return self.programs > 0

    @property
    def tiles(self) -> int:
        return self.tiles_n * self.tiles_t

    @property
    def total(self) -> int:
        return self.tiles * self.k_tiles

    @property
    def grid(self) -> tuple:
        return (self.programs, ) if self.stream else (self.tiles_n, self.tiles_t)

    def range_of(self, p: int) -> tuple[int, int]:
        """Iterations [lo, hi) of program p (STREAM)."""
        return p * self.total // self.programs, (p + 1) * self.total // self.programs

    def owner(self, it: int) -> int:
        """The program whose range holds iteration ``it``: the largest p with p·T // P ≤ it."""
        return ((it + 1) * self.programs - 1) // self.total

    def contributors(self, tile: int) -> range:
        """Programs that run K steps of ``tile``, in slot order (STREAM)."""
        return range(self.owner(tile * self.k_tiles), self.owner((tile + 1) * self.k_tiles - 1) + 1)

    def segments(self, p: int) -> list[tuple[int, int, int]]:
        """(tile, first K step, end K step) of every tile program p works on, in order (the kernel's tile loop)."""
        lo, hi = self.range_of(p)
        k = self.k_tiles
        return [(t, max(lo, t * k) - t * k, min(hi, t * k + k) - t * k) for t in range(lo // k, (hi - 1) // k + 1)]

    @functools.cached_property
    def max_contrib(self) -> int:
        """Partial slots per tile in the workspace (1: no tile is shared, no partials)."""
        if not self.stream:
            return 1
        return max(len(self.contributors(t)) for t in range(self.tiles))

    def workspace_numel(self, block_n: int, block_t: int) -> int:
        return self.tiles * self.max_contrib * block_n * block_t if self.max_contrib > 1 else 0


def simulate_decode_work(work: DecodeWork, partial, schedule) -> tuple[dict, list, list]:
    """Run the kernel's finish protocol (``_finish_tile``) on the host with programs interleaved at will — the
    model the CPU tests check (every iteration once, every tile finished once, results independent of the
    arrival order, tickets back at 0). ``partial(tile, k_lo, k_hi)``: a program's accumulator over those K steps
    of the tile (any value with ``+``: fp32 tensors model the g sums, ints the 2l ones); ``schedule(ready)``:
    picks which of the programs that still have tiles left runs its next tile. Returns (tile → finished value,
    tickets, slots written as (tile, slot))."""
    tickets = [0] * work.tiles
    slots: dict = {}
    done: dict = {}
    nxt = {p: 0 for p in range(work.programs)}
    segs = {p: work.segments(p) for p in range(work.programs)}
    while nxt:
        p = schedule(sorted(nxt))
        tile, k_lo, k_hi = segs[p][nxt[p]]
        nxt[p] += 1
        if nxt[p] == len(segs[p]):
            del nxt[p]
        acc = partial(tile, k_lo, k_hi)
        if k_lo == 0 and k_hi == work.k_tiles:
            assert tile not in done, f"tile {tile} finished twice"
            done[tile] = acc
            continue
        owners = work.contributors(tile)
        slot = p - owners.start
        assert 0 <= slot < work.max_contrib and (tile, slot) not in slots, (tile, slot)
        slots[(tile, slot)] = acc
        tickets[tile] += 1
        if tickets[tile] == len(owners):        # the last arriver: sum from zero in slot order
            total = partial(tile, 0, 0)          # zero of the partials' type
            for s in range(len(owners)):
                total = total + slots[(tile, s)]
            tickets[tile] = 0
            assert tile not in done, f"tile {tile} finished twice"
            done[tile] = total
    return done, tickets, sorted(slots)


def decode_ctas_per_sm(config: KernelConfig, group_size: int = 64, fmt: str = "int4_2l", f8: bool = False,
                       row_box: bool = False, lowrank_block: int = 0, xab_rows: int = 0, f16: bool = False) -> int:
    """CTAs of this config that share an SM — what stream-K sizes its grid by, so an overestimate would leave
    programs for a second wave: SMEM (ledger + the 1 KB the driver reserves per CTA) and registers (2l with
    16-token tiles ≤ :data:`REGS_2L_16` per thread; everything else is budgeted at 255, i.e. two CTAs)."""
    per_cta = decode_ledger(config, group_size, fmt, f8, row_box, lowrank_block, xab_rows, f16).total() + 1024
    regs = REGS_2L_16 if fmt == "int4_2l" and config.block_m == 16 else 255
    by_regs = SM90_REGS_PER_SM // (-(-regs // 8) * 8 * 32 * config.num_warps)
    return max(1, min(by_regs, SM90_SMEM_PER_SM // per_cta))


def plan_decode_work(M: int, N: int, K: int, config: KernelConfig, group_size: int = 64, fmt: str = "int4_2l",
                     f8: bool = False, num_sms: int = SM90_SMS, row_box: bool = False,
                     lowrank_block: int = 0, xab_rows: int = 0, f16: bool = False) -> DecodeWork:
    """One program per tile (default); ``config.split_k`` = s > 1: split-K, each tile's K steps in min(s, k_tiles)
    near-equal contiguous shares; ``config.persistent``: stream-K over num_sms × :func:`decode_ctas_per_sm`
    programs (at most one per iteration). Both are one launch (the last contributor of a tile finishes it;
    ``config.split_mode`` is not read)."""
    tiles_n, tiles_t, k_tiles = cdiv(N, config.block_n), cdiv(M, config.block_m), cdiv(K, config.block_k)
    tiles = tiles_n * tiles_t
    if config.split_k > 1:
        programs = tiles * min(config.split_k, k_tiles)
    elif config.persistent:
        programs = min(tiles * k_tiles, num_sms * decode_ctas_per_sm(config, group_size, fmt, f8, row_box,
                                                                     lowrank_block, xab_rows, f16))
    else:
        programs = 0
    return _work(tiles_n, tiles_t, k_tiles, programs)


@functools.lru_cache(maxsize=256)
def _work(tiles_n: int, tiles_t: int, k_tiles: int, programs: int) -> DecodeWork:
    work = DecodeWork(tiles_n, tiles_t, k_tiles, programs)
    work.max_contrib   # computed once per plan (a loop over the tiles)
    return work


def decode_enabled() -> bool:
    """``LOWRANK_GEMM_DECODE=0`` routes decode back to the v2/v1 kernels (instant fallback)."""
    return getenv("LOWRANK_GEMM_DECODE", "1") != "0"


def decode_nonempty_k_default() -> bool:
    """``nonempty_k=None``: ``LOWRANK_GEMM_DECODE_NONEMPTY_K`` = 0/1, else :data:`NONEMPTY_K_DEFAULT`."""
    return env_switch("LOWRANK_GEMM_DECODE_NONEMPTY_K", NONEMPTY_K_DEFAULT)


def decode_row_box_default() -> bool:
    """``row_box=None``: ``LOWRANK_GEMM_DECODE_ROW_BOX`` = 0/1, else :data:`ROW_BOX_DEFAULT`."""
    return env_switch("LOWRANK_GEMM_DECODE_ROW_BOX", ROW_BOX_DEFAULT)


def decode_epi_mma_default() -> bool:
    """``epi_mma=None``: ``LOWRANK_GEMM_DECODE_EPI_MMA`` = 0/1, else :data:`EPI_MMA_DEFAULT`."""
    return env_switch("LOWRANK_GEMM_DECODE_EPI_MMA", EPI_MMA_DEFAULT)


def decode_xab_smem_default() -> bool:
    """``xab_smem=None``: ``LOWRANK_GEMM_DECODE_XAB_SMEM`` = 0/1, else :data:`XAB_SMEM_DEFAULT`."""
    return env_switch("LOWRANK_GEMM_DECODE_XAB_SMEM", XAB_SMEM_DEFAULT)


def _xab_rows_needed(K: int, block_k: int, group_size: int) -> int:
    """Rows the K loop reads from the xab table: a and b of every group of every K step (the last step's groups
    past K included: their rows are zero)."""
    return 2 * cdiv(K, block_k) * (block_k // group_size)


@functools.lru_cache(maxsize=256)
def xab_table_rows(M: int, K: int, config: KernelConfig, group_size: int, f8: bool, row_box: bool = False,
                   lowrank_block: int = 0) -> int:
    """Rows of the xab table (:func:`_fill_xab`): 2 per group of every K step, rounded up to a power of two (a
    shared-memory tile's shape must be one: Triton 3.6 aborts the process compiling [96, BT] at K = 3072), at
    least :data:`XAB_FILL_ROWS`; 0 (the rows stay L2 loads in the K loop) without f8, with several token tiles, or
    where the table would leave room for fewer than :data:`CTAS_PER_SM` CTAs per SM (e.g. K = 12288: 512 rows).
    Cached: it builds a ledger, and the launch asks on every call."""
    bt, bk = config.block_m, config.block_k
    if not f8 or cdiv(M, bt) > 1:
        return 0
    rows = max(XAB_FILL_ROWS, next_pow2(_xab_rows_needed(K, bk, group_size)))
    per_cta = decode_ledger(config, group_size, "int4_g64", True, row_box, lowrank_block, rows).total() + 1024
    return rows if CTAS_PER_SM * per_cta <= SM90_SMEM_PER_SM else 0


def decode_f16_default(m: int) -> bool:
    """Whether int4_g64 decode of ``m`` tokens takes the fp16 path when ``f16=None`` (it wins over the e4m3 path):
    ``LOWRANK_GEMM_DECODE_F16=1`` at every m ≤ :data:`F16_MAX_M`, ``=0`` never, else :data:`F16_DEFAULT` for
    :data:`F16_MIN_M` ≤ m ≤ :data:`F16_MAX_M`."""
    env = getenv("LOWRANK_GEMM_DECODE_F16", "")
    if m > F16_MAX_M or env == "0":
        return False
    return env == "1" or (bool(F16_DEFAULT) and m >= F16_MIN_M)


def decode_f8_default() -> bool:
    """Whether int4_g64 decode takes the e4m3 path when ``f8=None``: ``LOWRANK_GEMM_DECODE_F8`` = 0/1, else the
    module-level :data:`F8_DEFAULT`."""
    return env_switch("LOWRANK_GEMM_DECODE_F8", F8_DEFAULT)


EPI_MMA_MAX_RANK = 128      # ranks above this keep the per-rank epilogue loop (the wgmma's A tile: 64 registers there)


def _args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt, group_size, config,
          col_scale=None, swar=True, mma_async=True, f8=None, pdl=None, nonempty_k=None, row_box=None, epi_mma=None,
          xab_smem=None, _dims=None, f16=None):
    from ..w4a4_gemm import FORMATS, check_gemm_args
    if fmt not in FORMATS:
        raise ValueError(f"w4a4 decode: fmt must be one of {FORMATS}, got {fmt!r}")
    g = fmt != "int4_2l"
    # _dims: (M, N, K, r) from the GEMM op's own check_gemm_args of these tensors — not twice
    M, N, K, r = _dims or check_gemm_args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, group_size,
                                          fmt)
    dev = x_q.device
    if not (out.dtype in _BITS and tuple(out.shape) == (M, N) and out.is_contiguous() and out.device == dev):
        raise ValueError(f"w4a4 decode: out must be contiguous bf16/fp16/fp32 [M, N] = {[M, N]} on {dev}, got "
                         f"{out.dtype} {list(out.shape)} on {out.device}")
    if col_scale is not None and (tuple(col_scale.shape) != (N, ) or col_scale.device != dev):
        raise ValueError(f"w4a4 decode: col_scale must be [N={N}] on {dev}, got {list(col_scale.shape)}")
    rows = w_scale if g else w_mul       # the [K/G, N] table that rides in the ring
    if g and x_q.dtype == torch.uint8 and x_scale.dtype != w_scale.dtype:   # (e4m3 / fp16: x_scale is fp32)
        raise ValueError(f"w4a4 decode: x_scale and w_scale must share a dtype, got {x_scale.dtype}, {w_scale.dtype}")
    for name, t in (("x_q", x_q), ("w_q", w_q), ("w_mul" if not g else "w_scale", rows)):
        if t.data_ptr() % 16:
            raise ValueError(f"w4a4 decode: {name} must be 16-byte aligned for TMA, got address {t.data_ptr():#x}")
    x16_given = x_q.dtype == torch.float16          # act_quant(out="f16"): the token operand is made already
    if x16_given and (f16 is False or f8):
        raise ValueError(f"w4a4 decode: fp16 activations (act_quant(out='f16')) run only on the fp16 path, got "
                         f"f16={f16}, f8={f8}")
    if f16 is None:     # an explicit f8 (True: e4m3, False: the int8 path) keeps its path
        f16 = x16_given or (g and f8 is None and x_q.dtype == torch.uint8 and decode_f16_default(M))
    f16 = bool(f16)
    if f16 and f8 is None:
        f8 = False
    f8 = (g and decode_f8_default()) if f8 is None else bool(f8)   # f8 with int4_2l: check_decode_config raises
    pdl = pdl_enabled(dev) if pdl is None else bool(pdl)
    nonempty_k = decode_nonempty_k_default() if nonempty_k is None else bool(nonempty_k)
    row_box = decode_row_box_default() if row_box is None else bool(row_box)
    epi_mma = decode_epi_mma_default() if epi_mma is None else bool(epi_mma)
    # (f8 on 32/64-token tiles sits at 254 registers already; the wgmma's operands tip it into a spill: loop there)
    br = rank_block(r) if (r and epi_mma and r <= EPI_MMA_MAX_RANK and not (f8 and M > 16)) else 0
    config = plan_decode(M, config, group_size, fmt, f8, br, f16)
    xab_smem = decode_xab_smem_default() if xab_smem is None else bool(xab_smem)
    xr = xab_table_rows(M, K, config, group_size, f8, row_box, br) if xab_smem else 0
    check_decode_config(config, M, N, K, group_size, fmt, f8, row_box, br, xr, f16)
    bt, bn, bk = config.block_m, config.block_n, config.block_k
    work = plan_decode_work(M, N, K, config, group_size, fmt, f8, num_sms(dev) if dev.type == "cuda" else SM90_SMS,
                            row_box, br, xr, f16)
    if f16:     # x16 [M, K] + t [M]; the fp16 scale rows w16 [K/G, N] ride in the ring, c [N] waits for the epilogue
        from ..w4_expand import f16_act_operands, f16_weight_operands
        if not x16_given:
            x_q, x_scale = f16_act_operands(x_q, x_scale, group_size)
        rows, w_scale = f16_weight_operands(w_q, w_scale, group_size)
    else:
        x_q, x_scale = _f8_operands(x_q, x_scale, group_size, f8, "w4a4 decode")
    x_desc = desc(x_q, (bt, bk // 2) if (g and not f8 and not f16) else (bt, bk))
    w_desc = desc(w_q, (bn, bk // 2))
    bits = rows.element_size() * 8
    if row_box:   # [K/G, N]: the step's BK/G rows × BN columns in one box (row pitch N·bytes: 16-aligned, N % 16 == 0)
        u_desc = desc(rows, (bk // group_size, bn), flat_layout(bits, 2))
    else:
        u_desc = desc(rows.reshape(-1), (bn, ), flat_layout(bits))
    f32 = dummy(dev, torch.float32, (1, ))
    part_dtype = torch.float32 if g else torch.int32     # 2l partials are exact int32 sums
    ws, tickets = dummy(dev, part_dtype, (1, )), dummy(dev, torch.int32, (1, ))
    if work.max_contrib > 1:
        from ..lora_gemm import _TICKETS     # zeroed once per (device, stream), left zero by every launch
        ws = torch.empty(work.workspace_numel(bn, bt), device=dev, dtype=part_dtype)
        tickets = _TICKETS.get(dev, work.tiles)
    args = (x_desc, w_desc, u_desc, out, out.stride(0), x_scale, w_scale,
            col_scale if col_scale is not None else f32, bias if bias is not None else f32,
            lowrank_act if r else f32, lowrank_act.stride(0) if r else 0,
            lora_up if r else dummy(dev, torch.bfloat16, (1, )), lora_up.stride(0) if r else 0, ws, tickets,
            M, N, K, r, work.programs, work.max_contrib)
    cx = dict(G2=group_size, BLOCK_T=bt, BLOCK_N=bn, BLOCK_K=bk, STAGES=config.num_stages,
              HAS_LOWRANK=r > 0, HAS_COL_SCALE=col_scale is not None, HAS_BIAS=bias is not None, SWAR=swar,
              MMA_ASYNC=mma_async, FMT=FMT_INT4_G if g else FMT_INT4_2L, F8=f8, STREAM=work.stream, PDL=pdl,
              NONEMPTY_K=nonempty_k and (not g or f16), BLOCK_R=br, XAB_ROWS=xr, F16=f16)
    return work.grid, args, cx, config


def launch_w4a4_decode(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt: str,
                       group_size: int, config: KernelConfig | None = None, *, col_scale=None, swar: bool = True,
                       mma_async: bool = True, f8: bool | None = None, pdl: bool | None = None,
                       nonempty_k: bool | None = None, row_box: bool | None = None, epi_mma: bool | None = None,
                       xab_smem: bool | None = None, _dims: tuple | None = None, f16: bool | None = None):
    """out [M, N] ← the W4A4 layer's GEMM + epilogue (launcher contract of kernels/w4a4_gemm.py, both formats).
    ``f16`` (int4_g64; None = :func:`decode_f16_default` unless ``f8`` is given): fp16 wgmmas on exact fp16 operands
    with no per-group rescale (:func:`_mainloop_one_acc`; the operands from ``w4_expand.f16_act_operands`` /
    ``f16_weight_operands``, the latter cached per weight).
    ``mma_async=False`` (int4_2l): each wgmma waits for itself — the first H200 version, kept for A/B.
    ``f8`` (int4_g64; None = :func:`decode_f8_default`): e4m3 wgmmas on offset-encoded weights, the tokens
    pre-expanded by ``w4_expand.expand_act_f8`` (one extra launch); False = the int8 path.
    ``config.split_k`` > 1 / ``config.persistent``: split-K / stream-K in one launch (:func:`plan_decode_work`;
    partials from the caching allocator, tickets from the per-stream zeroed regions of ``lora_gemm``: launches
    on one stream must not overlap — PDL keeps them apart, every ticket access follows griddepcontrol.wait).
    ``pdl`` (None = :func:`kernels.pdl.pdl_enabled`): programmatic dependent launch — the kernel's weight loads
    start while the previous kernel (act_quant / expand_act_f8) finishes. ``nonempty_k`` (int4_2l; None =
    :func:`decode_nonempty_k_default`): the K loop that ptxas does not serialize at M > 16 (``_mainloop_one_acc``).
    ``row_box`` (None = :func:`decode_row_box_default`): the step's row table in one 2-D TMA box (``_issue_step``).
    ``epi_mma`` (None = :func:`decode_epi_mma_default`): the low-rank term as one wgmma (ranks ≤
    :data:`EPI_MMA_MAX_RANK`), else a loop over the rank. ``xab_smem`` (None = :func:`decode_xab_smem_default`; f8
    with one token tile where it fits, :func:`xab_table_rows`): the a/b rows from a shared-memory table.
    ``_dims``: (M, N, K, r) already checked by the GEMM op (``w4a4_gemm.check_gemm_args``)."""
    grid, args, cx, cfg = _args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt, group_size,
                                config, col_scale, swar, mma_async, f8, pdl, nonempty_k, row_box, epi_mma, xab_smem,
                                _dims, f16)
    launch(w4a4_decode_kernel, grid, *args, **cx, num_warps=cfg.num_warps, launch_pdl=cx["PDL"])
    return out


def aot_signature_decode(config: KernelConfig | None = None, *, M=5, N=160, K=512, rank=16, group_size=64,
                         bias=True, col_scale=True, swar=True, mma_async=True, fmt="int4_2l", f8=None, pdl=False,
                         nonempty_k=False, row_box=False, epi_mma=None, xab_smem=None, lowrank_dtype=torch.bfloat16,
                         f16=None):
    """(signature, constexprs, config) for ``kernels.aot.compile_sm90`` of :func:`w4a4_decode_kernel`."""
    import inspect
    from triton.runtime.jit import mangle_type
    from .w4a4_ws import make_operands_v2
    ops = make_operands_v2(fmt, M, N, K, rank, group_size, device="cpu", bias=bias, col_scale=col_scale,
                           lowrank_dtype=lowrank_dtype)
    _, args, cx, cfg = _args(**ops, config=config, swar=swar, mma_async=mma_async, f8=f8, pdl=pdl,
                             nonempty_k=nonempty_k, row_box=row_box, epi_mma=epi_mma, xab_smem=xab_smem, f16=f16)
    names = [n for n in inspect.signature(w4a4_decode_kernel.fn).parameters if n not in cx]
    sig = {n: (mangle_type(a) if not isinstance(a, int) else "i32") for n, a in zip(names, args)}
    return sig, cx, cfg
