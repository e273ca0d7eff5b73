"""W4A4 GEMM + low-rank epilogue on Hopper, plain Triton ("v1"), and the public ops ``w4a4_gemm`` /
``w4a4_linear`` (act_quant + GEMM).

    y[M, N] = deq(x_q) · deq(w_q)ᵀ  +  lowrank_act · lora_upᵀ  +  bias        (reference.w4a4_gemm_ref)

LAUNCHER CONTRACT (v1 ``launch_w4a4_v1`` and the Gluon v2 ``gluon.w4a4_ws.launch_w4a4_v2`` take exactly
these arguments; every tensor on one CUDA device, row-major and contiguous unless noted):

    launch(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt, group_size, config)

    fmt "int4_g64" (SVDQuant standard, G = group_size ∈ {64, 128}):
      x_q         uint8 [M, K/2]   activations, int4 packed by formats.int4.pack_int4: per 64-block b,
                                   byte j = element b·64+j (low nibble) | b·64+32+j (high nibble)
      x_scale     bf16|fp16 [K/G, M]  group-major activation scales
        or, pre-expanded for the e4m3 paths of the v2 / decode kernels (``act_quant(..., out="f8")`` or
        ``w4_expand.expand_act_f8``; v1 and the int8 paths reject them):
      x_q         float8_e4m3fn [M, K]   the codes q in natural K order
      x_scale     fp32 [K/G, 2, M]       xab: rows (2⁹·xs, −8·R·xs) per group
        or, per-token e4m3 activations (W4A8, ``kernels.act_e4m3`` / ``formats.fp8``; the v2 kernel only):
      x_q         float8_e4m3fn [M, K]   RN((x/λ)/t) in e4m3
      x_scale     fp32 [M]               t = RN(amax(|x/λ| of the row) / 448)
        or, for the decode kernel's fp16 path (``act_quant(..., out="f16")`` or ``w4_expand.f16_act_operands``; the
        decode kernel only):
      x_q         float16 [M, K]         q·x_scale·2⁻ᵖ, K permuted in every 16 columns (w4_expand.F16_K_PERM)
      x_scale     fp32 [M]               t = 2ᵖ per token
      w_q         uint8 [N, K/2]   weights, same packing
      w_scale     bf16|fp16 [K/G, N]  group-major weight scales (same dtype as the 16-bit x_scale)
      w_mul       None
    fmt "int4_2l" (formats.int4_twolevel; G ∈ {64, 128}):
      x_q         int8 [M, K]      EXPANDED activations q·v (natural K order), |.| ≤ 120
      x_scale     fp32 [M]         per-token scale t
      w_q         uint8 [N, K/2]   weights q, packed as above
      w_scale     fp32 [N]         per-channel scale s
      w_mul       uint8 [K/G, N]   per-group multipliers u ∈ [1, 15] (group-major)
    lowrank_act   fp32 [M, r] or None   S = (x/λ)·lora_downᵀ (from act_quant); r may be 0 or odd
    lora_up       bf16|fp16 [N, r] or None   S is rounded to this dtype before S·lora_upᵀ
    bias          [N] any float dtype, or None
    out           bf16|fp16|fp32 [M, N], written completely (every element)
    config        KernelConfig or None (the launcher plans one)
    K % 64 == 0, K % G == 0, K ≤ formats.int4_twolevel.MAX_K. Deterministic: no atomics, fixed K order.

v1 kernel: persistent grid (#SMs programs) over tiles in grouped order (schedule.grouped_tile); TMA
loads of the packed bytes; unpack with two shifts on int8 (lo = (p << 4) >> 4, hi = p >> 4) into two
ready [rows, 32·(G/64)] tiles, no shuffles, and the dot split in two (low half, high half). g64: one group
per K step (BK = G), int32 partial → fp32 rescale by x_scale ⊗ w_scale. int4_2l: the weight nibble is
multiplied by u in the expansion and the whole K accumulates in int32; t ⊗ s are applied once in the
epilogue (epilogue.affine). Epilogue: affine, lowrank_up, add_bias, store_tile (kernels/epilogue.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ..formats.int4 import PACK_BLOCK
from ..formats.int4_twolevel import MAX_K
from ..plan.config import KernelConfig
from ..plan.smem import SmemLedger, SmemTerm, barrier_bytes, solve_stages, tile_bytes
from ..plan.tuned import TUNED_DIR, read_table, tuned_file
from .act_quant import FORMATS, act_quant
from .env import env_switch
from .int4_unpack import SWAR_DEFAULT, unpack_hi, unpack_lo
from .launch import launch
from .lora_gemm import _direct_ok
from .w4_expand import expand_w4
from .epilogue import add_bias, affine, lowrank_up, rank_block, store_tile
from .schedule import cdiv, grouped_tile, next_pow2, persistent_grid

__all__ = ["launch_w4a4_v1", "plan_w4a4", "w4a4_ledger", "can_implement", "w4a4_gemm", "w4a4_linear",
           "svdq_forward_cuda", "check_gemm_args", "GROUP_SIZES", "w4a4_epilogue_ledger",
           "predicted_shared", "aot_compile", "VARIANTS", "W4A4Plan", "plan_w4a4_full", "swap_config",
           "w4a4_swap_ledger", "swap_ksub", "load_tuned", "TUNED_PATH", "SWAP_AB_MAX_M", "w4a4_expand_ledger",
           "expand_config", "scale_ring_terms"]

GROUP_SIZES = (64, 128)
VARIANTS = ("standard", "swap_ab", "expand")
_HALF = PACK_BLOCK // 2  # 32: elements per nibble half of a packing block


# ---- kernel ---------------------------------------------------------------------------------------

@triton.jit
def _lo(p):
    return unpack_lo(p, SWAR_DEFAULT)   # sign-extended low nibbles (kernels/int4_unpack.py)


@triton.jit
def _hi(p):
    return unpack_hi(p, SWAR_DEFAULT)


@triton.jit
def _mma_in(v, MMA_FP8: tl.constexpr):
    if MMA_FP8:
        return v.to(tl.float16).to(tl.float8e4nv)  # every int4 value is exact in e4m3
    else:
        return v


@triton.jit
def _load_xs(xs_ptr, stride_xsg, ki, offs_m, M):
    return tl.load(xs_ptr + ki * stride_xsg + offs_m, mask=offs_m < M, other=0.0).to(tl.float32)


@triton.jit
def _load_ws(ws_ptr, stride_wsg, ki, offs_n, N):
    return tl.load(ws_ptr + ki * stride_wsg + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)


@triton.jit
def _load_mul(wu_ptr, stride_wug, k0, offs_n, N, G: tl.constexpr):
    return tl.load(wu_ptr + (k0 // G) * stride_wug + offs_n, mask=offs_n < N, other=0).to(tl.int8)


# SCALE_TMA / XS_TMA: a K step's row of the group-major weight scales / multipliers (w_scale, u:
# [K/G, N]) / activation scales (x_scale [K/G, M]) comes through a 2-D TMA descriptor, box [1, B]. A
# descriptor load is what Triton's pipeliner puts in its async ring, num_stages − 1 steps ahead like the
# packed operands; a one-element-per-thread tl.load (too narrow for cp.async) is not, and PREFETCH only
# hides one step of its latency. TMA needs 16-byte row strides (the launcher falls back per tensor,
# e.g. x_scale at M = 1); columns past M / N are zero-filled.
@triton.jit
def _tma_row(desc, g, c0, B: tl.constexpr):
    return desc.load([g, c0]).reshape(B)


@triton.jit
def _step_scales_g(xs_ptr, stride_xsg, ws_ptr, stride_wsg, xs_desc, ws_desc, ki, nk, m0, n0, offs_m, offs_n,
                   M, N, BM: tl.constexpr, BN: tl.constexpr, PREFETCH: tl.constexpr, XS_TMA: tl.constexpr,
                   WS_TMA: tl.constexpr):
    """The scales a step needs from where each lives: TMA (this step's row; the ring is ahead), or a plain
    load of step ki+1 (PREFETCH: the caller uses the previous call's values) or of step ki."""
    kl = tl.minimum(ki + 1, nk - 1) if PREFETCH else ki
    if XS_TMA:
        sa = _tma_row(xs_desc, ki, m0, BM).to(tl.float32)
    else:
        sa = _load_xs(xs_ptr, stride_xsg, kl, offs_m, M)
    if WS_TMA:
        sw = _tma_row(ws_desc, ki, n0, BN).to(tl.float32)
    else:
        sw = _load_ws(ws_ptr, stride_wsg, kl, offs_n, N)
    return sa, sw


@triton.jit
def _init_scale(ptr, stride, offs, L, B: tl.constexpr, NEED: tl.constexpr):
    """Step 0's scales for a prefetching loop (NEED), else a placeholder of the same type."""
    if NEED:
        return tl.load(ptr + offs, mask=offs < L, other=0.0).to(tl.float32)
    else:
        return tl.zeros((B,), tl.float32)


@triton.jit
def _pick(cur, nxt, TMA: tl.constexpr, PREFETCH: tl.constexpr):
    """This step's value: the prefetched register (PREFETCH, plain load) or the fresh one."""
    if PREFETCH and not TMA:
        return cur
    else:
        return nxt


@triton.jit
def _mainloop_g(a_desc, b_desc, xs_ptr, stride_xsg, ws_ptr, stride_wsg, m0, n0, offs_m, offs_n, M, N, K,
                G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MMA_FP8: tl.constexpr,
                PREFETCH: tl.constexpr, xs_desc, ws_desc, XS_TMA: tl.constexpr, WS_TMA: tl.constexpr):
    """Standard format: one group per K step, fp32 accumulator rescaled every group.

    The scales are 16-bit, one per thread: too narrow for cp.async, so Triton's pipeliner leaves them as
    plain loads whose full latency (~1 µs) stalls every K step. PREFETCH loads step ki+1's scales during
    step ki (a register double buffer); XS_TMA / WS_TMA put them in the TMA ring instead."""
    HALF: tl.constexpr = G // 2
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    nk = K // G
    sa = _init_scale(xs_ptr, stride_xsg, offs_m, M, BLOCK_M, PREFETCH and not XS_TMA)
    sw = _init_scale(ws_ptr, stride_wsg, offs_n, N, BLOCK_N, PREFETCH and not WS_TMA)
    for ki in range(0, nk):
        sa_n, sw_n = _step_scales_g(xs_ptr, stride_xsg, ws_ptr, stride_wsg, xs_desc, ws_desc, ki, nk, m0, n0,
                                    offs_m, offs_n, M, N, BLOCK_M, BLOCK_N, PREFETCH, XS_TMA, WS_TMA)
        sa = _pick(sa, sa_n, XS_TMA, PREFETCH)
        sw = _pick(sw, sw_n, WS_TMA, PREFETCH)
        a = a_desc.load([m0, ki * HALF]).to(tl.int8, bitcast=True)  # [BM, G/2]
        b = b_desc.load([n0, ki * HALF]).to(tl.int8, bitcast=True)  # [BN, G/2]
        if MMA_FP8:
            part = tl.dot(_mma_in(_lo(a), True), tl.trans(_mma_in(_lo(b), True)))
            part = tl.dot(_mma_in(_hi(a), True), tl.trans(_mma_in(_hi(b), True)), part)
        else:
            part = tl.dot(_lo(a), tl.trans(_lo(b)), out_dtype=tl.int32)
            part = tl.dot(_hi(a), tl.trans(_hi(b)), part, out_dtype=tl.int32).to(tl.float32)
        acc += part * sa[:, None] * sw[None, :]
        sa = sa_n
        sw = sw_n
    return acc


@triton.jit
def _step_mul(wu_ptr, stride_wug, wu_desc, ki, nk, n0, offs_n, N, G: tl.constexpr, BN: tl.constexpr,
              PREFETCH: tl.constexpr, WS_TMA: tl.constexpr):
    if WS_TMA:
        return _tma_row(wu_desc, (ki * 64) // G, n0, BN).to(tl.int8)
    elif PREFETCH:
        return _load_mul(wu_ptr, stride_wug, tl.minimum(ki + 1, nk - 1) * 64, offs_n, N, G)
    else:
        return _load_mul(wu_ptr, stride_wug, ki * 64, offs_n, N, G)


@triton.jit
def _mainloop_2l(a_desc, b_desc, wu_ptr, stride_wug, m0, n0, offs_n, N, K,
                 G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr,
                 wu_desc, WS_TMA: tl.constexpr):
    """Two-level format: weights expanded as q·u, one int32 accumulation over all of K.
    PREFETCH: the 8-bit multipliers u are loaded one K step ahead (see :func:`_mainloop_g`); WS_TMA:
    through the TMA ring."""
    HALF: tl.constexpr = 32
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.int32)
    nk = K // 64
    u = _load_mul(wu_ptr, stride_wug, 0, offs_n, N, G)
    for ki in range(0, nk):
        u_n = _step_mul(wu_ptr, stride_wug, wu_desc, ki, nk, n0, offs_n, N, G, BLOCK_N, PREFETCH, WS_TMA)
        u = _pick(u, u_n, WS_TMA, PREFETCH)
        a_lo = a_desc.load([m0, ki * 64])          # [BM, 32] int8, elements 64ki + [0, 32)
        a_hi = a_desc.load([m0, ki * 64 + HALF])   # [BM, 32] int8, elements 64ki + [32, 64)
        b = b_desc.load([n0, ki * HALF]).to(tl.int8, bitcast=True)  # [BN, 32]
        acc = tl.dot(a_lo, tl.trans(_lo(b) * u[:, None]), acc, out_dtype=tl.int32)
        acc = tl.dot(a_hi, tl.trans(_hi(b) * u[:, None]), acc, out_dtype=tl.int32)
        u = u_n
    return acc


@triton.jit
def _mainloop_swap_2l(a_desc, b_desc, wu_ptr, stride_wug, m0, n0, offs_n, N, K,
                      G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KSUB: tl.constexpr,
                      wu_desc, WS_TMA: tl.constexpr):
    """SWAP-AB, two-level: accᵀ [BN, BM] += (q·u) [BN, 64] · e[BM, 64]ᵀ. The expanded weight tile is
    computed in registers and is wgmma's register-sourced A operand (no SMEM round trip); the few
    tokens are the N of the MMA (≥ 16 in Triton), read by wgmma straight from the TMA buffer.
    KSUB packing blocks per loop iteration (block_k = 64·KSUB; K % block_k == 0): each pipelined step
    then moves KSUB× the bytes, so the fixed per-step cost (barrier wait, wgmma wait, loop) is paid
    K/block_k times instead of K/64 (decode at K = 4096: 64 steps of only 4 KB of weights per CTA).
    u: prefetched one step ahead, or through the TMA ring (WS_TMA)."""
    HALF: tl.constexpr = 32
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.int32)
    nk = K // 64
    u = _load_mul(wu_ptr, stride_wug, 0, offs_n, N, G)
    for k0 in range(0, nk, KSUB):
        for j in tl.static_range(KSUB):
            ki = k0 + j
            u_n = _step_mul(wu_ptr, stride_wug, wu_desc, ki, nk, n0, offs_n, N, G, BLOCK_N, True, WS_TMA)
            u = _pick(u, u_n, WS_TMA, True)
            b = b_desc.load([n0, ki * HALF]).to(tl.int8, bitcast=True)  # [BN, 32] packed weights
            x_lo = a_desc.load([m0, ki * 64])          # [BM, 32] int8
            x_hi = a_desc.load([m0, ki * 64 + HALF])
            acc = tl.dot(_lo(b) * u[:, None], tl.trans(x_lo), acc, out_dtype=tl.int32)
            acc = tl.dot(_hi(b) * u[:, None], tl.trans(x_hi), acc, out_dtype=tl.int32)
            u = u_n
    return acc


@triton.jit
def _mainloop_swap_g(a_desc, b_desc, xs_ptr, stride_xsg, ws_ptr, stride_wsg, m0, n0, offs_m, offs_n, M, N, K,
                     G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KSUB: tl.constexpr,
                     xs_desc, ws_desc, XS_TMA: tl.constexpr, WS_TMA: tl.constexpr):
    """SWAP-AB, standard format: accᵀ [BN, BM], unpacked weights as register A, unpacked activations
    (a [BM, G/2] tile: tiny) written to SMEM as B; scales prefetched one group ahead or through the TMA
    ring. KSUB groups per loop iteration (block_k = G·KSUB), one int32 partial + rescale per group."""
    HALF: tl.constexpr = G // 2
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    nk = K // G
    sa = _init_scale(xs_ptr, stride_xsg, offs_m, M, BLOCK_M, not XS_TMA)
    sw = _init_scale(ws_ptr, stride_wsg, offs_n, N, BLOCK_N, not WS_TMA)
    for k0 in range(0, nk, KSUB):
        for j in tl.static_range(KSUB):
            ki = k0 + j
            sa_n, sw_n = _step_scales_g(xs_ptr, stride_xsg, ws_ptr, stride_wsg, xs_desc, ws_desc, ki, nk, m0, n0,
                                        offs_m, offs_n, M, N, BLOCK_M, BLOCK_N, True, XS_TMA, WS_TMA)
            sa = _pick(sa, sa_n, XS_TMA, True)
            sw = _pick(sw, sw_n, WS_TMA, True)
            b = b_desc.load([n0, ki * HALF]).to(tl.int8, bitcast=True)  # [BN, G/2] weights
            a = a_desc.load([m0, ki * HALF]).to(tl.int8, bitcast=True)  # [BM, G/2] activations
            part = tl.dot(_lo(b), tl.trans(_lo(a)), out_dtype=tl.int32)
            part = tl.dot(_hi(b), tl.trans(_hi(a)), part, out_dtype=tl.int32).to(tl.float32)
            acc += part * sw[:, None] * sa[None, :]
            sa = sa_n
            sw = sw_n
    return acc


@triton.jit
def _mainloop_expand_2l(a_desc, b_desc, m0, n0, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr):
    """EXPAND, two-level: B is the pre-expanded q·u [N, K] int8 (kernels/w4_expand.py), so this is a plain
    int8 × int8 TMA GEMM — both operands go TMA → SMEM → wgmma, nothing between the MMAs — with one
    int32 accumulation over all of K (t ⊗ s in the epilogue). K tail past K: TMA zero-fills both sides."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.int32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([m0, kt * BLOCK_K])   # [BM, BK] int8 activations e = q·v
        b = b_desc.load([n0, kt * BLOCK_K])   # [BN, BK] int8 weights q·u
        acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)
    return acc


@triton.jit
def _mainloop_expand_g(a_desc, b_desc, xs_ptr, stride_xsg, ws_ptr, stride_wsg, m0, n0, offs_m, offs_n, M, N, K,
                       G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MMA_FP8: tl.constexpr,
                       PREFETCH: tl.constexpr, xs_desc, ws_desc, XS_TMA: tl.constexpr, WS_TMA: tl.constexpr):
    """EXPAND, standard format: B is the pre-expanded nibbles [N, K] (int8, or e4m3 with MMA_FP8) read by
    wgmma straight from the TMA buffer (two [BN, 32] boxes per packing block: its lo and hi halves in
    natural K order); only the small packed A tile [BM, 32] is unpacked in registers (register-A
    wgmma). The per-group fp32 rescale stays."""
    HALF: tl.constexpr = 32
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    nk = K // G
    sa = _init_scale(xs_ptr, stride_xsg, offs_m, M, BLOCK_M, PREFETCH and not XS_TMA)
    sw = _init_scale(ws_ptr, stride_wsg, offs_n, N, BLOCK_N, PREFETCH and not WS_TMA)
    for ki in range(0, nk):
        sa_n, sw_n = _step_scales_g(xs_ptr, stride_xsg, ws_ptr, stride_wsg, xs_desc, ws_desc, ki, nk, m0, n0,
                                    offs_m, offs_n, M, N, BLOCK_M, BLOCK_N, PREFETCH, XS_TMA, WS_TMA)
        sa = _pick(sa, sa_n, XS_TMA, PREFETCH)
        sw = _pick(sw, sw_n, WS_TMA, PREFETCH)
        if MMA_FP8:
            part = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        else:
            part = tl.zeros((BLOCK_M, BLOCK_N), tl.int32)
        for j in tl.static_range(G // 64):
            a = a_desc.load([m0, ki * (G // 2) + j * HALF]).to(tl.int8, bitcast=True)  # [BM, 32] packed
            b_lo = b_desc.load([n0, ki * G + j * 64])          # [BN, 32] elements +[0, 32) of the block
            b_hi = b_desc.load([n0, ki * G + j * 64 + HALF])   # [BN, 32] elements +[32, 64)
            if MMA_FP8:
                part = tl.dot(_mma_in(_lo(a), True), tl.trans(b_lo), part)
                part = tl.dot(_mma_in(_hi(a), True), tl.trans(b_hi), part)
            else:
                part = tl.dot(_lo(a), tl.trans(b_lo), part, out_dtype=tl.int32)
                part = tl.dot(_hi(a), tl.trans(b_hi), part, out_dtype=tl.int32)
        acc += part.to(tl.float32) * sa[:, None] * sw[None, :]
        sa = sa_n
        sw = sw_n
    return acc


@triton.jit
def _w4a4_gemm_kernel(
    a_desc,                        # g64: (M, K/2) u8 block [BM, G/2]; 2l: (M, K) i8 block [BM, 32]
    b_desc,                        # (N, K/2) u8, block [BN, G/2] (g64) / [BN, 32] (2l)
    xs_ptr, stride_xsg,            # g64: (K/G, M) 16-bit; 2l: (M,) fp32
    ws_ptr, stride_wsg,            # g64: (K/G, N) 16-bit; 2l: (N,) fp32
    wu_ptr, stride_wug,            # 2l: (K/G, N) u8 multipliers; g64: unused
    xs_desc, ws_desc, wu_desc,     # XS_TMA / SCALE_TMA: descriptors over x_scale, w_scale | u, box [1, B]; else None
    lr_ptr, stride_lm,             # (M, R) fp32 low-rank activations
    up_ptr, stride_un, stride_ur,  # (N, R) lora_up
    bias_ptr,                      # (N,)
    y_ptr, stride_ym, stride_yn,   # (M, N)
    M, N, K, R, num_progs,
    TWO_LEVEL: tl.constexpr, G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr, GROUP_M: tl.constexpr, HAS_LOWRANK: tl.constexpr, HAS_BIAS: tl.constexpr,
    MMA_FP8: tl.constexpr, SWAP_AB: tl.constexpr = False, PREFETCH: tl.constexpr = True,
    KSUB: tl.constexpr = 1, SCALE_TMA: tl.constexpr = False, XS_TMA: tl.constexpr = False,
    EXPAND: tl.constexpr = False,
    BLOCK_K: tl.constexpr = 64,
):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, num_progs):
        pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        m0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        if EXPAND:
            if TWO_LEVEL:
                acc = _mainloop_expand_2l(a_desc, b_desc, m0, n0, K, BLOCK_M, BLOCK_N, BLOCK_K)
                acc = affine(acc.to(tl.float32), offs_m, offs_n, M, N, xs_ptr, ws_ptr, True, True)
            else:
                acc = _mainloop_expand_g(a_desc, b_desc, xs_ptr, stride_xsg, ws_ptr, stride_wsg, m0, n0, offs_m,
                                         offs_n, M, N, K, G, BLOCK_M, BLOCK_N, MMA_FP8, PREFETCH, xs_desc,
                                         ws_desc, XS_TMA, SCALE_TMA)
                acc = affine(acc, offs_m, offs_n, M, N, xs_ptr, ws_ptr, False, False)
        elif SWAP_AB:
            if TWO_LEVEL:
                acc_t = _mainloop_swap_2l(a_desc, b_desc, wu_ptr, stride_wug, m0, n0, offs_n, N, K, G,
                                          BLOCK_M, BLOCK_N, KSUB, wu_desc, SCALE_TMA)
                acc = affine(tl.trans(acc_t).to(tl.float32), offs_m, offs_n, M, N, xs_ptr, ws_ptr, True, True)
            else:
                acc_t = _mainloop_swap_g(a_desc, b_desc, xs_ptr, stride_xsg, ws_ptr, stride_wsg, m0, n0, offs_m,
                                         offs_n, M, N, K, G, BLOCK_M, BLOCK_N, KSUB, xs_desc, ws_desc,
                                         XS_TMA, SCALE_TMA)
                acc = affine(tl.trans(acc_t), offs_m, offs_n, M, N, xs_ptr, ws_ptr, False, False)
        elif TWO_LEVEL:
            acc = _mainloop_2l(a_desc, b_desc, wu_ptr, stride_wug, m0, n0, offs_n, N, K, G, BLOCK_M, BLOCK_N,
                               PREFETCH, wu_desc, SCALE_TMA)
            acc = affine(acc.to(tl.float32), offs_m, offs_n, M, N, xs_ptr, ws_ptr, True, True)
        else:
            acc = _mainloop_g(a_desc, b_desc, xs_ptr, stride_xsg, ws_ptr, stride_wsg, m0, n0, offs_m, offs_n,
                              M, N, K, G, BLOCK_M, BLOCK_N, MMA_FP8, PREFETCH, xs_desc, ws_desc, XS_TMA,
                              SCALE_TMA)
            acc = affine(acc, offs_m, offs_n, M, N, xs_ptr, ws_ptr, False, False)
        if HAS_LOWRANK:
            offs_r = tl.arange(0, BLOCK_R)
            s = tl.load(lr_ptr + offs_m[:, None] * stride_lm + offs_r[None, :],
                        mask=(offs_m[:, None] < M) & (offs_r[None, :] < R), other=0.0)
            acc = lowrank_up(acc, s, up_ptr, stride_un, stride_ur, offs_n, N, R, BLOCK_R)
        acc = add_bias(acc, offs_n, N, bias_ptr, HAS_BIAS)
        store_tile(y_ptr, acc, offs_m, offs_n, M, N, stride_ym, stride_yn)


# ---- planning: SMEM ledger, config, can_implement ---------------------------------------------------

def w4a4_ledger(cfg: KernelConfig, fmt: str, group_size: int, scale_tma: bool = False) -> SmemLedger:
    """Itemized shared memory of the v1 main loop (one CTA).

    Triton 3.6's pipeliner gives a TMA operand that wgmma reads straight from SMEM ``num_stages`` ring
    slots, and one that is consumed in registers (our unpack) ``num_stages − 1`` slots; one mbarrier per
    slot. The unpacked B half is written back to SMEM for wgmma (B must come from SMEM); lo and hi reuse
    one buffer. g64's unpacked A stays in registers (wgmma's register-A form). The epilogue's buffers
    live after the loop and share its space: see :func:`w4a4_epilogue_ledger`.
    """
    bm, bn, s = cfg.block_m, cfg.block_n, cfg.num_stages
    if fmt == "int4_2l":
        a_slots, terms = s, [SmemTerm("main A x_q int8 lo+hi (TMA→wgmma)", 2 * tile_bytes(bm, _HALF, 8), s),
                             SmemTerm("main B w_q packed (→regs)", tile_bytes(bn, _HALF, 8), s - 1)]
        b_half = tile_bytes(bn, _HALF, 8)
    else:
        half = group_size // 2
        a_slots, terms = s - 1, [SmemTerm("main A x_q packed (→regs)", tile_bytes(bm, half, 8), s - 1),
                                 SmemTerm("main B w_q packed (→regs)", tile_bytes(bn, half, 8), s - 1)]
        b_half = tile_bytes(bn, half, 8)
    # one mbarrier per ring slot; the A ring's array is allocated first and padded to 16 bytes
    terms += [SmemTerm("barriers A ring", barrier_bytes(1), a_slots),
              SmemTerm("barrier array alignment", barrier_bytes(a_slots) % 16, 1),
              SmemTerm("barriers B ring", barrier_bytes(1), s - 1),
              SmemTerm("B unpacked half (wgmma)", b_half, 1)]
    terms += scale_ring_terms(cfg, fmt, scale_tma)
    return SmemLedger(tuple(terms), consumers=1, label=f"w4a4 v1 main loop {fmt} g{group_size} {bm}x{bn}x{s}"
                      + (" scale_tma" if scale_tma else ""))


def scale_ring_terms(cfg: KernelConfig, fmt: str, scale_tma: bool, variant: str = "standard") -> list[SmemTerm]:
    """What scale_tma adds (AOT-measured, Triton 3.6, sm_90).

    2l: u [1, BN] u8 feeds the dot's operand (q·u), so the pipeliner gives it a ring like the packed
    weights: ``num_stages − 1`` slots + one mbarrier each, the barrier array padded to 16 bytes.
    g64: the pipeliner does NOT ring x_scale / w_scale (they feed only the fp32 rescale, not a dot): each
    step waits on its own TMA load, one staging row reused by both — which in the standard and swap loops
    the allocator overlaps with other buffers (no extra bytes), in the expand loop not (one row + 2
    barriers). Empty without scale_tma and for 2l's expand loop (no u in it)."""
    if not scale_tma or (variant == "expand" and fmt == "int4_2l"):
        return []
    s, bm, bn = cfg.num_stages, cfg.block_m, cfg.block_n
    if fmt == "int4_2l":
        return [SmemTerm("scale ring u (TMA→regs)", tile_bytes(1, bn, 8), s - 1),
                SmemTerm("barriers u ring", barrier_bytes(1), s - 1),
                SmemTerm("u barrier array alignment", barrier_bytes(s - 1) % 16, 1)]
    if variant == "expand":
        return [SmemTerm("scale TMA staging row (not pipelined)", tile_bytes(1, max(bm, bn), 16), 1),
                SmemTerm("barriers scale staging", barrier_bytes(1), 2)]
    return []


def _barrier_arrays(*slots: int) -> int:
    """Bytes of mbarrier arrays allocated one after another: each padded to 16 B but the last."""
    sizes = [barrier_bytes(n) for n in slots]
    return sum(-(-b // 16) * 16 for b in sizes[:-1]) + sizes[-1]


def w4a4_expand_ledger(cfg: KernelConfig, fmt: str, group_size: int, scale_tma: bool = False) -> SmemLedger:
    """EXPAND main loop: B (pre-expanded 8-bit weights) goes TMA → wgmma, ``num_stages`` slots.
    2l: A too ([BM, BK] int8); A and B of a stage share one mbarrier. g64: A is the packed [BM, 32] tile,
    unpacked in registers (``num_stages − 1`` slots), B two [BN, 32] boxes (lo, hi: one barrier) per
    packing block, G/64 blocks per step; barrier arrays B (per block) then A (per block)."""
    bm, bn, s = cfg.block_m, cfg.block_n, cfg.num_stages
    if fmt == "int4_2l":
        bk = cfg.block_k
        terms = [SmemTerm("expand A x_q int8 (TMA→wgmma)", tile_bytes(bm, bk, 8), s),
                 SmemTerm("expand B w int8 (TMA→wgmma)", tile_bytes(bn, bk, 8), s),
                 SmemTerm("barriers A+B ring (shared)", barrier_bytes(1), s)]
    else:
        q = group_size // PACK_BLOCK
        terms = [SmemTerm("expand A x_q packed (→regs)", q * tile_bytes(bm, _HALF, 8), s - 1),
                 SmemTerm("expand B w lo+hi 8-bit (TMA→wgmma)", 2 * q * tile_bytes(bn, _HALF, 8), s),
                 SmemTerm("barrier arrays B, A (16-B padded)", _barrier_arrays(*([s] * q + [s - 1] * q)), 1)]
    terms += scale_ring_terms(cfg, fmt, scale_tma, "expand")
    return SmemLedger(tuple(terms), consumers=1, label=f"w4a4 v1 expand {fmt} g{group_size} {bm}x{bn}x{s}"
                      + (" scale_tma" if scale_tma else ""))


def w4a4_epilogue_ledger(cfg: KernelConfig, lowrank_bits: int = 16) -> SmemLedger:
    """Epilogue buffers (after the main loop, aliasing its space): the fp32 S tile's layout change
    into the wgmma A operand, then the lora_up tile (``lowrank_stages`` = 1: once per output tile).
    The two are live one after the other, so the epilogue needs the larger, not the sum."""
    terms = (SmemTerm("low-rank S tile fp32 (layout)", tile_bytes(cfg.block_m, cfg.block_r, 32), 1),
             SmemTerm("low-rank lora_up tile", tile_bytes(cfg.block_r, cfg.block_n, lowrank_bits),
                      cfg.lowrank_stages))
    return SmemLedger(terms, consumers=1, label=f"w4a4 v1 epilogue r{cfg.block_r}")


def swap_ksub(cfg: KernelConfig, fmt: str, group_size: int) -> int:
    """SWAP-AB K sub-steps per loop iteration: block_k / (G for g64, 64 for 2l), at least 1."""
    unit = group_size if fmt == "int4_g64" else PACK_BLOCK
    return max(1, cfg.block_k // unit)


def w4a4_swap_ledger(cfg: KernelConfig, fmt: str, group_size: int, scale_tma: bool = False) -> SmemLedger:
    """SWAP-AB main loop (block_m = tokens, block_n = weight rows). The weights are unpacked into wgmma's
    register A operand, so no unpacked weight buffer; 2l's activations go TMA → wgmma B directly; g64's
    packed activations are unpacked in registers and their half tile written back for wgmma B."""
    bm, bn, s = cfg.block_m, cfg.block_n, cfg.num_stages
    q = swap_ksub(cfg, fmt, group_size)  # TMA loads of each kind per step (one ring each)
    if fmt == "int4_2l":
        a_slots, terms = s, [SmemTerm("swap act e int8 lo+hi (TMA→wgmma B)", 2 * q * tile_bytes(bm, _HALF, 8), s),
                             SmemTerm("swap w_q packed (→regs, wgmma A)", q * tile_bytes(bn, _HALF, 8), s - 1)]
        extra = []
    else:
        half = group_size // 2
        a_slots, terms = s - 1, [SmemTerm("swap act packed (→regs)", q * tile_bytes(bm, half, 8), s - 1),
                                 SmemTerm("swap w_q packed (→regs, wgmma A)", q * tile_bytes(bn, half, 8), s - 1)]
        extra = [SmemTerm("act unpacked half (wgmma B)", tile_bytes(bm, half, 8), 1)]
    # one barrier array per TMA load site (ring of slots); g64: every array but the last padded to 16 B
    # (AOT-checked for q = 1, 2, 4). 2l with q > 1: the compiler's total moves by up to ~1.8 KB either way
    # around the terms (unexplained): a 2 KB slack keeps the ledger an upper bound.
    terms += [SmemTerm("barriers act ring", barrier_bytes(1), a_slots * (2 * q if fmt == "int4_2l" else q)),
              SmemTerm("barrier array alignment", barrier_bytes(a_slots) % 16, 1 if fmt == "int4_2l" else 2 * q - 1),
              SmemTerm("barriers w ring", barrier_bytes(1), (s - 1) * q)] + extra
    if fmt == "int4_2l" and q > 1:
        terms.append(SmemTerm("compiler slack (2l wide steps, unmodelled)", 2048, 1))
    terms += scale_ring_terms(cfg, fmt, scale_tma) if q == 1 else [
        SmemTerm(t.name, t.bytes_each, t.stages * q) for t in scale_ring_terms(cfg, fmt, scale_tma)]
    return SmemLedger(tuple(terms), consumers=1, label=f"w4a4 v1 swap_ab {fmt} g{group_size} {bm}x{bn}x{s}"
                      + (" scale_tma" if scale_tma else ""))


def _main_ledger(cfg: KernelConfig, fmt: str, group_size: int, variant: str = "standard",
                 scale_tma: bool = False) -> SmemLedger:
    led = {"swap_ab": w4a4_swap_ledger, "expand": w4a4_expand_ledger}.get(variant, w4a4_ledger)
    return led(cfg, fmt, group_size, scale_tma)


def predicted_shared(cfg: KernelConfig, fmt: str, group_size: int, has_lowrank: bool = True,
                     variant: str = "standard", scale_tma: bool = False) -> int:
    """What the compiler should report: main loop and epilogue do not overlap in time."""
    main = _main_ledger(cfg, fmt, group_size, variant, scale_tma).total()
    if not has_lowrank:
        return main
    return max(main, *(t.total(1) for t in w4a4_epilogue_ledger(cfg).terms))


def can_implement(cfg: KernelConfig, fmt: str, group_size: int, variant: str = "standard",
                  scale_tma: bool = False) -> bool:
    if fmt not in FORMATS or group_size not in GROUP_SIZES or variant not in VARIANTS:
        return False
    if cfg.split_k != 1:
        return False
    if variant == "swap_ab":
        if cfg.block_n < 64 or cfg.block_m > 64:
            return False  # the weight rows are wgmma's M (64 per warpgroup); tokens its N
    elif cfg.block_m < 64 or cfg.block_n < 16:
        return False  # wgmma needs 64 rows per warpgroup
    if variant == "expand" and fmt == "int4_2l" and cfg.block_k < 32:
        return False  # int8 wgmma's K is 32
    return _main_ledger(cfg, fmt, group_size, variant, scale_tma).fits() and w4a4_epilogue_ledger(cfg).fits()


@dataclass(frozen=True)
class W4A4Plan:
    """What launch_w4a4_v1 runs: kernel variant ("standard" | "swap_ab" | "expand"), tiles, and loop
    options (mma_fp8: g64 partials through fp8 e4m3 MMAs; prefetch: scale/multiplier loads one K step
    ahead; scale_tma: scale/multiplier rows through TMA in the pipeliner's ring, ``num_stages − 1`` steps
    ahead — replaces prefetch where it applies, falls back to it when a tensor is not 16-byte aligned).
    "expand" pre-expands the weights (kernels/w4_expand.py) and streams them into wgmma by TMA."""

    variant: str
    config: KernelConfig
    mma_fp8: bool = False
    prefetch: bool = True
    scale_tma: bool = False

    def to_dict(self) -> dict:
        return {"variant": self.variant, "config": self.config.to_dict(), "mma_fp8": self.mma_fp8,
                "prefetch": self.prefetch, "scale_tma": self.scale_tma}

    @classmethod
    def from_dict(cls, d: dict) -> "W4A4Plan":
        return cls(d["variant"], KernelConfig.from_dict(d["config"]), bool(d.get("mma_fp8", False)),
                   bool(d.get("prefetch", True)), bool(d.get("scale_tma", False)))


def _solve(base: KernelConfig, fmt: str, group_size: int, variant: str, r: int, max_stages: int,
           scale_tma: bool = False) -> KernelConfig:
    def build(main: int, low: int) -> SmemLedger:
        return _main_ledger(base.replace(num_stages=main, lowrank_stages=low), fmt, group_size, variant, scale_tma)

    main, _, _ = solve_stages(build, min_main=2, max_main=max_stages)
    cfg = base.replace(num_stages=main, lowrank_stages=1 if r else 0)
    w4a4_epilogue_ledger(cfg).check()
    return cfg


def swap_config(m: int, r: int, fmt: str, group_size: int, block_n: int = 128, max_stages: int = 8,
                block_k: int | None = None, num_warps: int = 4, scale_tma: bool = False) -> KernelConfig:
    """SWAP-AB tiles: tokens padded to a power of two in [16, 64] (the MMA's N), 128 weight rows
    (two wgmma M tiles per warpgroup), the deepest pipeline the ledger allows (≤ max_stages).
    ``block_k``: K per loop iteration (a multiple of G for g64 / of 64 for 2l; default one group)."""
    bm = min(64, max(16, next_pow2(max(m, 1))))
    unit = group_size if fmt == "int4_g64" else PACK_BLOCK
    bk = max(unit, (block_k or unit) // unit * unit)
    base = KernelConfig(block_m=bm, block_n=block_n, block_k=bk,
                        block_r=rank_block(r), group_m=1, num_warps=num_warps, persistent=True)
    return _solve(base, fmt, group_size, "swap_ab", r, max_stages, scale_tma)


def expand_config(r: int, fmt: str, group_size: int, block_m: int = 128, block_n: int | None = None,
                  block_k: int = 128, num_warps: int = 8, max_stages: int = 6, scale_tma: bool = False) -> KernelConfig:
    """EXPAND tiles (compute-bound M): 2l is a plain int8 TMA GEMM, 128×256×128 over two warpgroups like
    the DESIGN §2 probe that reached 1111–1158 TOPS; g64 keeps a second [BM, BN] partial for the group
    rescale, so 128×128 (a 128×256 fp32 acc + int32 partial would spill) and one group per step."""
    if block_n is None:
        block_n = 256 if fmt == "int4_2l" else 128
    bk = block_k if fmt == "int4_2l" else group_size
    base = KernelConfig(block_m=block_m, block_n=block_n, block_k=bk, block_r=rank_block(r), group_m=8,
                        num_warps=num_warps, persistent=True)
    return _solve(base, fmt, group_size, "expand", r, max_stages, scale_tma)


@functools.lru_cache(maxsize=1024)  # launch-path planning stays off the host critical path
def plan_w4a4(m: int, n: int, k: int, r: int, fmt: str, group_size: int, device=None,
              max_stages: int = 6) -> KernelConfig:
    """Tile by bucket, then the deepest main pipeline (then low-rank pipeline) the ledger allows.

    Decode (M ≤ 64): memory-bound, one 64-row block, narrow N tiles so ≥ 2 waves of tiles keep every SM
    streaming weights. Prefill: 128×128 tiles over two warpgroups (8 warps), 256-wide N when M is large.
    """
    block_r = rank_block(r)
    if m <= 64:
        base = KernelConfig(block_m=64, block_n=64, block_k=64, block_r=block_r, group_m=1, num_warps=4,
                            persistent=True)
        max_stages = 8
    elif m <= 256:
        base = KernelConfig(block_m=64, block_n=128, block_k=64, block_r=block_r, group_m=8, num_warps=4,
                            persistent=True)
    else:
        base = KernelConfig(block_m=128, block_n=128, block_k=64, block_r=block_r, group_m=8, num_warps=8,
                            persistent=True)
    base = base.replace(block_k=group_size if fmt == "int4_g64" else PACK_BLOCK)
    return _solve(base, fmt, group_size, "standard", r, max_stages)


# SWAP-AB up to this many tokens (decode; reasoning in _mainloop_swap_2l — pin otherwise via the table)
SWAP_AB_MAX_M = 64
TUNED_PATH = TUNED_DIR / "w4a4_h200.json"   # where the probe writes; read through tuned_file(...)


@functools.lru_cache(maxsize=8)
def load_tuned(path: str = str(TUNED_PATH)) -> tuple:
    """Tuned entries (written by ``scripts/probe_w4a4.py --write-tuned``), sorted by m_max:
    ``{"version": 1, "entries": [{"fmt", "group_size", "m_max" (null = ∞), "plan": W4A4Plan.to_dict()}]}`` (another
    version is refused: ``plan.tuned.read_table``)."""
    p = Path(path)
    if not p.exists():
        return ()
    entries = read_table(p).get("entries", [])
    return tuple(sorted(entries, key=lambda e: float("inf") if e.get("m_max") is None else e["m_max"]))


@functools.lru_cache(maxsize=1024)
def plan_w4a4_full(m: int, n: int, k: int, r: int, fmt: str, group_size: int, device=None) -> W4A4Plan:
    """Tuned table entry for (fmt, group_size, smallest m_max ≥ m) if any and implementable, else the
    heuristic: SWAP-AB for m ≤ SWAP_AB_MAX_M, the standard tiles above."""
    table = tuned_file("w4a4", device)
    for e in (load_tuned(str(table)) if table is not None else ()):
        if e["fmt"] == fmt and e.get("group_size", 64) == group_size and (e.get("m_max") is None or m <= e["m_max"]):
            plan = W4A4Plan.from_dict(e["plan"])
            cfg = plan.config.replace(block_r=rank_block(r), lowrank_stages=1 if r else 0)
            if plan.variant == "swap_ab":  # tokens tile follows m inside the bucket
                cfg = cfg.replace(block_m=min(64, max(16, next_pow2(max(m, 1)))))
            if can_implement(cfg, fmt, group_size, plan.variant, plan.scale_tma):
                return W4A4Plan(plan.variant, cfg, plan.mma_fp8 and fmt == "int4_g64", plan.prefetch, plan.scale_tma)
            break
    if m <= SWAP_AB_MAX_M:
        return W4A4Plan("swap_ab", swap_config(m, r, fmt, group_size))
    return W4A4Plan("standard", plan_w4a4(m, n, k, r, fmt, group_size, device))


# ---- launcher -------------------------------------------------------------------------------------

def launch_w4a4_v1(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt: str,
                   group_size: int, config: KernelConfig | None = None, mma_fp8: bool = False, *,
                   variant: str | None = None, prefetch: bool = True, plan: W4A4Plan | None = None,
                   scale_tma: bool = False) -> torch.Tensor:
    """Launch the v1 kernel (argument contract: module docstring). Returns ``out``.

    No ``config``/``plan``: :func:`plan_w4a4_full` decides everything. A ``config`` without ``variant``
    runs the standard kernel with it; ``plan`` overrides config/variant/mma_fp8/prefetch."""
    _expect(x_q.dtype != torch.float8_e4m3fn, _PRE_EXPANDED_V1)
    m, n = out.shape
    k = w_q.shape[1] * 2
    r = 0 if lowrank_act is None or lora_up is None else lowrank_act.shape[1]
    if plan is None:
        if config is None:
            plan = plan_w4a4_full(m, n, k, r, fmt, group_size, out.device)
            if mma_fp8:
                plan = W4A4Plan(plan.variant, plan.config, True, plan.prefetch, plan.scale_tma)
        else:
            plan = W4A4Plan(variant or "standard", config, mma_fp8, prefetch, scale_tma)
    cfg, swap, expand = plan.config, plan.variant == "swap_ab", plan.variant == "expand"
    if plan.variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {plan.variant!r}")
    two_level = fmt == "int4_2l"
    mma_fp8 = plan.mma_fp8 and not two_level and not swap
    if expand:
        # transient [N, K] 8-bit weights from torch's caching allocator: no host sync, graph-capturable
        w_x = expand_w4(w_q, w_mul, group_size, fmt, torch.float8_e4m3fn if mma_fp8 else torch.int8)
        kb = cfg.block_k if two_level else _HALF
        a_desc = TensorDescriptor.from_tensor(x_q, [cfg.block_m, kb])
        b_desc = TensorDescriptor.from_tensor(w_x, [cfg.block_n, kb])
    else:
        kb = _HALF if two_level else group_size // 2
        a_desc = TensorDescriptor.from_tensor(x_q, [cfg.block_m, kb])
        b_desc = TensorDescriptor.from_tensor(w_q, [cfg.block_n, kb])
    xs_desc, ws_desc, wu_desc = _scale_descs(plan, cfg, fmt, x_scale, w_scale, w_mul)
    tiles = cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n)
    progs = persistent_grid(tiles, out.device)
    ksub = swap_ksub(cfg, fmt, group_size) if swap else 1
    if k % (ksub * (group_size if not two_level else PACK_BLOCK)):
        ksub = 1  # K not a multiple of the wide step: one group per iteration (same result)
    wu = w_mul if two_level else w_q
    lr = lowrank_act if r else out
    up = lora_up if r else out
    launch(_w4a4_gemm_kernel, (progs,),
        a_desc, b_desc, x_scale, x_scale.stride(0), w_scale, w_scale.stride(0), wu, wu.stride(0),
        xs_desc, ws_desc, wu_desc,
        lr, lr.stride(0), up, up.stride(0), up.stride(1) if r else 1,
        bias if bias is not None else out, out, out.stride(0), out.stride(1),
        m, n, k, r, progs,
        TWO_LEVEL=two_level, G=group_size, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_R=cfg.block_r if r else 16, GROUP_M=cfg.group_m, HAS_LOWRANK=r > 0, HAS_BIAS=bias is not None,
        MMA_FP8=mma_fp8, SWAP_AB=swap, PREFETCH=plan.prefetch, KSUB=ksub,
        SCALE_TMA=ws_desc is not None or wu_desc is not None, XS_TMA=xs_desc is not None, EXPAND=expand, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


def _row_desc(t: torch.Tensor | None, box: int):
    """TMA descriptor with box [1, box] over a 2-D group-major tensor, or None where TMA's rules fail
    (base or row stride not 16-byte aligned: e.g. x_scale [K/G, M] with M % 8 != 0)."""
    if t is None or t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16 or box * t.element_size() < 16:
        return None
    return TensorDescriptor.from_tensor(t, [1, box])


def _scale_descs(plan: W4A4Plan, cfg: KernelConfig, fmt: str, x_scale, w_scale, w_mul):
    """(xs_desc, ws_desc, wu_desc) for plan.scale_tma; None for each tensor that stays on plain loads
    (no scale_tma, not used in the loop — 2l keeps t and s for the epilogue and its expand loop has no
    u —, or TMA's alignment rules fail for it: see _row_desc)."""
    if not plan.scale_tma or (plan.variant == "expand" and fmt == "int4_2l"):
        return None, None, None
    if fmt == "int4_2l":
        return None, None, _row_desc(w_mul, cfg.block_n)
    return _row_desc(x_scale, cfg.block_m), _row_desc(w_scale, cfg.block_n), None


# impl="auto" on CUDA: the Gluon v2 where its scale rows come by TMA (aligned M, N: gluon.w4a4_ws.scale_tma_ok),
# v1 elsewhere. Measured on the H200 (session 2, same process): v2 fc1 int4_2l 466 µs vs v1 1055, int4_g64
# 1203 vs 1915; M=64 decode 61 vs 105 (2l), 78 vs 140 (g64). Without TMA'd scales v2 loses (g64 4131 µs).
# Session 4: int4_g64 v2 runs its e4m3 path (gluon/w4a4_ws.py module doc): fc1 879 vs v1 1308, M=64 54 vs 86.
# A v2 that raises NotImplementedError for a problem falls back to v1.
AUTO_PREFERS_V2 = True
# impl="decode": gluon.w4a4_decode (int4_2l, M ≤ 64: swap-AB, weights as the register operand of wgmma, deep
# TMA ring of packed weights). H200, K=4096, N=28672, r=32 (probes/probe_decode_s3d, same process): GEMM 29.2 /
# 30.1 / 46.7 µs at M = 1 / 16 / 64 vs v2 68.3 / 63.9 / 56.2; so auto takes it for every int4_2l M ≤ 64
# (LOWRANK_GEMM_DECODE=0 turns it off). int4_g64 (probes/probe_decode_g64_s3): 44.2 / 45.1 / 97.6 µs vs v2
# 195.9 / 72.9 / 73.3 — the per-block rescale waits on every wgmma, which M = 64 tiles no longer hide — so M ≤ 16.
# Session 4 (e4m3 paths on both kernels, w4a4.md at 4abdfb4): g64 decode 31.1 / 33.6 µs at M = 1 / 16 and the
# decode kernel's 102.8 vs v2 54.2 at M = 64 keep that split.
AUTO_DECODE = True
AUTO_DECODE_MAX_M = {"int4_2l": 64, "int4_g64": 16}
# The GEMM op on packed int4_g64 operands builds the fp16 path's token operand with a kernel of its own
# (w4_expand.f16_act_operands) before the decode kernel: that pays up to 48 tokens, not at 64, where v2 stays (same
# process, graph µs, N = 28672, K = 4096, fp16 route vs v2: H100 (probes/s39d) M = 24 42.3 vs 51.5, 48 50.3 vs 51.7,
# 64 55.0 vs 52.2; H200 (probes/s38) 48 49.4 vs 51.0, 64 54.5 vs 51.2). The layer op hands act_quant's fp16 operands
# over (act_quant(out="f16")) and takes the fp16 route over decode_f16_default's whole range.
F16_PACKED_MAX_M = 48
IMPLS = ("auto", "v1", "v2", "decode", "gemv", "skinny")


def _use_decode(impl: str, x_q: torch.Tensor, n: int, fmt: str) -> bool:
    return _decode_route(impl, x_q.shape[0], n, fmt, x_q.device, x_q.dtype == torch.float8_e4m3fn)


def _decode_route(impl: str, m: int, n: int, fmt: str, device: torch.device, pre_expanded: bool = False) -> bool:
    if impl == "decode":
        return True
    if impl != "auto" or not AUTO_DECODE or device.type != "cuda" or n % 16:
        return False
    from .gluon.w4a4_decode import decode_enabled, decode_f16_default
    if fmt == "int4_g64" and (pre_expanded == "f16" or (not pre_expanded and decode_f16_default(m)
                                                        and m <= F16_PACKED_MAX_M)):
        return decode_enabled()             # the fp16 path: no per-group chain to lose to v2 (its 64-token tiles)
    return m <= AUTO_DECODE_MAX_M.get(fmt, 0) and decode_enabled()


_PRE_EXPANDED_V1 = ("pre-expanded e4m3 activations (act_quant(out='f8') / expand_act_f8) run only on the e4m3 paths "
                    "of the decode and v2 kernels; v1 takes packed int4 activations uint8 [M, K/2]")


def _packed_route(impl: str, name: str, fmt: str, device: torch.device, pre_expanded: bool,
                  fmts: tuple[str, ...] = ("int4_g64", )) -> bool | None:
    """The shared part of the GEMV / skinny routes: True when ``impl`` pins ``name`` (an error where it cannot run),
    False where ``auto`` cannot use it (a format not in ``fmts``, e4m3 activations, not CUDA), None: ask the kernel's
    rule."""
    if impl == name:
        _expect(fmt in fmts and not pre_expanded and device.type == "cuda",
                lambda: f"impl={name!r} runs {' / '.join(fmts)} on packed int4 (int4_2l: int8) activations on CUDA, got "
                f"fmt={fmt!r}{', pre-expanded e4m3 activations' if pre_expanded else ''} on {device}")
        return True
    if impl != "auto" or fmt not in fmts or pre_expanded or device.type != "cuda":
        return False
    return None


def _gemv_route(impl: str, m: int, n: int, fmt: str, device: torch.device, pre_expanded: bool) -> bool:
    from .w4a4_gemv import FORMATS, auto_gemv_max_m, gemv_enabled
    pinned = _packed_route(impl, "gemv", fmt, device, pre_expanded, FORMATS)
    if pinned is not None:
        return pinned
    return m <= auto_gemv_max_m(n) and gemv_enabled()


def _skinny_route(impl: str, m: int, n: int, fmt: str, device: torch.device, pre_expanded: bool) -> bool:
    pinned = _packed_route(impl, "skinny", fmt, device, pre_expanded)
    if pinned is not None:
        return pinned
    from .w4a4_skinny import AUTO_SKINNY_M, AUTO_SKINNY_MAX_N, skinny_enabled
    return AUTO_SKINNY_M[0] <= m <= AUTO_SKINNY_M[1] and n < AUTO_SKINNY_MAX_N and skinny_enabled()


def _route(impl: str, fmt: str, m: int, n: int, k: int, r: int, group_size: int, device: torch.device,
           x_scale, w_scale, w_mul, pre_expanded: bool = False) -> str:
    """The kernel the GEMM op runs: "gemv" | "skinny" | "decode" | "v2" | "v1" — the one place that decides, for the GEMM op
    and for the layer op's choice of act_quant output (:func:`_layer_wants_f8`). ``x_scale``: the packed
    activation scales (or a stand-in of their shape, dtype and contiguity: only their TMA-ability is judged);
    ``pre_expanded``: the activations are the e4m3 operands, which only the decode and v2 kernels take, (``"f16"``)
    the fp16 ones, which only the decode kernel takes, or (``"a8"``) per-token e4m3 ones, which only v2 takes."""
    if pre_expanded == "f16":
        _expect(fmt == "int4_g64" and _decode_route(impl, m, n, fmt, device, pre_expanded),
                lambda: f"fp16 activations (act_quant(out='f16')) run only on the decode kernel's fp16 path "
                f"(int4_g64, impl 'auto' on CUDA with N % 16 == 0, or 'decode'), got impl={impl!r}, fmt={fmt!r}, "
                f"N={n} on {device}")
        return "decode"
    if pre_expanded == "a8":
        _expect(fmt == "int4_g64" and impl in ("auto", "v2") and device.type == "cuda",
                lambda: f"per-token e4m3 activations (W4A8) run only on the v2 kernel (int4_g64, impl 'auto' or 'v2' on "
                f"CUDA), got impl={impl!r}, fmt={fmt!r} on {device}")
        return "v2"
    if _gemv_route(impl, m, n, fmt, device, pre_expanded):
        return "gemv"
    if _skinny_route(impl, m, n, fmt, device, pre_expanded):
        return "skinny"
    if _decode_route(impl, m, n, fmt, device, pre_expanded):
        return "decode"
    if pre_expanded:
        _expect(impl in ("auto", "v2") and device.type == "cuda", lambda: f"impl={impl!r} on {device}: {_PRE_EXPANDED_V1}")
        return "v2"
    v1_plan = None
    if impl == "auto" and device.type == "cuda" and fmt == "int4_2l":
        v1_plan = plan_w4a4_full(m, n, k, r, fmt, group_size, device)
    return "v1" if _launcher(impl, device, (x_scale, w_scale, w_mul, fmt), v1_plan) is launch_w4a4_v1 else "v2"


# The layer op asks act_quant for the e4m3 operands (one launch less: no expand_act_f8 inside the GEMM launcher)
# unless LOWRANK_GEMM_ACT_QUANT_F8=0 (read per call; else ACT_QUANT_F8_DEFAULT). H200 (probes/s5/probe_actquant_decode,
# int4_g64 layer, K=4096, N=28672): M = 1 / 16 / 64: 38.1 → 36.3, 39.7 → 37.6, 57.0 → 55.4 µs.
ACT_QUANT_F8_DEFAULT = True


def act_quant_f8_enabled() -> bool:
    return env_switch("LOWRANK_GEMM_ACT_QUANT_F8", ACT_QUANT_F8_DEFAULT)


def _layer_wants_f8(impl: str, fmt: str, m: int, n: int, k: int, r: int, group_size: int, device: torch.device,
                    scale_dtype: torch.dtype, w_scale: torch.Tensor) -> bool:
    """Whether the layer op asks act_quant for the e4m3 operands: only where the GEMM it dispatches to
    (:func:`_route`, judged on a stand-in of the packed scales act_quant would return) runs its e4m3 path —
    decode: ``decode_f8_default()``, v2: ``f8_default()`` — and takes them at no loss: v2 decides its scale TMA
    on what it is handed (``scale_tma_ok``), so it gets them only where xab qualifies whenever the packed
    scales would."""
    if fmt != "int4_g64" or not act_quant_f8_enabled():
        return False
    if _gemv_route(impl, m, n, fmt, device, False) or _skinny_route(impl, m, n, fmt, device, False):
        return False        # _route's first two answers take packed operands: no stand-in tensors to build
    ng = k // group_size
    packed = torch.empty((ng, m), dtype=scale_dtype, device="meta")
    kernel = _route(impl, fmt, m, n, k, r, group_size, device, packed, w_scale, None)
    if kernel == "decode":
        from .gluon.w4a4_decode import decode_f16_default, decode_f8_default
        return decode_f8_default() and not decode_f16_default(m)    # the fp16 path takes the packed pair
    if kernel == "v2":
        from .gluon.w4a4_ws import f8_default, scale_tma_ok
        xab = torch.empty((ng, 2, m), dtype=torch.float32, device="meta")
        return f8_default() and (scale_tma_ok(xab, w_scale, None, fmt) or not scale_tma_ok(packed, w_scale, None, fmt))
    return False


# The layer op has act_quant write the decode kernel's fp16 token operand itself (act_quant(out="f16"): one launch
# less than act_quant's packed pair + w4_expand.f16_act_operands) unless LOWRANK_GEMM_ACT_QUANT_F16=0 (read per call;
# else ACT_QUANT_F16_DEFAULT).
ACT_QUANT_F16_DEFAULT = True


def act_quant_f16_enabled() -> bool:
    return env_switch("LOWRANK_GEMM_ACT_QUANT_F16", ACT_QUANT_F16_DEFAULT)


def _layer_act_out(impl: str, fmt: str, m: int, n: int, k: int, r: int, group_size: int, device: torch.device,
                   scale_dtype: torch.dtype, w_scale: torch.Tensor) -> str:
    """act_quant's ``out`` for the layer op: "f16" where the GEMM is the decode kernel on its fp16 path
    (:func:`_decode_route` and ``decode_f16_default``; :func:`act_quant_f16_enabled`), else "f8" where
    :func:`_layer_wants_f8`, else "packed"."""
    if fmt == "int4_g64" and group_size % 64 == 0 and act_quant_f16_enabled() and impl in ("auto", "decode"):
        from .gluon.w4a4_decode import decode_f16_default
        if decode_f16_default(m) and not _gemv_route(impl, m, n, fmt, device, False) \
                and not _skinny_route(impl, m, n, fmt, device, False) and _decode_route(impl, m, n, fmt, device, "f16"):
            return "f16"
    return "f8" if _layer_wants_f8(impl, fmt, m, n, k, r, group_size, device, scale_dtype, w_scale) else "packed"


def _a8_decode_route(impl: str, m: int, n: int, device: torch.device) -> bool:
    """Whether a W4A8 layer (act_bits=8) of ``m`` tokens runs the decode kernel's fp16 path (its e4m3 codes as the
    fp16 token operand, ``act_quant_e4m3(out="f16")``) rather than v2's A8 route, whose per-call weight expansion
    and 128-token tiles cost ~140 µs at M ≤ 64, N = 28672 (H100, NOTES.md session 41): M ≤ the fp16 path's tile."""
    from .gluon.w4a4_decode import F16_MAX_M
    return m <= F16_MAX_M and _decode_route(impl, m, n, "int4_g64", device, "f16")


# W4A8 at M ≤ 16 on the decode kernel's e4m3 path (act_quant_e4m3(out="xab"): the token scale as every group's a/b
# row) instead of its fp16 path: on since session 44's H200 probe (N = 28672, K = 4096, layer graph µs fp16 → xab:
# M = 1 28.5 → 22.8, M = 4 28.9 → 23.7, M = 16 29.6 → 24.8; error against the spec 1.5e-4 → 1.8–2.3e-4, NOTES.md);
# LOWRANK_GEMM_A8_DECODE_XAB=1/0 overrides.
A8_DECODE_XAB_DEFAULT = True


def a8_decode_xab_enabled() -> bool:
    return env_switch("LOWRANK_GEMM_A8_DECODE_XAB", A8_DECODE_XAB_DEFAULT)


def _a8_act_out(impl: str, m: int, n: int, group_size: int, device: torch.device) -> str:
    """The W4A8 quantizer's output for the GEMM the layer runs next: "xab" (the decode kernel's e4m3 path: group 64,
    M ≤ its e4m3 tiles, :func:`a8_decode_xab_enabled`), "f16" (its fp16 path, :func:`_a8_decode_route`) or "e4m3"
    (v2's A8 route)."""
    if impl == "v2":
        return "e4m3"
    from .act_e4m3 import XAB_GROUP
    if (group_size == XAB_GROUP and m <= AUTO_DECODE_MAX_M["int4_g64"] and a8_decode_xab_enabled()
            and _decode_route(impl, m, n, "int4_g64", device, True)):
        return "xab"
    return "f16" if _a8_decode_route(impl, m, n, device) else "e4m3"


def _early_launch(impl: str, fmt: str, m: int, n: int, k: int, device: torch.device) -> bool | None:
    """act_quant's ``early_launch`` for the GEMM the layer op runs next: the GEMV's own choice
    (:func:`w4a4_gemv.act_quant_early_launch`), else act_quant's default (None)."""
    if _gemv_route(impl, m, n, fmt, device, False):
        from .w4a4_gemv import act_quant_early_launch
        return act_quant_early_launch(fmt, m, n, k)
    return None


def _launcher(impl: str, device: torch.device, scales: tuple | None = None, v1_plan=None):
    """``scales``: (x_scale, w_scale, w_mul, fmt) of the problem, ``v1_plan``: v1's plan for it (impl="auto")."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "v1" or (impl == "auto" and (device.type != "cuda" or not AUTO_PREFERS_V2)):
        return launch_w4a4_v1
    try:
        from .gluon.w4a4_ws import launch_w4a4_v2, scale_tma_ok, two_level_enabled
    except ImportError as err:
        if impl == "v2":
            raise NotImplementedError(f"impl='v2' needs kernels/gluon/w4a4_ws.py: {err}") from None
        return launch_w4a4_v1
    if impl == "auto" and scales is not None:
        fmt = scales[3]
        if not scale_tma_ok(*scales) or (fmt == "int4_2l" and not two_level_enabled()):
            return launch_w4a4_v1
        if v1_plan is not None and v1_plan.variant == "expand" and fmt == "int4_2l":
            # pre-expanded weights + a plain int8 TMA GEMM: fc1 349 + 25 µs vs v2 466 (session 2)
            return launch_w4a4_v1
    return launch_w4a4_v2


# ---- validation -----------------------------------------------------------------------------------

def _expect(ok: bool, what) -> None:
    """Raise ValueError("w4a4: " + what) unless ``ok``. ``what``: the message, or a callable building it — the
    checks run on every eager call, and an f-string with shapes in it costs a microsecond even when nothing fails."""
    if not ok:
        raise ValueError(f"w4a4: {what() if callable(what) else what}")


def _shape(t: torch.Tensor | None) -> list | None:
    return None if t is None else list(t.shape)


def check_gemm_args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, group_size: int,
                    fmt: str) -> tuple[int, int, int, int]:
    """Validate the launcher contract; returns (M, N, K, r). Errors say expected vs got."""
    _expect(fmt in FORMATS, lambda: f"fmt must be one of {FORMATS}, got {fmt!r}")
    _expect(group_size in GROUP_SIZES, lambda: f"group_size must be one of {GROUP_SIZES}, got {group_size}")
    _expect(w_q.dtype == torch.uint8 and w_q.dim() == 2,
            lambda: f"qweight must be uint8 [N, K/2] (packed int4), got {w_q.dtype} {_shape(w_q)}")
    n, k = w_q.shape[0], 2 * w_q.shape[1]
    _expect(k % PACK_BLOCK == 0 and k % group_size == 0,
            lambda: f"K={k} (from qweight [N, K/2]) must be a multiple of {PACK_BLOCK} and of group_size={group_size}")
    _expect(k <= MAX_K, lambda: f"K={k} exceeds {MAX_K} (int32 accumulation could overflow)")
    ng = k // group_size
    if fmt == "int4_g64" and x_q.dtype == torch.float8_e4m3fn:   # pre-expanded (module docstring)
        _expect(x_q.dim() == 2 and x_q.shape[1] == k,
                lambda: f"pre-expanded activations must be float8_e4m3fn [M, {k}], got {x_q.dtype} {_shape(x_q)}")
        m = x_q.shape[0]
        _expect((x_scale.shape == (ng, 2, m) or x_scale.shape == (m, )) and x_scale.dtype == torch.float32,
                lambda: f"e4m3 activations come with xab float32 [K/G, 2, M] = {[ng, 2, m]} (int4 codes: "
                f"act_quant(out='f8') / expand_act_f8) or a per-token scale float32 [M] = [{m}] (W4A8: "
                f"kernels.act_e4m3.act_quant_e4m3), got {x_scale.dtype} {_shape(x_scale)}")
        _expect(w_scale.shape == (ng, n) and w_scale.dtype in (torch.bfloat16, torch.float16),
                lambda: f"wscales must be bf16/fp16 [K/G, N] = {[ng, n]}, got {w_scale.dtype} {_shape(w_scale)}")
        _expect(w_mul is None, "w_mul is only used by fmt='int4_2l'")
    elif fmt == "int4_g64" and x_q.dtype == torch.float16:        # the decode kernel's fp16 operands
        _expect(x_q.dim() == 2 and x_q.shape[1] == k,
                lambda: f"fp16 activations must be float16 [M, {k}] (act_quant(out='f16')), got {_shape(x_q)}")
        m = x_q.shape[0]
        _expect(x_scale.shape == (m, ) and x_scale.dtype == torch.float32,
                lambda: f"fp16 activations come with t float32 [M] = [{m}] (act_quant(out='f16') / "
                f"f16_act_operands), got {x_scale.dtype} {_shape(x_scale)}")
        _expect(w_scale.shape == (ng, n) and w_scale.dtype in (torch.bfloat16, torch.float16),
                lambda: f"wscales must be bf16/fp16 [K/G, N] = {[ng, n]}, got {w_scale.dtype} {_shape(w_scale)}")
        _expect(w_mul is None, "w_mul is only used by fmt='int4_2l'")
    elif fmt == "int4_g64":
        _expect(x_q.dtype == torch.uint8 and x_q.dim() == 2 and x_q.shape[1] == k // 2,
                lambda: f"activations must be uint8 [M, {k // 2}] (packed int4; or float8_e4m3fn [M, {k}] / float16 "
                f"[M, {k}] pre-expanded), "
                f"got {x_q.dtype} {_shape(x_q)}")
        m = x_q.shape[0]
        _expect(x_scale.shape == (ng, m) and x_scale.dtype in (torch.bfloat16, torch.float16),
                lambda: f"activation scales must be bf16/fp16 [K/G, M] = {[ng, m]}, got {x_scale.dtype} {_shape(x_scale)}")
        _expect(w_scale.shape == (ng, n) and w_scale.dtype == x_scale.dtype,
                lambda: f"wscales must be {x_scale.dtype} [K/G, N] = {[ng, n]}, got {w_scale.dtype} {_shape(w_scale)}")
        _expect(w_mul is None, "w_mul is only used by fmt='int4_2l'")
    else:
        _expect(x_q.dtype == torch.int8 and x_q.dim() == 2 and x_q.shape[1] == k,
                lambda: f"int4_2l activations must be int8 [M, {k}] (expanded q·v), got {x_q.dtype} {_shape(x_q)}")
        m = x_q.shape[0]
        _expect(x_scale.shape == (m,) and x_scale.dtype == torch.float32,
                lambda: f"int4_2l activation scales must be float32 [M] = [{m}], got {x_scale.dtype} {_shape(x_scale)}")
        _expect(w_scale.shape == (n,) and w_scale.dtype == torch.float32,
                lambda: f"int4_2l wscales must be float32 [N] = [{n}], got {w_scale.dtype} {_shape(w_scale)}")
        _expect(w_mul is not None and w_mul.dtype == torch.uint8 and w_mul.shape == (ng, n),
                lambda: f"int4_2l w_mul must be uint8 [K/G, N] = {[ng, n]}, got "
                f"{None if w_mul is None else w_mul.dtype} {_shape(w_mul)}")
    r = 0
    if lowrank_act is not None or lora_up is not None:
        _expect(lowrank_act is not None and lora_up is not None, "lowrank_act and lora_up come together")
        r = lora_up.shape[1] if lora_up.dim() == 2 else -1
        _expect(lora_up.dim() == 2 and lora_up.shape[0] == n and lora_up.dtype in (torch.bfloat16, torch.float16),
                lambda: f"lora_up must be bf16/fp16 [N={n}, r], got {lora_up.dtype} {_shape(lora_up)}")
        _expect(lowrank_act.shape == (m, r) and lowrank_act.dtype == torch.float32,
                lambda: f"lowrank_act must be float32 [M, r] = {[m, r]}, got {lowrank_act.dtype} {_shape(lowrank_act)}")
    if bias is not None:
        _expect(bias.shape == (n,) and bias.is_floating_point(), lambda: f"bias must be float [{n}], got {bias.dtype} "
                f"{_shape(bias)}")
    tensors = [t for t in (x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias) if t is not None]
    devs = {t.device for t in tensors}
    _expect(len(devs) == 1, lambda: f"all tensors must be on one device, got {sorted(map(str, devs))}")
    _expect(all(t.is_contiguous() for t in tensors), "all tensors must be contiguous")
    return m, n, k, r


def check_packed_launch(who: str, x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt: str,
                        group_size: int, col_scale, word_bytes: int,
                        two_level: bool = False, dims: tuple | None = None) -> tuple[int, int, int, int]:
    """The launcher contract of the kernels that read packed int4 activations as words (the GEMV, the skinny GEMM):
    :func:`check_gemm_args`, then int4_g64 on packed activations (``two_level``: or int4_2l on its int8 ones),
    ``out`` [M, N], ``col_scale`` [N], and x_q / w_q contiguous and ``word_bytes``-aligned. Errors name ``who``;
    returns (M, N, K, r)."""
    def need(ok, what):
        _expect(ok, lambda: f"{who}: {what() if callable(what) else what}")
    if two_level and fmt == "int4_2l":
        need(x_q.dtype == torch.int8, lambda: f"int4_2l activations must be int8 [M, K], got {x_q.dtype}")
    else:
        need(fmt in ("int4_g64", "int4_g"), lambda: f"runs the standard format int4_g64"
                                            f"{' or int4_2l' if two_level else ''}, got fmt={fmt!r}")
        need(x_q.dtype == torch.uint8, lambda: f"activations must be packed int4 uint8 [M, K/2] (not the pre-expanded e4m3 "
                                       f"operands), got {x_q.dtype}")
    # dims: (M, N, K, r) from the caller's own check_gemm_args of these tensors (the GEMM op's body) — not twice
    m, n, k, r = dims or check_gemm_args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, group_size,
                                         fmt)
    dev = x_q.device
    need(m >= 1, lambda: f"needs at least one token, got M={m}")
    need(out.dtype in (torch.bfloat16, torch.float16, torch.float32) and tuple(out.shape) == (m, n)
         and out.stride(1) == 1 and out.device == dev,
         lambda: f"out must be bf16/fp16/fp32 [M, N] = {[m, n]} with unit column stride on {dev}, got {out.dtype} "
         f"{list(out.shape)} on {out.device}")
    need(col_scale is None or (tuple(col_scale.shape) == (n, ) and col_scale.device == dev),
         lambda: f"col_scale must be [N={n}] on {dev}, got {None if col_scale is None else list(col_scale.shape)}")
    for name, t in (("x_q", x_q), ("w_q", w_q)):
        need(t.is_contiguous() and t.data_ptr() % word_bytes == 0,
             lambda: f"{name} must be contiguous and {word_bytes}-byte aligned (read as {word_bytes}-byte words)")
    return m, n, k, r


def check_linear_args(x, qweight, wscales, smooth, lora_down, lora_up, bias, wmul, group_size: int, fmt: str,
                      act_shift=None):
    """Validate the layer op's inputs; returns (K, N, r)."""
    _expect(x.dtype in (torch.bfloat16, torch.float16), lambda: f"x must be bf16/fp16, got {x.dtype}")
    k = x.shape[-1]
    _expect(qweight.dim() == 2 and qweight.shape[1] * 2 == k,
            lambda: f"qweight must be uint8 [N, K/2] with K = x.shape[-1] = {k}, got {qweight.dtype} {_shape(qweight)}")
    _expect(k % PACK_BLOCK == 0 and k % group_size == 0,
            lambda: f"K={k} must be a multiple of {PACK_BLOCK} and of group_size={group_size}")
    _expect(smooth.shape == (k,) and smooth.is_floating_point(), lambda: f"smooth must be float [K={k}], got "
            f"{smooth.dtype} {_shape(smooth)}")
    r = lora_down.shape[0]
    _expect(lora_down.dim() == 2 and lora_down.shape[1] == k and lora_down.is_floating_point(),
            lambda: f"lora_down must be float [r, K={k}], got {lora_down.dtype} {_shape(lora_down)}")
    _expect(lora_up.dim() == 2 and lora_up.shape == (qweight.shape[0], r),
            lambda: f"lora_up must be [N={qweight.shape[0]}, r={r}], got {_shape(lora_up)}")
    devs = {t.device for t in (x, qweight, wscales, smooth, lora_down, lora_up) if t is not None}
    _expect(len(devs) == 1, lambda: f"all tensors must be on one device, got {sorted(map(str, devs))}")
    _expect(x.is_contiguous() and smooth.is_contiguous() and lora_down.is_contiguous(),
            "x, smooth and lora_down must be contiguous")
    if act_shift is not None:
        _expect(fmt == "int4_g64" and group_size % 64 == 0 and wmul is None,
                lambda: f"act_shift (unsigned activations) runs the int4_g64 format with a group size that is a "
                        f"multiple of 64 (its e4m3 GEMM paths), got fmt={fmt!r}, group_size={group_size}")
        _expect(act_shift.dtype == torch.float32 and act_shift.shape == (k,) and act_shift.device == x.device,
                lambda: f"act_shift must be float32 [K={k}] on {x.device} (formats.int4.act_shift_vector), got "
                        f"{act_shift.dtype} {_shape(act_shift)} on {act_shift.device}")
    return k, qweight.shape[0], r


# ---- public ops -----------------------------------------------------------------------------------

@torch.library.custom_op("lowrank_gemm::w4a4_gemm", mutates_args=())
def _w4a4_gemm_op(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                  w_mul: Optional[torch.Tensor], lowrank_act: Optional[torch.Tensor],
                  lora_up: Optional[torch.Tensor], bias: Optional[torch.Tensor], group_size: int, fmt: str,
                  out_dtype: torch.dtype, impl: str) -> torch.Tensor:
    return _w4a4_gemm_impl(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, group_size, fmt, out_dtype,
                           impl)


def _w4a4_gemm_impl(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, group_size: int, fmt: str,
                    out_dtype: torch.dtype, impl: str) -> torch.Tensor:
    """The GEMM op's body (validate, route, launch); eager calls on plain tensors run it without the custom-op
    dispatch (:func:`lora_gemm._direct_ok`)."""
    m, n, k, r = check_gemm_args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, group_size, fmt)
    out = torch.empty((m, n), device=x_q.device, dtype=out_dtype)
    if m == 0:
        return out
    args = (x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt, group_size, None)
    pre_expanded = ("f16" if x_q.dtype == torch.float16 else "a8" if x_q.dtype == torch.float8_e4m3fn and x_scale.dim() == 1
                    else x_q.dtype == torch.float8_e4m3fn)
    kernel = _route(impl, fmt, m, n, k, r, group_size, x_q.device, x_scale, w_scale, w_mul, pre_expanded)
    if kernel in ("gemv", "skinny"):      # packed-activation kernels: no config argument
        from .w4a4_gemv import launch_w4a4_gemv
        from .w4a4_skinny import launch_w4a4_skinny
        (launch_w4a4_gemv if kernel == "gemv" else launch_w4a4_skinny)(*args[:11], _dims=(m, n, k, r))
        return out
    # e4m3 activations run the e4m3 path whatever its env default says (the int8 path cannot read them)
    f8 = dict(f16=True) if pre_expanded == "f16" else dict(f8=True) if pre_expanded else {}
    if kernel == "decode":
        from .gluon.w4a4_decode import launch_w4a4_decode
        launch_w4a4_decode(*args, _dims=(m, n, k, r), **f8)
        return out
    if kernel == "v2":
        from .gluon.w4a4_ws import launch_w4a4_v2
        launcher = functools.partial(launch_w4a4_v2, _dims=(m, n, k, r), **f8)
    else:
        launcher = launch_w4a4_v1
    try:
        launcher(*args)
    except NotImplementedError:
        if impl != "auto" or kernel != "v2" or pre_expanded:
            raise
        launch_w4a4_v1(*args)
    return out


@_w4a4_gemm_op.register_fake
def _(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, group_size, fmt, out_dtype, impl):
    return x_q.new_empty((x_q.shape[0], w_q.shape[0]), dtype=out_dtype)


def w4a4_gemm(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
              lowrank_act: torch.Tensor | None = None, lora_up: torch.Tensor | None = None,
              bias: torch.Tensor | None = None, *, w_mul: torch.Tensor | None = None, group_size: int = 64,
              fmt: str = "int4_g64", out_dtype: torch.dtype = torch.bfloat16, impl: str = "auto") -> torch.Tensor:
    """The W4A4 GEMM alone on quantized operands (layouts: module docstring) → y [M, N] in ``out_dtype``.

    ``lowrank_act`` [M, r] fp32 and ``lora_up`` [N, r] add ``lowrank_act · lora_upᵀ`` in the epilogue.
    int4_g64 also takes act_quant's pre-expanded e4m3 operands (``out="f8"``): they run on the decode or v2
    kernel (impl "auto", "decode", "v2"), never on v1; and its fp16 ones (``out="f16"``): the decode kernel only.
    """
    _expect(out_dtype in (torch.bfloat16, torch.float16, torch.float32),
            lambda: f"out_dtype must be bf16, fp16 or fp32, got {out_dtype}")
    op = _w4a4_gemm_impl if _direct_ok(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias) else _w4a4_gemm_op
    return op(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, group_size, fmt, out_dtype, impl)


@torch.library.custom_op("lowrank_gemm::w4a4_linear", mutates_args=())
def _w4a4_linear_op(x: torch.Tensor, qweight: torch.Tensor, wscales: torch.Tensor, smooth: torch.Tensor,
                    lora_down: torch.Tensor, lora_up: torch.Tensor, bias: Optional[torch.Tensor],
                    wmul: Optional[torch.Tensor], group_size: int, fmt: str, out_dtype: torch.dtype,
                    impl: str, act_shift: Optional[torch.Tensor] = None, act_bits: int = 4) -> torch.Tensor:
    return _w4a4_linear_impl(x, qweight, wscales, smooth, lora_down, lora_up, bias, wmul, group_size, fmt, out_dtype,
                             impl, act_shift, act_bits)


def _w4a4_linear_impl(x, qweight, wscales, smooth, lora_down, lora_up, bias, wmul, group_size: int, fmt: str,
                      out_dtype: torch.dtype, impl: str, act_shift=None, act_bits: int = 4) -> torch.Tensor:
    """The layer op's body: act_quant, then the GEMM's body (no nested op dispatch)."""
    k, n, r = check_linear_args(x, qweight, wscales, smooth, lora_down, lora_up, bias, wmul, group_size, fmt,
                                act_shift)
    x2 = x.reshape(-1, k)
    scale_dtype = wscales.dtype if fmt == "int4_g64" else torch.bfloat16
    if act_bits == 8:
        _expect(fmt == "int4_g64" and act_shift is None and impl in ("auto", "v2", "decode")
                and x.device.type == "cuda",
                lambda: f"act_bits=8 (per-token e4m3 activations) runs int4_g64 weights, signed, on the v2 kernel or "
                        f"(M ≤ 64) the decode kernel (impl 'auto', 'v2' or 'decode', CUDA), got fmt={fmt!r}, "
                        f"act_shift={act_shift is not None}, impl={impl!r} on {x.device}")
        from .act_e4m3 import act_quant_e4m3
        out = _a8_act_out(impl, x2.shape[0], n, group_size, x.device)
        x8, t, lowrank_act = act_quant_e4m3(x2, smooth, lora_down, group_size, out=out)     # xab: t is the rows
        y = _w4a4_gemm_impl(x8, t, qweight, wscales, None, lowrank_act, lora_up if r else None, bias, group_size,
                            fmt, out_dtype, impl)
        return y.reshape(*x.shape[:-1], n)
    _expect(act_bits == 4, lambda: f"act_bits must be 4 or 8, got {act_bits}")
    if act_shift is not None:
        from .act_quant import act_quant_shifted
        x8, xab, lowrank_act = act_quant_shifted(x2, smooth, lora_down, act_shift, group_size, scale_dtype)
        y = _w4a4_gemm_impl(x8, xab, qweight, wscales, None, lowrank_act if r else None, lora_up if r else None, bias,
                            group_size, fmt, out_dtype, impl)
        return y.reshape(*x.shape[:-1], n)
    x_q, x_scale, lowrank_act = act_quant(x2, smooth, lora_down, group_size, fmt, scale_dtype,
                                          out=_layer_act_out(impl, fmt, x2.shape[0], n, k, r, group_size, x.device,
                                                             scale_dtype, wscales),
                                          early_launch=_early_launch(impl, fmt, x2.shape[0], n, k, x.device))
    y = _w4a4_gemm_impl(x_q, x_scale, qweight, wscales, wmul, lowrank_act if r else None,
                        lora_up if r else None, bias, group_size, fmt, out_dtype, impl)
    return y.reshape(*x.shape[:-1], n)




@_w4a4_linear_op.register_fake
def _(x, qweight, wscales, smooth, lora_down, lora_up, bias, wmul, group_size, fmt, out_dtype, impl, act_shift=None,
      act_bits=4):
    return x.new_empty((*x.shape[:-1], qweight.shape[0]), dtype=out_dtype)


def w4a4_linear(x: torch.Tensor, qweight: torch.Tensor, wscales: torch.Tensor, smooth: torch.Tensor,
                lora_down: torch.Tensor, lora_up: torch.Tensor, bias: torch.Tensor | None = None,
                group_size: int = 64, fmt: str = "int4_g64", impl: str = "auto", *,
                wmul: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                act_shift: torch.Tensor | None = None, act_bits: int = 4) -> torch.Tensor:
    """SVDQuant W4A4 layer: ``y = W4A4(x/λ) + ((x/λ)·lora_downᵀ)·lora_upᵀ + bias``, x [..., K] → [..., N].

    int4_g64: qweight uint8 [N, K/2], wscales 16-bit [K/G, N]. int4_2l: qweight uint8 [N, K/2],
    wscales fp32 [N] (s), wmul uint8 [K/G, N] (u), from ``formats.int4_twolevel.pack_weight_2l``.
    smooth [K]; lora_down [r, K] applies to x/λ; lora_up [N, r] (r may be 0). Output dtype: x's unless
    ``out_dtype``. NaN/Inf in a group of x make that group's scale NaN/Inf: the row's outputs are NaN.
    ``act_shift`` (float32 [K], ``formats.int4.act_shift_vector(c, smooth)``; int4_g64): unsigned activations,
    codes of x/λ + act_shift (``reference.svdq_linear_ref``), on the e4m3 GEMM paths (decode / v2; impl "auto",
    "decode" or "v2"). ``bias`` must then already hold −Q(W)·act_shift: the kernels add it as given
    (``SVDQLinear.kernel_bias`` keeps that fold).
    ``act_bits=8`` (int4_g64): per-token e4m3 activations instead (W4A8, ``reference.svdq_linear_ref(act_bits=8)``;
    ``kernels.act_e4m3`` quantizes), on CUDA: the decode kernel's fp16 path for M ≤ 64 (impl "auto" or "decode",
    :func:`_a8_decode_route`), else the v2 kernel's A8 route (impl "auto" or "v2").
    """
    out_dtype = out_dtype or x.dtype
    _expect(out_dtype in (torch.bfloat16, torch.float16, torch.float32),
            lambda: f"out_dtype must be bf16, fp16 or fp32, got {out_dtype}")
    op = (_w4a4_linear_impl if _direct_ok(x, qweight, wscales, smooth, lora_down, lora_up, bias, wmul, act_shift)
          else _w4a4_linear_op)
    return op(x, qweight, wscales, smooth, lora_down, lora_up, bias, wmul, group_size, fmt, out_dtype, impl, act_shift,
              act_bits)


def svdq_forward_cuda(layer, x: torch.Tensor) -> torch.Tensor:
    """``SVDQLinear`` forward through the kernels (install: ``layer._forward_kernel = svdq_forward_cuda``).

    W4A16 layers (act_bits 16) and float32/float64 inputs fall back to the layer's reference path; act_bits 8 runs
    the W4A8 path (per-token e4m3 activations); int4_2l layers (``weight_format``) the two-level kernels.
    """
    if layer.act_bits not in (4, 8) or x.dtype not in (torch.bfloat16, torch.float16):
        return layer.forward_reference(x)
    if getattr(layer, "weight_format", "int4_g64") == "int4_2l":
        _expect(layer.act_bits == 4, lambda: f"an int4_2l layer runs two-level int4 activations (act_bits 4, or 16 "
                f"on the reference path), got act_bits={layer.act_bits}")
        return w4a4_linear(x.contiguous(), layer.qweight, layer.wscales, layer.smooth, layer.lora_down,
                           layer.lora_up, layer.bias, layer.group_size, fmt="int4_2l", wmul=layer.wmul)
    if layer.act_bits == 8:
        return w4a4_linear(x.contiguous(), layer.qweight, layer.wscales, layer.smooth, layer.lora_down,
                           layer.lora_up, layer.bias, layer.group_size, act_bits=8)
    # (signed layers: kernel_bias() is the bias itself and act_shift_vec() None)
    return w4a4_linear(x.contiguous(), layer.qweight, layer.wscales, layer.smooth, layer.lora_down,
                       layer.lora_up, layer.kernel_bias(), layer.group_size, act_shift=layer.act_shift_vec())


# ---- ahead-of-time compile (CI: PTX and shared-memory checks without a GPU) --------------------------

def aot_compile(cfg: KernelConfig, fmt: str = "int4_g64", group_size: int = 64, has_lowrank: bool = True,
                out: str = "bf16", mma_fp8: bool = False, variant: str = "standard", prefetch: bool = True,
                scale_tma: bool = False):
    """Compile the v1 kernel for sm_90 with ``cfg`` → ``aot.CompiledInfo`` (ptx, shared, num_warps)."""
    from .aot import compile_sm90
    two_level = fmt == "int4_2l"
    expand = variant == "expand"
    mma_fp8 = mma_fp8 and not two_level and variant != "swap_ab"
    if expand:
        kb = cfg.block_k if two_level else _HALF
        b_ty = "fp8e4nv" if mma_fp8 else "i8"
    else:
        kb = _HALF if two_level else group_size // 2
        b_ty = "u8"
    sc = "fp32" if two_level else "bf16"
    scale_tma = scale_tma and not (expand and two_level)
    sig = {"a_desc": f"tensordesc<{'i8' if two_level else 'u8'}[{cfg.block_m},{kb if two_level or not expand else _HALF}]>",
           "b_desc": f"tensordesc<{b_ty}[{cfg.block_n},{kb}]>",
           "xs_ptr": f"*{sc}", "stride_xsg": "i32", "ws_ptr": f"*{sc}", "stride_wsg": "i32",
           "wu_ptr": "*u8", "stride_wug": "i32", "lr_ptr": "*fp32", "stride_lm": "i32",
           "up_ptr": "*bf16", "stride_un": "i32", "stride_ur": "i32", "bias_ptr": "*fp32",
           "y_ptr": f"*{out}", "stride_ym": "i32", "stride_yn": "i32",
           "M": "i32", "N": "i32", "K": "i32", "R": "i32", "num_progs": "i32"}
    consts = {"TWO_LEVEL": two_level, "G": group_size, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
              "BLOCK_R": cfg.block_r, "GROUP_M": cfg.group_m, "HAS_LOWRANK": has_lowrank, "HAS_BIAS": True,
              "MMA_FP8": mma_fp8, "SWAP_AB": variant == "swap_ab", "PREFETCH": prefetch and not scale_tma,
              "KSUB": swap_ksub(cfg, fmt, group_size) if variant == "swap_ab" else 1,
              "SCALE_TMA": scale_tma, "XS_TMA": scale_tma and not two_level, "EXPAND": expand,
              "BLOCK_K": cfg.block_k}
    descs = {"xs_desc": None, "ws_desc": None, "wu_desc": None}
    if scale_tma and two_level:
        descs["wu_desc"] = f"tensordesc<u8[1,{cfg.block_n}]>"
    elif scale_tma:
        descs.update(xs_desc=f"tensordesc<bf16[1,{cfg.block_m}]>", ws_desc=f"tensordesc<bf16[1,{cfg.block_n}]>")
    for name, ty in descs.items():
        if ty is None:
            consts[name] = None
        else:
            sig[name] = ty
    return compile_sm90(__name__, "_w4a4_gemm_kernel", sig, consts, num_warps=cfg.num_warps,
                        num_stages=cfg.num_stages)
