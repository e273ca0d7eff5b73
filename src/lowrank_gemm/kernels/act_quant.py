"""Activation quantization for the W4A4 layer: one pass over X does the smoothing divide, the 4-bit
quantization and the low-rank down-projection ``S = (X / λ) · Aᵀ``.

Work is split over (row block, K slice) programs so a decode row (M = 1: one row block) is still
spread over ~2 programs per SM; v1 walked all of K in ONE program per row block, a serial chain of
~K/64 dependent load→dot steps (hundreds of µs at M = 1). Each slice writes an fp32 S partial; a tiny
kernel sums them in slice order (deterministic, no atomics). With one slice S is written directly.
Decode (M ≤ 64) defaults to ``fused``: all of it in ONE launch (S programs + quant units). Its S
programs either split K (the last of a row block to arrive, elected by an int32 ticket, sums the partials
in a fixed order: ``s_ranks=0``, the default above M = 16) or split the rank (``s_ranks ≥ 1``: each owns
a few rows × ranks over all of K — no partials, no ticket; the default for M ≤ 16).
Each program step covers BLOCK_K columns (whole groups; 128 at large M): per-group maxima come from a
[BM, BLOCK_K/G, ·] reshape, so the step count per program is K/BLOCK_K (see :func:`plan_act_quant`).
Formats (``formats``):

- ``int4_g64`` (standard): packed int4 [M, K/2] in the :func:`formats.int4.pack_int4` layout and 16-bit
  group-major scales [K/G, M], bit-identical to ``quantize_act_int4(x / λ, G)``.
- ``int4_2l`` (two-level): expanded int8 ``q·v`` [M, K] and a float32 row scale [M], bit-identical to
  ``quantize_act_2l(x / λ, G)``. The row scale needs the whole row first: pass 1 (per slice) writes
  partial row absmax and S; pass 2 (per slice) reduces the absmax partials and re-reads its X slice.

Numerics shared with the torch quantizers: divisions are IEEE round-to-nearest (``div_rn``, not the
approximate GPU divide), rounding is half-to-even, a 16-bit scale is rounded before it is used. NaN/Inf
in a group (g64) or row (2l) gives that scale NaN/Inf and zero q, so the row's GEMM outputs are NaN.
S is accumulated with split-TF32 MMAs (xs = hi + lo, ≈ fp32) so it matches the float64 spec to ~1e-6.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .env import getenv, interpreting
from .epilogue import rank_block
from .launch import launch
from .pdl import gdc_launch_dependents, gdc_wait, pdl_enabled
from .persistent import capturing, persistent_zeros
from .schedule import cdiv, next_pow2, num_sms
from .tma import tma_ready
from .w4_expand import (act_f8_rows, e4m3_codes, e4m3_operands, expand_act_f8, f16_column, f16_row_exponent,
                        f16_row_power, f16_scaled_down)

__all__ = ["act_quant", "act_quant_shifted", "plan_act_quant", "ActQuantPlan", "FORMATS", "OUTPUTS", "VARIANTS",
           "MAX_SPLIT", "SMALL_M", "S_FEEDS"]

FORMATS = ("int4_g64", "int4_2l")
_RNE_MAGIC = tl.constexpr(12582912.0)  # 1.5·2²³: adding and subtracting it rounds |v| < 2²² to the nearest even integer


@triton.jit
def _rne(v):
    """Round half to even (the interpreter's float→int cast truncates, and so does cvt.rzi)."""
    return (v + _RNE_MAGIC) - _RNE_MAGIC


@triton.jit
def _is_finite(v):
    return tl.abs(v) < float("inf")  # NaN compares false


@triton.jit
def _round_scale16(scale, SCALE_BF16: tl.constexpr):
    """fp32 → the nearest 16-bit value (returned as fp32), round-to-nearest-even like torch's ``.to``."""
    if SCALE_BF16:
        # bit trick rather than .to(bf16): the interpreter's fp32→bf16 cast truncates.
        bits = scale.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        r = bits.to(tl.float32, bitcast=True)
        return tl.where(scale != scale, scale, r)
    else:
        return scale.to(tl.float16).to(tl.float32)


@triton.jit
def _smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, offs_k, M):
    """x[offs_m, offs_k] / λ[offs_k] in fp32."""
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=offs_m[:, None] < M, other=0.0)
    lam = tl.load(smooth_ptr + offs_k).to(tl.float32)
    return tl.math.div_rn(x.to(tl.float32), lam[None, :])


@triton.jit
def _down(s_acc, xs, a_ptr, stride_ar, offs_k, offs_r, R):
    """s_acc [BM, BLOCK_R] += xs [BM, BK] · A[:, offs_k]ᵀ."""
    a_t = tl.load(a_ptr + offs_r[None, :] * stride_ar + offs_k[:, None], mask=offs_r[None, :] < R, other=0.0)
    a_t = a_t.to(tl.float32)
    # A (bf16/fp16) is exact in TF32, so 3×TF32 needs only two MMAs: xs = hi + lo, hi = xs truncated to
    # TF32's 10 mantissa bits (exact split), lo's own TF32 rounding costs ~2⁻²¹ relative. Fewer operand
    # conversions than input_precision="tf32x3" (3 MMAs + splitting A too): v1 sat at 255 registers.
    hi = (xs.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
    s_acc = tl.dot(hi, a_t, s_acc, input_precision="tf32")
    return tl.dot(xs - hi, a_t, s_acc, input_precision="tf32")


@triton.jit
def _bcast_groups(v, BLOCK_M: tl.constexpr, NGS: tl.constexpr, W: tl.constexpr):
    """[BM, NGS] per-group values → [BM, NGS·W] (each repeated over its group's W columns)."""
    return tl.reshape(tl.broadcast_to(v[:, :, None], (BLOCK_M, NGS, W)), (BLOCK_M, NGS * W))


@triton.jit
def _group_max(v, BLOCK_M: tl.constexpr, NGS: tl.constexpr, W: tl.constexpr):
    """[BM, NGS·W] → [BM, NGS] max over each group's W consecutive columns."""
    return tl.max(tl.reshape(v, (BLOCK_M, NGS, W)), axis=2)


@triton.jit
def _group_codes(v_lo, v_hi, top, n_nan, BLOCK_M: tl.constexpr, NGS: tl.constexpr, HG: tl.constexpr,
                 SCALE_BF16: tl.constexpr, QMIN: tl.constexpr, QMAX: tl.constexpr):
    """The shared tail of the signed and unsigned exact rules (``formats._groups._codes``): group magnitudes ``top``
    and NaN counts [BM, NGS] → 16-bit scales RN16(top / QMAX) (0 → 1, NaN groups NaN) and codes
    clamp(RNE(v / scale), QMIN, QMAX), 0 where the scale or the ratio is not finite."""
    scale = _round_scale16(tl.math.div_rn(top, QMAX), SCALE_BF16)  # [BM, NGS]
    scale = tl.where(scale == 0.0, 1.0, scale)
    scale = tl.where(n_nan > 0, float("nan"), scale)
    scale_b = _bcast_groups(scale, BLOCK_M, NGS, HG)
    ok = _is_finite(scale_b)
    r_lo = tl.math.div_rn(v_lo, scale_b)
    r_hi = tl.math.div_rn(v_hi, scale_b)
    q_lo = tl.where(ok & _is_finite(r_lo), _rne(tl.minimum(tl.maximum(r_lo, QMIN), QMAX)), 0.0).to(tl.int32)
    q_hi = tl.where(ok & _is_finite(r_hi), _rne(tl.minimum(tl.maximum(r_hi, QMIN), QMAX)), 0.0).to(tl.int32)
    return q_lo, q_hi, scale


@triton.jit
def _g64_codes(xs_lo, xs_hi, BLOCK_M: tl.constexpr, NGS: tl.constexpr, HG: tl.constexpr,
               SCALE_BF16: tl.constexpr):
    """Exact int4_g64 quantization of smoothed lo/hi nibble columns [BM, NGS·HG] → (q_lo, q_hi int32 in
    [−8, 7], scales fp32 [BM, NGS]); every IEEE corner case (NaN, ±Inf, zero groups) handled."""
    amax = tl.maximum(_group_max(tl.abs(xs_lo), BLOCK_M, NGS, HG), _group_max(tl.abs(xs_hi), BLOCK_M, NGS, HG))
    n_nan = (_group_max((xs_lo != xs_lo).to(tl.int32), BLOCK_M, NGS, HG)
             + _group_max((xs_hi != xs_hi).to(tl.int32), BLOCK_M, NGS, HG))
    return _group_codes(xs_lo, xs_hi, amax, n_nan, BLOCK_M, NGS, HG, SCALE_BF16, -8.0, 7.0)


@triton.jit
def _g64_codes_unsigned(u_lo, u_hi, BLOCK_M: tl.constexpr, NGS: tl.constexpr, HG: tl.constexpr,
                        SCALE_BF16: tl.constexpr):
    """Exact unsigned codes of shifted lo/hi columns u = RN(x/λ) + shift [BM, NGS·HG] → (q_lo, q_hi int32 in
    [0, 15], scales fp32 [BM, NGS]): ``formats.int4.quantize_act_uint4``, IEEE corner cases included (any NaN:
    NaN scale; an Inf of either sign: +Inf scale; top ≤ 0: scale 1; q = 0 where scale or ratio is not finite)."""
    n_nan = (_group_max((u_lo != u_lo).to(tl.int32), BLOCK_M, NGS, HG)
             + _group_max((u_hi != u_hi).to(tl.int32), BLOCK_M, NGS, HG))
    n_inf = (_group_max((tl.abs(u_lo) == float("inf")).to(tl.int32), BLOCK_M, NGS, HG)
             + _group_max((tl.abs(u_hi) == float("inf")).to(tl.int32), BLOCK_M, NGS, HG))
    top = tl.maximum(_group_max(tl.where(u_lo != u_lo, 0.0, u_lo), BLOCK_M, NGS, HG),
                     _group_max(tl.where(u_hi != u_hi, 0.0, u_hi), BLOCK_M, NGS, HG))
    top = tl.where(n_inf > 0, float("inf"), tl.maximum(top, 0.0))
    return _group_codes(u_lo, u_hi, top, n_nan, BLOCK_M, NGS, HG, SCALE_BF16, 0.0, 15.0)


@triton.jit
def _pack_nibbles(q_lo, q_hi):
    """Two's-complement nibbles of q_lo (low) and q_hi (high) → one byte (formats.int4 packing)."""
    return ((q_lo & 0xF) | ((q_hi & 0xF) << 4)).to(tl.uint8)


@triton.jit
def _g64_quantize(xs_lo, xs_hi, BLOCK_M: tl.constexpr, NGS: tl.constexpr, HG: tl.constexpr,
                  SCALE_BF16: tl.constexpr):
    """:func:`_g64_codes` → (packed uint8 [BM, NGS·HG], scales fp32 [BM, NGS])."""
    q_lo, q_hi, scale = _g64_codes(xs_lo, xs_hi, BLOCK_M, NGS, HG, SCALE_BF16)
    return _pack_nibbles(q_lo, q_hi), scale


@triton.jit
def _store_g64(q_ptr, stride_qm, sc_ptr, stride_sg, q_lo, q_hi, scale, offs_m, k_lo, byte_cols, gi, mask, g_mask,
               M, BLOCK_M: tl.constexpr, NGS: tl.constexpr, HG: tl.constexpr, SCALE_BF16: tl.constexpr,
               F8: tl.constexpr):
    """Write a tile's int4_g64 codes q_lo / q_hi (the lo / hi nibble columns k_lo / k_lo + 32 of rows offs_m,
    [BM, NGS·HG]; byte_cols: their packed byte columns) and its group scales [BM, NGS] (groups gi).

    Packed (default): bytes into q [M, K/2] uint8, 16-bit scales into sc [K/G, M] (stride_sg per group).
    F8: the operands of the e4m3 GEMM paths, bit-identical to ``w4_expand.expand_act_f8`` of the packed ones:
    q [M, K] e4m3 (stride_qm = K) at the natural columns, and sc = xab [K/G, 2, M] fp32 (stride_sg = 2·M): rows
    (a, b) = (2⁹·xs, −8·R·xs) with xs the 16-bit scale and R the group's Σ q (w4_expand.act_f8_rows)."""
    if F8:
        tl.store(q_ptr + offs_m[:, None] * stride_qm + k_lo[None, :], e4m3_codes(q_lo), mask=mask)
        tl.store(q_ptr + offs_m[:, None] * stride_qm + (k_lo + 32)[None, :], e4m3_codes(q_hi), mask=mask)
        rsum = tl.sum(tl.reshape(q_lo + q_hi, (BLOCK_M, NGS, HG)), axis=2)         # R [BM, NGS]
        # the scale as the packed path stores it, then widened the way expand_act_f8 reads it: same bits
        xs = scale.to(tl.bfloat16 if SCALE_BF16 else tl.float16).to(tl.float32)
        row_a, row_b = act_f8_rows(rsum, xs)
        dst = sc_ptr + gi[None, :] * stride_sg + offs_m[:, None]
        tl.store(dst, row_a, mask=g_mask)
        tl.store(dst + M, row_b, mask=g_mask)
    else:
        tl.store(q_ptr + offs_m[:, None] * stride_qm + byte_cols[None, :], _pack_nibbles(q_lo, q_hi), mask=mask)
        tl.store(sc_ptr + gi[None, :] * stride_sg + offs_m[:, None], scale.to(sc_ptr.dtype.element_ty), mask=g_mask)


@triton.jit
def _quant_g64_step(x_ptr, stride_xm, smooth_ptr, q_ptr, stride_qm, sc_ptr, stride_sg, a_ptr, stride_ar,
                    s_acc, k0, offs_m, offs_r, M, R,
                    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                    HAS_LOWRANK: tl.constexpr, SCALE_BF16: tl.constexpr, F8: tl.constexpr = False,
                    UNSIGNED: tl.constexpr = False, shift_ptr=None):
    """Quantize columns [k0, k0 + BLOCK_K) (BLOCK_K/G whole groups) of rows ``offs_m``: packed int4 +
    16-bit scales (F8: e4m3 codes + xab rows, :func:`_store_g64`); returns the updated S partial. One wide
    step instead of one group per step: the per-step latency chain (load → dot → reduce → store) is paid
    K/BLOCK_K times, not K/G times. UNSIGNED (F8 only): the codes of x/λ + shift (:func:`_g64_codes_unsigned`)."""
    HALF_K: tl.constexpr = BLOCK_K // 2
    HG: tl.constexpr = G // 2        # lo (or hi) columns per group
    NGS: tl.constexpr = BLOCK_K // G
    col = tl.arange(0, HALF_K)
    # byte c packs element (c // 32)·64 + c % 32 (low nibble) and that + 32 (high nibble); the lo columns
    # of group j are c ∈ [j·G/2, (j+1)·G/2) for G = 64 and 128 alike
    k_lo = k0 + (col // 32) * 64 + (col % 32)
    xs_lo = _smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, k_lo, M)
    xs_hi = _smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, k_lo + 32, M)
    if HAS_LOWRANK:
        s_acc = _down(s_acc, xs_lo, a_ptr, stride_ar, k_lo, offs_r, R)
        s_acc = _down(s_acc, xs_hi, a_ptr, stride_ar, k_lo + 32, offs_r, R)
    if UNSIGNED:
        q_lo, q_hi, scale = _g64_codes_unsigned(xs_lo + tl.load(shift_ptr + k_lo)[None, :],
                                                xs_hi + tl.load(shift_ptr + k_lo + 32)[None, :],
                                                BLOCK_M, NGS, HG, SCALE_BF16)
    else:
        q_lo, q_hi, scale = _g64_codes(xs_lo, xs_hi, BLOCK_M, NGS, HG, SCALE_BF16)
    row_ok = (offs_m < M)[:, None]
    _store_g64(q_ptr, stride_qm, sc_ptr, stride_sg, q_lo, q_hi, scale, offs_m, k_lo, k0 // 2 + col,
               k0 // G + tl.arange(0, NGS), row_ok, row_ok, M, BLOCK_M, NGS, HG, SCALE_BF16, F8)
    return s_acc


@triton.jit
def _act_quant_g_kernel(
    x_ptr, stride_xm,          # (M, K) bf16/fp16
    smooth_ptr,                # (K,)
    q_ptr, stride_qm,          # (M, K/2) uint8, packed int4 (formats.int4 layout)
    sc_ptr, stride_sg,         # (K/G, M) 16-bit scales, group-major
    a_ptr, stride_ar,          # (R, K) lora_down
    sp_ptr, stride_sps, stride_spm,  # (SPLIT, M, R) fp32 S partials (SPLIT = 1: S itself)
    M, K, R, STEPS_PER_SLICE,
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
    HAS_LOWRANK: tl.constexpr, SCALE_BF16: tl.constexpr, F8: tl.constexpr = False,
):
    """Program (row block, K slice): quantizes its groups (independent of the rest of the row) and
    writes its S partial; the partials are summed in slice order by :func:`_sum_partials_kernel`.
    F8: q / sc are the e4m3 operands x8 [M, K] / xab [K/G, 2, M] instead (:func:`_store_g64`)."""
    pid_k = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    k_begin = pid_k * STEPS_PER_SLICE * BLOCK_K
    k_end = tl.minimum(k_begin + STEPS_PER_SLICE * BLOCK_K, K)
    s_acc = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        s_acc = _quant_g64_step(x_ptr, stride_xm, smooth_ptr, q_ptr, stride_qm, sc_ptr, stride_sg, a_ptr,
                                stride_ar, s_acc, k0, offs_m, offs_r, M, R, G, BLOCK_M, BLOCK_K, HAS_LOWRANK,
                                SCALE_BF16, F8)
    if HAS_LOWRANK:
        tl.store(sp_ptr + pid_k * stride_sps + offs_m[:, None] * stride_spm + offs_r[None, :], s_acc,
                 mask=(offs_m[:, None] < M) & (offs_r[None, :] < R))


@triton.jit
def _act_2l_stats_kernel(
    x_ptr, stride_xm, smooth_ptr,
    a_ptr, stride_ar,
    sp_ptr, stride_sps, stride_spm,  # (SPLIT, M, R) fp32 S partials
    ap_ptr, stride_aps,              # (SPLIT, M) fp32 partial row absmax (NaN if the slice holds NaN)
    M, K, R, STEPS_PER_SLICE,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, HAS_LOWRANK: tl.constexpr,
):
    """Two-level pass 1 per (row block, K slice): partial row absmax and partial S."""
    pid_k = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    offs_k = tl.arange(0, BLOCK_K)
    k_begin = pid_k * STEPS_PER_SLICE * BLOCK_K
    k_end = tl.minimum(k_begin + STEPS_PER_SLICE * BLOCK_K, K)
    s_acc = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    amax = tl.zeros((BLOCK_M,), tl.float32)
    n_nan = tl.zeros((BLOCK_M,), tl.int32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        xs = _smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, k0 + offs_k, M)
        if HAS_LOWRANK:
            s_acc = _down(s_acc, xs, a_ptr, stride_ar, k0 + offs_k, offs_r, R)
        amax = tl.maximum(amax, tl.max(tl.abs(xs), axis=1))
        n_nan += tl.sum((xs != xs).to(tl.int32), axis=1)
    row_ok = offs_m < M
    tl.store(ap_ptr + pid_k * stride_aps + offs_m, tl.where(n_nan > 0, float("nan"), amax), mask=row_ok)
    if HAS_LOWRANK:
        tl.store(sp_ptr + pid_k * stride_sps + offs_m[:, None] * stride_spm + offs_r[None, :], s_acc,
                 mask=(offs_m[:, None] < M) & (offs_r[None, :] < R))


@triton.jit
def _2l_row_scale(ap_ptr, stride_aps, offs_m, row_ok, SPLIT, SPLIT_P2: tl.constexpr):
    """Row scale t [BM] from the pass-1 absmax partials (every slice program recomputes it from the same
    values in the same order); returns (t, ok = t finite, safe_t = t or 1)."""
    offs_s = tl.arange(0, SPLIT_P2)
    part = tl.load(ap_ptr + offs_s[:, None] * stride_aps + offs_m[None, :],
                   mask=(offs_s[:, None] < SPLIT) & row_ok[None, :], other=0.0)
    has_nan = tl.sum((part != part).to(tl.int32), axis=0) > 0
    amax = tl.max(tl.where(part != part, 0.0, part), axis=0)
    t = tl.math.div_rn(amax, 105.0)
    t = tl.where(t == 0.0, 1.0, t)
    t = tl.where(has_nan, float("nan"), t)
    ok = _is_finite(t)
    return t, ok, tl.where(ok, t, 1.0)


@triton.jit
def _2l_quantize(xs, safe_t, ok, BLOCK_M: tl.constexpr, NGS: tl.constexpr, G: tl.constexpr):
    """Exact two-level quantization of smoothed columns xs [BM, NGS·G] given the row scale → e int8."""
    gmax = _group_max(tl.abs(xs), BLOCK_M, NGS, G)  # [BM, NGS]
    v = tl.math.ceil(tl.math.div_rn(gmax, (safe_t * 7.0)[:, None]))
    v = tl.minimum(tl.maximum(v, 1.0), 15.0)
    v = tl.where(_is_finite(v), v, 1.0)
    vb = _bcast_groups(v, BLOCK_M, NGS, G)
    r = tl.math.div_rn(xs, safe_t[:, None] * vb)
    q = tl.where(ok[:, None] & _is_finite(r), _rne(tl.minimum(tl.maximum(r, -8.0), 7.0)), 0.0)
    return (q * vb).to(tl.int8)


@triton.jit
def _act_2l_quant_kernel(
    x_ptr, stride_xm, smooth_ptr,
    e_ptr, stride_em,          # (M, K) int8: expanded q·v
    t_ptr,                     # (M,) fp32 row scales
    ap_ptr, stride_aps,        # (SPLIT, M) partial absmax from pass 1
    M, K, SPLIT, STEPS_PER_SLICE,
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_P2: tl.constexpr,
):
    """Two-level pass 2 per (row block, K slice): row scale t from the partials (every slice program
    recomputes it from the same values in the same order), then multipliers v ∈ [1, 15] and e = q·v."""
    NGS: tl.constexpr = BLOCK_K // G
    pid_k = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = offs_m < M
    t, ok, safe_t = _2l_row_scale(ap_ptr, stride_aps, offs_m, row_ok, SPLIT, SPLIT_P2)
    k_begin = pid_k * STEPS_PER_SLICE * BLOCK_K
    k_end = tl.minimum(k_begin + STEPS_PER_SLICE * BLOCK_K, K)
    for k0 in range(k_begin, k_end, BLOCK_K):
        xs = _smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, k0 + offs_k, M)
        e = _2l_quantize(xs, safe_t, ok, BLOCK_M, NGS, G)
        tl.store(e_ptr + offs_m[:, None] * stride_em + (k0 + offs_k)[None, :], e, mask=row_ok[:, None])
    if pid_k == 0:
        tl.store(t_ptr + offs_m, t, mask=row_ok)


# --- v2: the same outputs for far fewer instructions per element --------------------------------------
# v1 spends ~73 issued SASS instructions per element (sm_90, 64×64 steps): two IEEE divisions (~10 each:
# MUFU.RCP, 5 FFMA, FCHK, branch), NaN bookkeeping, clamps/selects, and ~30 for S (split xs into TF32
# hi + lo, and move both through shared memory into MMA operands). v2:
#   * S = X · A'ᵀ with A' = A/λ precomputed once per call (a tiny prep kernel) as three 16-bit pieces
#     (p1 + p2·2⁻ˢʰ + p3·2⁻²ˢʰ ≈ A' to fp32 precision): the MMAs read the raw bf16/fp16 X tile (exact) —
#     no per-element work, and the loaded tile feeds the MMA straight from shared memory;
#   * x/λ and xs/scale as q0 = a·rb, r = fma(−q0, b, a), q = fma(r, rb, q0) with rb = RN(1/b) precomputed
#     (per column in the prep kernel, per row-group in the step): Markstein's correction, which is the
#     CUDA div.rn fast path itself, so bit-exact when no operand or remainder under/overflows;
#   * the fast path is taken per step only when every valid row's group maximum (g64: the 16-bit scale;
#     2l: the row scale t) lies in a range where that holds for every element that can round to a
#     non-zero q (see _FAST_*); then |xs/scale| < 7.02 needs no clamp, no NaN/Inf selects, and the
#     nibble is the low bits of (r + 1.5·2²³). Otherwise (NaN/Inf, all-zero or extreme groups, λ outside
#     [2⁻³⁰, 2³⁰]) the step reruns v1's exact code: slower, same bits.
_FAST_LAM = tl.constexpr(2.0 ** 30)       # prep: λ outside [2⁻³⁰, 2³⁰] → 1/λ stored as NaN (forces the exact path)
_FAST_LO = tl.constexpr(2.0 ** -60)       # smallest group scale / row scale t on the fast path
_FAST_HI = tl.constexpr(2.0 ** 60)
_FAST_LO_F16 = tl.constexpr(2.0 ** -14)   # fp16 scales: stay normal and finite
_FAST_HI_F16 = tl.constexpr(2.0 ** 15)
_MAGIC_BITS = tl.constexpr(0x4B400000)    # bit pattern of 1.5·2²³


@triton.jit
def _fma(a, b, c, EMU_FMA: tl.constexpr):
    """Fused a·b + c. The interpreter's fma rounds twice; emulate it in float64 there (exact product,
    one rounding to fp64 then fp32: differs from a true fma with probability ~2⁻²⁹)."""
    if EMU_FMA:
        return (a.to(tl.float64) * b.to(tl.float64) + c.to(tl.float64)).to(tl.float32)
    else:
        return tl.fma(a, b, c)


@triton.jit
def _div_fast(a, b, rb, EMU_FMA: tl.constexpr):
    """RN(a / b) given rb = RN(1 / b), exact when b, rb, a/b and the remainder are normal."""
    q0 = a * rb
    r = _fma(-q0, b, a, EMU_FMA)
    return _fma(r, rb, q0, EMU_FMA)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _row_absmax_nan(a, b):
    """[BM, W] × 2 → [BM] max |·| over both tiles; NaN if any element is NaN (max.NaN.f32)."""
    return tl.reduce(_max_nan(tl.abs(a), tl.abs(b)), 1, _max_nan)


@triton.jit
def _prep_kernel(
    smooth_ptr,                # (K,)
    a_ptr, stride_ar,          # (R, K) lora_down
    rl_ptr,                    # (K,) fp32: RN(1/λ), NaN where λ is outside the fast-path range
    p_ptr, stride_pp,          # (3, K, BLOCK_R) pieces of A'ᵀ = (A/λ)ᵀ in the MMA dtype, rank padded with 0
    K, R,
    SHIFT: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, HAS_LOWRANK: tl.constexpr,
):
    offs_k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    kmask = offs_k < K
    lam = tl.load(smooth_ptr + offs_k, mask=kmask, other=1.0).to(tl.float32)
    rl = tl.math.div_rn(1.0, lam)
    safe = (tl.abs(lam) >= 1.0 / _FAST_LAM) & (tl.abs(lam) <= _FAST_LAM)
    tl.store(rl_ptr + offs_k, tl.where(safe, rl, float("nan")), mask=kmask)
    if HAS_LOWRANK:
        offs_r = tl.arange(0, BLOCK_R)
        a = tl.load(a_ptr + offs_r[None, :] * stride_ar + offs_k[:, None],
                    mask=kmask[:, None] & (offs_r[None, :] < R), other=0.0).to(tl.float32)
        ap = tl.math.div_rn(a, lam[:, None])  # [BK, BR]
        dt = p_ptr.dtype.element_ty
        p1 = ap.to(dt)
        res = ap - p1.to(tl.float32)
        p2 = (res * (2.0 ** SHIFT)).to(dt)
        res = res - p2.to(tl.float32) * (2.0 ** -SHIFT)
        p3 = (res * (2.0 ** (2 * SHIFT))).to(dt)
        dst = p_ptr + offs_k[:, None] * BLOCK_R + offs_r[None, :]
        tl.store(dst, p1, mask=kmask[:, None])
        tl.store(dst + stride_pp, p2, mask=kmask[:, None])
        tl.store(dst + 2 * stride_pp, p3, mask=kmask[:, None])


@triton.jit
def _down_pieces(acc1, acc2, acc3, x, p_ptr, stride_pp, offs_k, offs_r, BLOCK_R: tl.constexpr):
    """acc_i [BM, BLOCK_R] += x [BM, BK] · piece_i[offs_k, :] (x cast to the pieces' dtype: a no-op on
    the GPU; bf16 → fp32 under the interpreter, whose bf16 dot is wrong)."""
    xm = x.to(p_ptr.dtype.element_ty)
    src = p_ptr + offs_k[:, None] * BLOCK_R + offs_r[None, :]
    acc1 = tl.dot(xm, tl.load(src), acc1, input_precision="ieee")
    acc2 = tl.dot(xm, tl.load(src + stride_pp), acc2, input_precision="ieee")
    acc3 = tl.dot(xm, tl.load(src + 2 * stride_pp), acc3, input_precision="ieee")
    return acc1, acc2, acc3


@triton.jit
def _store_s(s, sp_ptr, stride_sps, stride_spm, pid_k, offs_m, offs_r, M, R):
    """S (or slice ``pid_k``'s S partial) [BM, BLOCK_R] → sp, rows < M and ranks < R."""
    tl.store(sp_ptr + pid_k * stride_sps + offs_m[:, None] * stride_spm + offs_r[None, :], s,
             mask=(offs_m[:, None] < M) & (offs_r[None, :] < R))


@triton.jit
def _store_s_pieces(acc1, acc2, acc3, sp_ptr, stride_sps, stride_spm, pid_k, offs_m, offs_r, M, R,
                    SHIFT: tl.constexpr):
    _store_s(acc1 + acc2 * (2.0 ** -SHIFT) + acc3 * (2.0 ** (-2 * SHIFT)), sp_ptr, stride_sps, stride_spm, pid_k,
             offs_m, offs_r, M, R)


# --- S feed "one" (the v3 default at r ≤ 32 since session 12, act_quant(s_feed=...)): the three pieces into ONE acc.
# Prepped with SHIFT = 0 (p1 = RN(A'), p2 = RN(A' − p1), p3 = RN(A' − p1 − p2), all unscaled: bf16 has fp32's
# exponent range, so nothing underflows; fp16 pieces would, hence bf16 X only), S = Σ x·p1 + x·p2 + x·p3 chains
# three MMAs on one [BM, BLOCK_R] fp32 accumulator instead of three: 32 fewer accumulator registers, S to fp32
# rounding (3× as many accumulator roundings as today's p1 accumulator; not bit-identical to "split").
# sm_90 (AOT, ptxas, FLUX plan: 64 × 64 steps, 4 warps, r = 32, bf16): v3 g64 packed 164 → 128 registers, e4m3
# 159 → 128, 2l stats 155 → 96: 4 (g64) and 5 (stats) CTAs per SM instead of 3 (2 stages: 33 KB SMEM; at 3 stages
# e4m3 stays at 153). The price: 5 wgmma waits per g64 step instead of 3 (2 instead of 1 in the stats pass).
# Measured and dropped on the same ledger: X by TMA in the g64 pass (two [BM, 32] boxes: 139–168 registers, 18
# λ / 1/λ loads and ~480 more PTX lines per step; one [BM, G] box split into the nibble halves in registers: 168–255
# registers, ~40 more ld.shared), and the pieces side by side as one [BK, 4·BLOCK_R] operand (one N = 128 wgmma
# per K chunk, but a 64-register accumulator: 147–227 registers). The default feed's X already arrives by
# cp.async and the wgmma reads it from shared memory (the quantizer too, 4 ld.shared per step): there is no
# register round trip to remove; what S costs there is occupancy (3 CTAs per SM: 576 programs at K = 3072 are
# 1.45 waves) and a wgmma wait per accumulator per step.
S_FEEDS = ("split", "one", "one_tma")


@triton.jit
def _down_one(acc, x, p_ptr, stride_pp, offs_k, offs_r, BLOCK_R: tl.constexpr):
    """acc [BM, BLOCK_R] += x [BM, BK] · (p1 + p2 + p3)[offs_k, :] with the unscaled pieces (SHIFT = 0)."""
    xm = x.to(p_ptr.dtype.element_ty)
    src = p_ptr + offs_k[:, None] * BLOCK_R + offs_r[None, :]
    acc = tl.dot(xm, tl.load(src), acc, input_precision="ieee")
    acc = tl.dot(xm, tl.load(src + stride_pp), acc, input_precision="ieee")
    return tl.dot(xm, tl.load(src + 2 * stride_pp), acc, input_precision="ieee")


@triton.jit
def _smooth_fast(x, lam_ptrs, rl_ptrs, EMU_FMA: tl.constexpr):
    """(λ [1, C] fp32, x/λ) for x [BM, C] with λ and RN(1/λ) (prep kernel) at ``lam_ptrs`` / ``rl_ptrs`` [C]: one
    FMA correction (:func:`_div_fast`) instead of a division — the v2 / v3 fast path."""
    lam = tl.load(lam_ptrs).to(tl.float32)[None, :]
    return lam, _div_fast(x.to(tl.float32), lam, tl.load(rl_ptrs)[None, :], EMU_FMA)


@triton.jit
def _g64_fast_codes(xs_lo, xs_hi, scale, rs, EMU_FMA: tl.constexpr):
    """int32 codes q = RNE(xs / scale) of the two nibble halves (rs = RN(1/scale)), rounded half-to-even by the
    magic-number add; valid when the scale is in the fast range (no clamp needed)."""
    q_lo = (_div_fast(xs_lo, scale, rs, EMU_FMA) + _RNE_MAGIC).to(tl.int32, bitcast=True) - _MAGIC_BITS
    q_hi = (_div_fast(xs_hi, scale, rs, EMU_FMA) + _RNE_MAGIC).to(tl.int32, bitcast=True) - _MAGIC_BITS
    return q_lo, q_hi


@triton.jit
def _g64_fast_pack(xs_lo, xs_hi, scale, rs, EMU_FMA: tl.constexpr):
    """Packed int4 bytes of :func:`_g64_fast_codes` (the magic bits are 0 in the low nibble: no subtract)."""
    q_lo, q_hi = _g64_fast_codes(xs_lo, xs_hi, scale, rs, EMU_FMA)
    return _pack_nibbles(q_lo, q_hi)


@triton.jit
def _2l_fast_codes(xs, gmax, safe_t, t7, EMU_FMA: tl.constexpr):
    """int8 e = q·v of a [BM, G] group on the fast path: v = clamp(ceil(gmax / (7t)), 1, 15), q = RNE(xs / (t·v))
    (|q| ≤ 7 without a clamp there). ``t7`` = 7·t."""
    v = tl.math.ceil(tl.math.div_rn(gmax, t7))
    v = tl.minimum(tl.maximum(v, 1.0), 15.0)
    d = (safe_t * v)[:, None]
    r = _div_fast(xs, d, tl.math.div_rn(1.0, d), EMU_FMA)
    qi = (r + _RNE_MAGIC).to(tl.int32, bitcast=True) - _MAGIC_BITS
    return (qi * v.to(tl.int32)[:, None]).to(tl.int8)


@triton.jit
def _act_quant_g_v2_kernel(
    x_ptr, stride_xm,          # (M, K) bf16/fp16
    smooth_ptr, rl_ptr,        # (K,) λ and RN(1/λ) (prep kernel)
    q_ptr, stride_qm,          # (M, K/2) uint8, packed int4 (formats.int4 layout)
    sc_ptr, stride_sg,         # (K/G, M) 16-bit scales, group-major
    p_ptr, stride_pp,          # (3, K, BLOCK_R) A'ᵀ pieces (prep kernel)
    sp_ptr, stride_sps, stride_spm,  # (SPLIT, M, R) fp32 S partials (SPLIT = 1: S itself)
    M, K, R, STEPS_PER_SLICE,
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, HAS_LOWRANK: tl.constexpr,
    SCALE_BF16: tl.constexpr, SHIFT: tl.constexpr, EMU_FMA: tl.constexpr,
):
    """v2 of :func:`_act_quant_g_kernel`: one group (G columns, G % 64 == 0) per step, same bits."""
    HALF: tl.constexpr = G // 2
    LO: tl.constexpr = _FAST_LO if SCALE_BF16 else _FAST_LO_F16
    HI: tl.constexpr = _FAST_HI if SCALE_BF16 else _FAST_HI_F16
    pid_k = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    row_ok = offs_m < M
    col = tl.arange(0, HALF)
    k_off = (col // 32) * 64 + (col % 32)  # lo nibble columns of the packed bytes (see _quant_g64_step)
    k_begin = pid_k * STEPS_PER_SLICE * G
    k_end = tl.minimum(k_begin + STEPS_PER_SLICE * G, K)
    acc1 = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    acc3 = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    for k0 in range(k_begin, k_end, G):
        k_lo = k0 + k_off
        x_lo = tl.load(x_ptr + offs_m[:, None] * stride_xm + k_lo[None, :], mask=row_ok[:, None], other=0.0)
        x_hi = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k_lo + 32)[None, :], mask=row_ok[:, None], other=0.0)
        if HAS_LOWRANK:
            acc1, acc2, acc3 = _down_pieces(acc1, acc2, acc3, x_lo, p_ptr, stride_pp, k_lo, offs_r, BLOCK_R)
            acc1, acc2, acc3 = _down_pieces(acc1, acc2, acc3, x_hi, p_ptr, stride_pp, k_lo + 32, offs_r, BLOCK_R)
        lam_lo, xs_lo = _smooth_fast(x_lo, smooth_ptr + k_lo, rl_ptr + k_lo, EMU_FMA)
        lam_hi, xs_hi = _smooth_fast(x_hi, smooth_ptr + k_lo + 32, rl_ptr + k_lo + 32, EMU_FMA)
        amax = _row_absmax_nan(xs_lo, xs_hi)[:, None]  # [BM, 1]
        scale = _round_scale16(tl.math.div_rn(amax, 7.0), SCALE_BF16)
        bad = row_ok[:, None] & ~((scale >= LO) & (scale <= HI))  # NaN scale → bad
        if tl.max(tl.max(bad.to(tl.int32), axis=1), axis=0) > 0:
            packed, scale = _g64_quantize(tl.math.div_rn(x_lo.to(tl.float32), lam_lo),
                                          tl.math.div_rn(x_hi.to(tl.float32), lam_hi), BLOCK_M, 1, HALF, SCALE_BF16)
        else:
            packed = _g64_fast_pack(xs_lo, xs_hi, scale, tl.math.div_rn(1.0, scale), EMU_FMA)
        tl.store(q_ptr + offs_m[:, None] * stride_qm + (k0 // 2 + col)[None, :], packed, mask=row_ok[:, None])
        tl.store(sc_ptr + (k0 // G) * stride_sg + offs_m[:, None], scale.to(sc_ptr.dtype.element_ty),
                 mask=row_ok[:, None])
    if HAS_LOWRANK:
        _store_s_pieces(acc1, acc2, acc3, sp_ptr, stride_sps, stride_spm, pid_k, offs_m, offs_r, M, R, SHIFT)


@triton.jit
def _act_2l_stats_v2_kernel(
    x_ptr, stride_xm, smooth_ptr, rl_ptr,
    p_ptr, stride_pp,                # (3, K, BLOCK_R) A'ᵀ pieces
    sp_ptr, stride_sps, stride_spm,  # (SPLIT, M, R) fp32 S partials
    ap_ptr, stride_aps,              # (SPLIT, M) fp32 partial row absmax (NaN if the slice holds NaN)
    M, K, R, STEPS_PER_SLICE,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, HAS_LOWRANK: tl.constexpr,
    SHIFT: tl.constexpr, EMU_FMA: tl.constexpr,
):
    """v2 of :func:`_act_2l_stats_kernel`: a step's row maxima in [2⁻⁶⁰, 2⁶⁰] are exact on the fast
    path (the maximal element is normal, so is its remainder); otherwise the step is redone exactly."""
    pid_k = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = offs_m < M
    k_begin = pid_k * STEPS_PER_SLICE * BLOCK_K
    k_end = tl.minimum(k_begin + STEPS_PER_SLICE * BLOCK_K, K)
    acc1 = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    acc3 = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    amax = tl.zeros((BLOCK_M,), tl.float32)
    n_nan = tl.zeros((BLOCK_M,), tl.int32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :], mask=row_ok[:, None], other=0.0)
        if HAS_LOWRANK:
            acc1, acc2, acc3 = _down_pieces(acc1, acc2, acc3, x, p_ptr, stride_pp, k0 + offs_k, offs_r, BLOCK_R)
        lam, xs = _smooth_fast(x, smooth_ptr + k0 + offs_k, rl_ptr + k0 + offs_k, EMU_FMA)
        m = _row_absmax_nan(xs, xs)
        bad = row_ok & ~((m >= _FAST_LO) & (m <= _FAST_HI))
        nn = tl.zeros((BLOCK_M,), tl.int32)
        if tl.max(bad.to(tl.int32), axis=0) > 0:
            xs = tl.math.div_rn(x.to(tl.float32), lam)
            m = tl.max(tl.abs(xs), axis=1)
            nn = tl.sum((xs != xs).to(tl.int32), axis=1)
        amax = tl.maximum(amax, m)
        n_nan += nn
    tl.store(ap_ptr + pid_k * stride_aps + offs_m, tl.where(n_nan > 0, float("nan"), amax), mask=row_ok)
    if HAS_LOWRANK:
        _store_s_pieces(acc1, acc2, acc3, sp_ptr, stride_sps, stride_spm, pid_k, offs_m, offs_r, M, R, SHIFT)


@triton.jit
def _act_2l_quant_v2_kernel(
    x_ptr, stride_xm, smooth_ptr, rl_ptr,
    e_ptr, stride_em,          # (M, K) int8: expanded q·v
    t_ptr,                     # (M,) fp32 row scales
    ap_ptr, stride_aps,        # (SPLIT, M) partial absmax from pass 1
    M, K, SPLIT, STEPS_PER_SLICE,
    G: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT_P2: tl.constexpr, EMU_FMA: tl.constexpr,
):
    """v2 of :func:`_act_2l_quant_kernel` (one group per step): fast path when every valid row's t is in
    [2⁻⁶⁰, 2⁶⁰] and the group max is finite (|r| ≤ 7·(1 + 2⁻²²): no clamp; e = q·v in integers)."""
    pid_k = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, G)
    row_ok = offs_m < M
    t, ok, safe_t = _2l_row_scale(ap_ptr, stride_aps, offs_m, row_ok, SPLIT, SPLIT_P2)
    t_fast = (t >= _FAST_LO) & (t <= _FAST_HI)
    k_begin = pid_k * STEPS_PER_SLICE * G
    k_end = tl.minimum(k_begin + STEPS_PER_SLICE * G, K)
    for k0 in range(k_begin, k_end, G):
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :], mask=row_ok[:, None], other=0.0)
        lam, xs = _smooth_fast(x, smooth_ptr + k0 + offs_k, rl_ptr + k0 + offs_k, EMU_FMA)
        gmax = _row_absmax_nan(xs, xs)
        bad = row_ok & ~(t_fast & (gmax <= _FAST_HI * 4.0))  # NaN gmax (x or 1/λ) → bad
        if tl.max(bad.to(tl.int32), axis=0) > 0:
            e = _2l_quantize(tl.math.div_rn(x.to(tl.float32), lam), safe_t, ok, BLOCK_M, 1, G)
        else:
            e = _2l_fast_codes(xs, gmax, safe_t, safe_t * 7.0, EMU_FMA)
        tl.store(e_ptr + offs_m[:, None] * stride_em + (k0 + offs_k)[None, :], e, mask=row_ok[:, None])
    if pid_k == 0:
        tl.store(t_ptr + offs_m, t, mask=row_ok)


# --- v3 (large M): the v2 math with the per-step CTA-wide branch moved out of the loop ------------------
# sm_90 read of v2 (64×64 steps, 4 warps; ptxas): 243 registers (2 CTAs per SM; 288 programs at M=4608 =
# 1.09 waves), ~1100 SASS per thread per step = ~34 per element, 5 bar.sync per step. Most of it is not the
# fast path (~250 SASS): the per-step `if any(bad)` is a CTA-wide reduction (bar.sync) and its exact branch
# made Triton keep a second, column-major layout alive in the loop (the scale store's), so λ and 1/λ were
# loaded element by element in BOTH layouts (~130 scalar LDG per thread per step) and x was read from
# shared memory a second time with 32 LDS.U16. v3 runs the fast path unconditionally: nibbles of a bad
# (row, group) are garbage for a moment, its flag is OR-ed into a per-row register; after the loop ONE
# CTA-wide test decides whether the program re-quantizes its whole slice with v1's exact code (same bytes,
# overwriting; the barrier of that reduction orders the two stores). S and the fast path are v2's, so
# q / scales / t are bit-identical to v2 and S is v2's S.
_RCP7 = tl.constexpr(0.1428571492433548)  # RN(1/7) in fp32: amax/7 by Markstein (amax normal on the fast path)
_RCP15 = tl.constexpr(0.06666667014360428)  # RN(1/15) in fp32: top/15 the same way (unsigned codes)


@triton.jit
def _u4_fast_codes(u_lo, u_hi, BLOCK_M: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr, EMU_FMA: tl.constexpr,
                   SCALE_BF16: tl.constexpr):
    """v3's fast path for one group of shifted columns u (lo / hi nibble halves [BM, G/2]) → (q_lo, q_hi int32 in
    [0, 15], scale [BM, 1], ok [BM, 1]). Rows with ok false (any NaN or ±Inf in u, or a scale outside [LO, HI]:
    top ≤ 0 included) hold garbage the exact redo overwrites. On ok rows top = max u is normal, so top/15 is the
    division's RN, and RN(u/scale) by one FMA correction is exact wherever it can round to 1…15; below that it
    may not be, but it is < 0.5 or negative (or −Inf/NaN when u ≪ 0 overflows) and the two selects make it 0."""
    amax = _row_absmax_nan(u_lo, u_hi)[:, None]                    # NaN / Inf detection (either sign)
    top = tl.reduce(_max_nan(u_lo, u_hi), 1, _max_nan)[:, None]    # max u, NaN-propagating
    scale = _round_scale16(_div_fast(top, tl.full((BLOCK_M, 1), 15.0, tl.float32),
                                     tl.full((BLOCK_M, 1), _RCP15, tl.float32), EMU_FMA), SCALE_BF16)
    ok = (scale >= LO) & (scale <= HI) & (amax < float("inf"))     # NaN fails both
    rs = tl.math.div_rn(1.0, tl.where(ok, scale, 1.0))
    # u < 0 gives code 0 either way, so clamp u, not the ratio: 0 ≤ u/scale ≤ top/scale ≤ 15·(1 + 2⁻⁸) rounds into
    # 0…15 with no clamp after (clamping the ratios instead cost 36 registers, 166 vs 130)
    q_lo = (_div_fast(tl.maximum(u_lo, 0.0), scale, rs, EMU_FMA) + _RNE_MAGIC).to(tl.int32, bitcast=True) - _MAGIC_BITS
    q_hi = (_div_fast(tl.maximum(u_hi, 0.0), scale, rs, EMU_FMA) + _RNE_MAGIC).to(tl.int32, bitcast=True) - _MAGIC_BITS
    return q_lo, q_hi, scale, ok


@triton.jit
def _act_quant_g_v3_kernel(
    x_ptr, stride_xm, smooth_ptr, rl_ptr, q_ptr, stride_qm, sc_ptr, stride_sg, p_ptr, stride_pp,
    sp_ptr, stride_sps, stride_spm, M, K, R, STEPS_PER_SLICE,
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, HAS_LOWRANK: tl.constexpr,
    SCALE_BF16: tl.constexpr, SHIFT: tl.constexpr, EMU_FMA: tl.constexpr, F8: tl.constexpr = False,
    ONE_ACC: tl.constexpr = False, UNSIGNED: tl.constexpr = False, shift_ptr=None,
):
    """v3 of :func:`_act_quant_g_v2_kernel` (same arguments, same bits): fast path only in the loop, the
    exact redo of the slice after it when any of its (row, group) scales left the fast range.
    F8: q / sc are the e4m3 operands x8 [M, K] / xab [K/G, 2, M] instead (:func:`_store_g64`).
    ONE_ACC: S from unscaled pieces into one accumulator (:func:`_down_one`; same q / scales).
    UNSIGNED (with F8; ``shift_ptr`` fp32 [K]): the codes 0…15 of u = RN(x/λ) + shift, the bits of
    ``formats.int4.quantize_act_uint4`` (:func:`_u4_fast_codes`; S stays (x/λ)·Aᵀ of the unshifted x)."""
    HALF: tl.constexpr = G // 2
    LO: tl.constexpr = _FAST_LO if SCALE_BF16 else _FAST_LO_F16
    HI: tl.constexpr = _FAST_HI if SCALE_BF16 else _FAST_HI_F16
    pid_k = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    row_ok = offs_m < M
    col = tl.arange(0, HALF)
    # lo nibble columns (see _quant_g64_step): runs of 32 → 16-byte vector loads of x, λ and 1/λ
    k_off = tl.max_contiguous(tl.multiple_of((col // 32) * 64 + (col % 32), 32), 32)
    k_begin = pid_k * STEPS_PER_SLICE * G
    k_end = tl.minimum(k_begin + STEPS_PER_SLICE * G, K)
    acc1 = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    acc3 = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    n_bad = tl.zeros((BLOCK_M, 1), tl.int32)
    for k0 in range(k_begin, k_end, G):
        k_lo = k0 + k_off
        x_lo = tl.load(x_ptr + offs_m[:, None] * stride_xm + k_lo[None, :], mask=row_ok[:, None], other=0.0)
        x_hi = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k_lo + 32)[None, :], mask=row_ok[:, None], other=0.0)
        if HAS_LOWRANK and ONE_ACC:
            acc1 = _down_one(acc1, x_lo, p_ptr, stride_pp, k_lo, offs_r, BLOCK_R)
            acc1 = _down_one(acc1, x_hi, p_ptr, stride_pp, k_lo + 32, offs_r, BLOCK_R)
        elif HAS_LOWRANK:
            acc1, acc2, acc3 = _down_pieces(acc1, acc2, acc3, x_lo, p_ptr, stride_pp, k_lo, offs_r, BLOCK_R)
            acc1, acc2, acc3 = _down_pieces(acc1, acc2, acc3, x_hi, p_ptr, stride_pp, k_lo + 32, offs_r, BLOCK_R)
        _, xs_lo = _smooth_fast(x_lo, smooth_ptr + k_lo, rl_ptr + k_lo, EMU_FMA)
        _, xs_hi = _smooth_fast(x_hi, smooth_ptr + k_lo + 32, rl_ptr + k_lo + 32, EMU_FMA)
        if UNSIGNED:
            q_lo, q_hi, scale, ok = _u4_fast_codes(xs_lo + tl.load(shift_ptr + k_lo)[None, :],
                                                   xs_hi + tl.load(shift_ptr + k_lo + 32)[None, :],
                                                   BLOCK_M, LO, HI, EMU_FMA, SCALE_BF16)
            n_bad += (row_ok[:, None] & ~ok).to(tl.int32)
        else:
            amax = _row_absmax_nan(xs_lo, xs_hi)[:, None]  # [BM, 1]; NaN if x or 1/λ is
            scale = _round_scale16(_div_fast(amax, tl.full((BLOCK_M, 1), 7.0, tl.float32),
                                             tl.full((BLOCK_M, 1), _RCP7, tl.float32), EMU_FMA), SCALE_BF16)
            ok = (scale >= LO) & (scale <= HI)  # NaN → not ok; in range: amax normal, so amax/7 was exact
            n_bad += (row_ok[:, None] & ~ok).to(tl.int32)
            q_lo, q_hi = _g64_fast_codes(xs_lo, xs_hi, scale, tl.math.div_rn(1.0, tl.where(ok, scale, 1.0)),
                                         EMU_FMA)
        _store_g64(q_ptr, stride_qm, sc_ptr, stride_sg, q_lo, q_hi, scale, offs_m, k_lo, k0 // 2 + col,
                   k0 // G + tl.arange(0, 1), row_ok[:, None], row_ok[:, None], M, BLOCK_M, 1, HALF, SCALE_BF16, F8)
    if HAS_LOWRANK and ONE_ACC:
        _store_s(acc1, sp_ptr, stride_sps, stride_spm, pid_k, offs_m, offs_r, M, R)
    elif HAS_LOWRANK:
        _store_s_pieces(acc1, acc2, acc3, sp_ptr, stride_sps, stride_spm, pid_k, offs_m, offs_r, M, R, SHIFT)
    if tl.max(tl.max(n_bad, axis=1), axis=0) > 0:  # rare: NaN/Inf, zero or extreme groups, λ out of range
        tl.debug_barrier()
        for k0 in range(k_begin, k_end, G):
            s_dummy = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
            _quant_g64_step(x_ptr, stride_xm, smooth_ptr, q_ptr, stride_qm, sc_ptr, stride_sg, x_ptr, 0,
                            s_dummy, k0, offs_m, offs_r, M, R, G, BLOCK_M, G, False, SCALE_BF16, F8,
                            UNSIGNED, shift_ptr)


@triton.jit
def _act_2l_stats_v3_kernel(
    x_ptr, stride_xm, smooth_ptr, rl_ptr, p_ptr, stride_pp, sp_ptr, stride_sps, stride_spm, ap_ptr, stride_aps,
    M, K, R, STEPS_PER_SLICE,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, HAS_LOWRANK: tl.constexpr,
    SHIFT: tl.constexpr, EMU_FMA: tl.constexpr, ONE_ACC: tl.constexpr = False, X_TMA: tl.constexpr = False,
):
    """v3 of :func:`_act_2l_stats_v2_kernel`: fast row maxima in the loop; if any step's maximum left
    [2⁻⁶⁰, 2⁶⁰] (or was NaN), the slice's absmax is recomputed exactly after it (max is order-free: same bits).
    ONE_ACC: S from unscaled pieces into one accumulator (:func:`_down_one`). X_TMA (with ONE_ACC): ``x_ptr`` is
    a TMA descriptor of X, box [BLOCK_M, BLOCK_K] (rows ≥ M read as 0, as the masked loads do); same absmax bits."""
    pid_k = tl.program_id(1)
    m0 = tl.program_id(0) * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    offs_k = tl.max_contiguous(tl.multiple_of(tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
    row_ok = offs_m < M
    k_begin = pid_k * STEPS_PER_SLICE * BLOCK_K
    k_end = tl.minimum(k_begin + STEPS_PER_SLICE * BLOCK_K, K)
    acc1 = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    acc3 = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    amax = tl.zeros((BLOCK_M,), tl.float32)
    n_bad = tl.zeros((BLOCK_M,), tl.int32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        if X_TMA:
            x = x_ptr.load([m0, k0])
        else:
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :], mask=row_ok[:, None],
                        other=0.0)
        if HAS_LOWRANK and ONE_ACC:
            acc1 = _down_one(acc1, x, p_ptr, stride_pp, k0 + offs_k, offs_r, BLOCK_R)
        elif HAS_LOWRANK:
            acc1, acc2, acc3 = _down_pieces(acc1, acc2, acc3, x, p_ptr, stride_pp, k0 + offs_k, offs_r, BLOCK_R)
        _, xs = _smooth_fast(x, smooth_ptr + k0 + offs_k, rl_ptr + k0 + offs_k, EMU_FMA)
        m = _row_absmax_nan(xs, xs)
        n_bad += (row_ok & ~((m >= _FAST_LO) & (m <= _FAST_HI))).to(tl.int32)
        amax = tl.maximum(amax, m)
    if tl.max(n_bad, axis=0) > 0:
        amax = tl.zeros((BLOCK_M,), tl.float32)
        n_nan = tl.zeros((BLOCK_M,), tl.int32)
        for k0 in range(k_begin, k_end, BLOCK_K):
            if X_TMA:
                xs = tl.math.div_rn(x_ptr.load([m0, k0]).to(tl.float32),
                                    tl.load(smooth_ptr + k0 + offs_k).to(tl.float32)[None, :])
            else:
                xs = _smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, k0 + offs_k, M)
            amax = tl.maximum(amax, tl.max(tl.abs(xs), axis=1))
            n_nan += tl.sum((xs != xs).to(tl.int32), axis=1)
        amax = tl.where(n_nan > 0, float("nan"), amax)
    tl.store(ap_ptr + pid_k * stride_aps + offs_m, amax, mask=row_ok)
    if HAS_LOWRANK and ONE_ACC:
        _store_s(acc1, sp_ptr, stride_sps, stride_spm, pid_k, offs_m, offs_r, M, R)
    elif HAS_LOWRANK:
        _store_s_pieces(acc1, acc2, acc3, sp_ptr, stride_sps, stride_spm, pid_k, offs_m, offs_r, M, R, SHIFT)


@triton.jit
def _act_2l_quant_v3_kernel(
    x_ptr, stride_xm, smooth_ptr, rl_ptr, e_ptr, stride_em, t_ptr, ap_ptr, stride_aps, M, K, SPLIT, STEPS_PER_SLICE,
    G: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT_P2: tl.constexpr, EMU_FMA: tl.constexpr,
):
    """v3 of :func:`_act_2l_quant_v2_kernel`: fast path in the loop, exact redo of the slice after it."""
    pid_k = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.max_contiguous(tl.multiple_of(tl.arange(0, G), G), G)
    row_ok = offs_m < M
    t, ok, safe_t = _2l_row_scale(ap_ptr, stride_aps, offs_m, row_ok, SPLIT, SPLIT_P2)
    t_fast = (t >= _FAST_LO) & (t <= _FAST_HI)
    t7 = safe_t * 7.0
    k_begin = pid_k * STEPS_PER_SLICE * G
    k_end = tl.minimum(k_begin + STEPS_PER_SLICE * G, K)
    n_bad = tl.zeros((BLOCK_M,), tl.int32)
    for k0 in range(k_begin, k_end, G):
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :], mask=row_ok[:, None], other=0.0)
        _, xs = _smooth_fast(x, smooth_ptr + k0 + offs_k, rl_ptr + k0 + offs_k, EMU_FMA)
        gmax = _row_absmax_nan(xs, xs)
        n_bad += (row_ok & ~(t_fast & (gmax <= _FAST_HI * 4.0))).to(tl.int32)  # NaN gmax → bad
        e = _2l_fast_codes(xs, gmax, safe_t, t7, EMU_FMA)
        tl.store(e_ptr + offs_m[:, None] * stride_em + (k0 + offs_k)[None, :], e, mask=row_ok[:, None])
    if pid_k == 0:
        tl.store(t_ptr + offs_m, t, mask=row_ok)
    if tl.max(n_bad, axis=0) > 0:
        tl.debug_barrier()
        for k0 in range(k_begin, k_end, G):
            xs = _smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, k0 + offs_k, M)
            e = _2l_quantize(xs, safe_t, ok, BLOCK_M, 1, G)
            tl.store(e_ptr + offs_m[:, None] * stride_em + (k0 + offs_k)[None, :], e, mask=row_ok[:, None])


@triton.jit
def _sum_partials_kernel(sp_ptr, stride_sps, stride_spm, s_ptr, stride_sm, M, R, SPLIT,
                         SPLIT_P2: tl.constexpr, BLOCK_R: tl.constexpr):
    """S[m] = Σ_slices partial[slice, m] for one row per program: one [SPLIT, R] tile, a fixed-shape
    reduction tree (deterministic: same order every call)."""
    m = tl.program_id(0)
    offs_s = tl.arange(0, SPLIT_P2)
    offs_r = tl.arange(0, BLOCK_R)
    mask = (offs_s[:, None] < SPLIT) & (offs_r[None, :] < R)
    part = tl.load(sp_ptr + offs_s[:, None] * stride_sps + m * stride_spm + offs_r[None, :], mask=mask, other=0.0)
    tl.store(s_ptr + m * stride_sm + offs_r, tl.sum(part, axis=0), mask=offs_r < R)


# --- fused: ONE launch for decode (M ≤ 64) -------------------------------------------------------------
# The split path costs 2 (g64) / 3 (2l) dependent launches at decode, each ~3–5 µs inside a CUDA graph
# (H200: M=1 g64 15.3 µs, 2l 20.5 µs for ~40 KB of traffic). Here one grid holds two kinds of programs:
#   * S programs (row block rb, K slice): S partial over the slice → fp32 slab; an int32 arrival ticket
#     per row block elects the LAST arriver, which sums all slabs of its block with one fixed-shape
#     reduction (same tree whatever the arrival order → bit-identical S every call) and resets its
#     ticket to 0 (the buffer is persistent: CUDA-graph safe, no per-call memset);
#   * quant programs (QM rows × QK columns): quantize independently of the S programs. int4_2l needs the
#     whole row's absmax first: each unit recomputes it from the full rows (QM·K·2 bytes, L2-resident;
#     max is order-independent, so t has the same bits as the old stats pass) instead of a stats launch.
# Numerics are v1's (div_rn, split-TF32 S), so q / scales / t are bit-identical to the other paths.
# the electing program's [SPLIT, rows, BLOCK_R] fp32 sum tile: ≤ 64 KB, 128 regs/thread at 4 warps. ptxas
# (sm_90, 4 warps): BK=128 S step + [32, 16, 32] tile 162 regs, no spills; a [64, 16, 32] tile or a
# BK=256 split-TF32 step hit 255 regs with 56–68 B of spills.
_FUSED_SUM_ELEMS = 16384
_FUSED_MAX_BK = 128


@triton.jit
def _fused_s_program(x_ptr, stride_xm, smooth_ptr, a_ptr, stride_ar, sp_ptr, stride_sps, stride_spm,
                     s_ptr, stride_sm, cnt_ptr, pid, M, K, R, SPLIT, STEPS_PER_SLICE, ROT,
                     BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
                     SPLIT_P2: tl.constexpr, SUM_ROWS: tl.constexpr):
    """S partial of (row block, slice); the last arriver of the row block writes S = Σ partials."""
    rb = pid // SPLIT
    sl = (pid % SPLIT + ROT) % SPLIT  # ROT (tests): permutes which program owns which slice
    offs_m = rb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    offs_k = tl.arange(0, BLOCK_K)
    k_begin = sl * STEPS_PER_SLICE * BLOCK_K
    k_end = tl.minimum(k_begin + STEPS_PER_SLICE * BLOCK_K, K)
    s_acc = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        xs = _smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, k0 + offs_k, M)
        s_acc = _down(s_acc, xs, a_ptr, stride_ar, k0 + offs_k, offs_r, R)
    smask = (offs_m[:, None] < M) & (offs_r[None, :] < R)
    if SPLIT_P2 == 1:
        tl.store(s_ptr + offs_m[:, None] * stride_sm + offs_r[None, :], s_acc, mask=smask)
    else:
        tl.store(sp_ptr + sl * stride_sps + offs_m[:, None] * stride_spm + offs_r[None, :], s_acc, mask=smask)
        tl.debug_barrier()  # every thread's slab stores precede the (one-thread) release
        ticket = tl.atomic_add(cnt_ptr + rb, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT - 1:
            # SUM_ROWS ≥ the block's valid rows (min(BLOCK_M, M) ≤ SUM_ROWS): one tile, all loads in flight
            offs_s = tl.arange(0, SPLIT_P2)
            offs_j = rb * BLOCK_M + tl.arange(0, SUM_ROWS)
            ptrs = (sp_ptr + offs_s[:, None, None] * stride_sps + offs_j[None, :, None] * stride_spm
                    + offs_r[None, None, :])
            jr = (offs_j[:, None] < M) & (offs_r[None, :] < R)
            part = tl.load(ptrs, mask=(offs_s[:, None, None] < SPLIT) & jr[None, :, :], other=0.0,
                           cache_modifier=".cg")
            tl.store(s_ptr + offs_j[:, None] * stride_sm + offs_r[None, :], tl.sum(part, axis=0), mask=jr)
            tl.atomic_xchg(cnt_ptr + rb, 0, sem="relaxed", scope="gpu")  # ready for the next launch


# Rank-split S (s_ranks ≥ 1, the default for M ≤ FUSED_RANK_MAX_M): the ticket path above pays, after its
# loads, a dependent chain of slab store → gpu-scope release + ticket atomic (a cold L2 line) → reload of
# every slab → sum → store, ~3 extra global round trips on top of the one-launch floor; and its split-TF32
# MMA pads M=1 to 16 rows. Here an S program owns SR rows × RB ranks over ALL of K: loads (x, λ, A rows),
# fp32 FMAs, one in-program fixed-shape reduction, store. No slabs, no atomics, no ticket: the chain is
# the floor's (load → math → store). Each program re-reads its x rows (L2; R/RB programs per row block)
# and A is read once per row block — cheap at decode (M=1: r programs × 24 KB). The K chunks are
# unrolled (static_range) so all their loads can be in flight together (sm_90 at M=1: 12 LDG.128 per thread;
# ptxas spreads them over several round trips unless LOADS_FIRST, see _loads_in_flight). S: fp32 FMAs of (x / λ)·A with the approximate divide (div.full.f32, ≤ 2 ulp:
# S is compared to float64 at ~1e-6; only q / scales must be exact, and they keep div_rn), same bits
# every call (fixed layout, fixed reduction tree), not the ticket path's bits.
@triton.jit
def _fused_s_rank_program(x_ptr, stride_xm, smooth_ptr, a_ptr, stride_ar, s_ptr, stride_sm, pid, M, K, R,
                          SR: tl.constexpr, RB: tl.constexpr, CK: tl.constexpr, NCH: tl.constexpr,
                          LOADS_FIRST: tl.constexpr):
    """S[rows, ranks] for SR rows × RB ranks over all of K; tile row i is (row i // RB, rank i % RB)."""
    TR: tl.constexpr = SR * RB
    n_rg = tl.cdiv(R, RB)
    i = tl.arange(0, TR)
    offs_m = (pid // n_rg) * SR + i // RB
    offs_r = (pid % n_rg) * RB + i % RB
    ok = (offs_m < M) & (offs_r < R)
    acc = tl.zeros((TR, CK), tl.float32)
    for c in tl.static_range(NCH):
        offs_k = c * CK + tl.arange(0, CK)
        k_ok = offs_k < K
        m2 = ok[:, None] & k_ok[None, :]
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=m2, other=0.0)
        a = tl.load(a_ptr + offs_r[:, None] * stride_ar + offs_k[None, :], mask=m2, other=0.0)
        lam = tl.load(smooth_ptr + offs_k, mask=k_ok, other=1.0)
        if LOADS_FIRST:
            lamf = _gated_on_loads(lam, x, a)
            acc += (x.to(tl.float32) / lamf[None, :]) * a.to(tl.float32)
        else:
            acc += (x.to(tl.float32) / lam.to(tl.float32)[None, :]) * a.to(tl.float32)
    tl.store(s_ptr + offs_m * stride_sm + offs_r, tl.sum(acc, axis=1), mask=ok)


# LOADS_FIRST (fused programs). ptxas (sm_90) issues the loads of these short programs lazily, next to their first
# use, so one step's loads take several dependent L2/DRAM round trips. SASS, loads issued per wave (a wave ends at
# the first instruction that reads a pending load; K = 4096, 4 warps):
#   * rank-split S program: g64 M=1 [4, 2, 2, 1, 1, 2] (its four A loads only after all 32 divisions), g64 M=16
#     [3, 6, 4, 2, 1, 1, 1, 2], 2l M=1 [2, 4, 1, 2, 3] — although the PTX issues every load of a chunk first;
#   * g64 quant unit: [2, 2] — its hi half is loaded after the lo half's div.rn, whose slow-path CALL ptxas does
#     not move loads across.
# With LOADS_FIRST: S [12], [10, 10] (one wave per K chunk), [12]; unit [4]. The unit loads both halves, then a
# CTA barrier (ptxas cannot move a global load across one). The S program gates λ — so every division, so every
# use of x and A — on one CTA-wide reduction over all the chunk's loaded elements (:func:`_gated_on_loads`); a
# barrier alone does not do it there: ptxas hoists the divisions above it and interleaves the loads with them again.
@triton.jit
def _loads_in_flight(LOADS_FIRST: tl.constexpr):
    if LOADS_FIRST:
        tl.debug_barrier()


@triton.jit
def _raw_bits(v):
    """The stored bits of a 16- or 32-bit float tensor as int32 (no conversion of the value)."""
    if v.dtype.primitive_bitwidth == 16:
        return v.to(tl.int16, bitcast=True).to(tl.int32)
    else:
        return v.to(tl.int32, bitcast=True)


@triton.jit
def _gated_on_loads(lam, x, a):
    """λ as fp32 [CK], made to depend on a CTA max over the stored bits of every element of x, A [TR, CK] and λ:
    the select is never taken (the max of non-negative ints), but it comes through shuffles and shared memory, so
    no division can be scheduled before all loads have landed — and so all of them are issued first. The stored
    bits keep the 16-bit values packed while they wait (sm_90, g64 M=1: 77 registers; on the fp32 values 119)."""
    bits = (_raw_bits(x) | _raw_bits(a) | _raw_bits(lam)[None, :]) & 0x7FFFFFFF
    return tl.where(tl.max(tl.max(bits, axis=1), axis=0) < 0, 1.0, lam.to(tl.float32))


@triton.jit
def _load_x_lam(x_ptr, stride_xm, smooth_ptr, offs_m, offs_k, row_ok, k_ok):
    """(x[offs_m, offs_k], λ[offs_k]) as stored, rows and columns masked (x 0, λ 1 outside)."""
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=row_ok[:, None] & k_ok[None, :],
                other=0.0)
    return x, tl.load(smooth_ptr + offs_k, mask=k_ok, other=1.0)


@triton.jit
def _div_lam(x, lam):
    """x / λ in fp32, correctly rounded (λ broadcast over rows)."""
    return tl.math.div_rn(x.to(tl.float32), lam.to(tl.float32)[None, :])


@triton.jit
def _load_smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, offs_k, row_ok, k_ok):
    """x[offs_m, offs_k] / λ[offs_k] in fp32, rows and columns masked (0 outside)."""
    x, lam = _load_x_lam(x_ptr, stride_xm, smooth_ptr, offs_m, offs_k, row_ok, k_ok)
    return _div_lam(x, lam)


@triton.jit
def _fused_2l_unit(x_ptr, stride_xm, smooth_ptr, e_ptr, stride_em, t_ptr, u, QS, M, K,
                   G: tl.constexpr, QM: tl.constexpr, QK: tl.constexpr, CH: tl.constexpr):
    """Rows [r0, r0 + QM), columns chunk c of QK: row scale t from the full rows, then e = q·v."""
    c = u % QS
    offs_m = (u // QS) * QM + tl.arange(0, QM)
    row_ok = offs_m < M
    # the unit's own columns are loaded first (raw 16-bit: half the registers of fp32 across the loop):
    # independent of the row absmax, so the load is in flight with the row loop's (before: issued after
    # the dynamic loop, a second dependent round trip)
    offs_q = c * QK + tl.arange(0, QK)
    q_ok = offs_q < K
    x_q = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_q[None, :], mask=row_ok[:, None] & q_ok[None, :],
                  other=0.0)
    lam_q = tl.load(smooth_ptr + offs_q, mask=q_ok, other=1.0)
    amax = tl.zeros((QM,), tl.float32)
    n_nan = tl.zeros((QM,), tl.int32)
    for k0 in range(0, K, CH):
        offs_k = k0 + tl.arange(0, CH)
        xs = _load_smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, offs_k, row_ok, offs_k < K)
        amax = tl.maximum(amax, tl.max(tl.abs(xs), axis=1))
        n_nan += tl.sum((xs != xs).to(tl.int32), axis=1)
    t = tl.math.div_rn(amax, 105.0)  # same expression as _2l_row_scale: same bits
    t = tl.where(t == 0.0, 1.0, t)
    t = tl.where(n_nan > 0, float("nan"), t)
    ok = _is_finite(t)
    xs_q = tl.math.div_rn(x_q.to(tl.float32), lam_q.to(tl.float32)[None, :])  # = _load_smoothed's values
    e = _2l_quantize(xs_q, tl.where(ok, t, 1.0), ok, QM, QK // G, G)
    tl.store(e_ptr + offs_m[:, None] * stride_em + offs_q[None, :], e, mask=row_ok[:, None] & q_ok[None, :])
    if c == 0:
        tl.store(t_ptr + offs_m, t, mask=row_ok)


@triton.jit
def _g64_unit_columns(u, QS, M, K, QM: tl.constexpr, QK: tl.constexpr):
    """Quant unit u of the g64 outputs: (column chunk c, rows offs_m [QM] and their mask, byte columns col [QK/2] of
    the chunk, its lo nibble columns k_lo (the hi ones are k_lo + 32; see _quant_g64_step) and their mask —
    K % 64 == 0: a packed block is all in or all out)."""
    c = u % QS
    offs_m = (u // QS) * QM + tl.arange(0, QM)
    row_ok = offs_m < M
    col = tl.arange(0, QK // 2)
    k_lo = c * QK + (col // 32) * 64 + (col % 32)
    return c, offs_m, row_ok, col, k_lo, k_lo < K


@triton.jit
def _fused_g64_unit(x_ptr, stride_xm, smooth_ptr, q_ptr, stride_qm, sc_ptr, stride_sg, u, QS, M, K,
                    G: tl.constexpr, QM: tl.constexpr, QK: tl.constexpr, SCALE_BF16: tl.constexpr,
                    F8: tl.constexpr, LOADS_FIRST: tl.constexpr, UNSIGNED: tl.constexpr = False, shift_ptr=None):
    """Rows [r0, r0 + QM), columns chunk c of QK (whole groups): packed int4 + 16-bit group scales, or (F8)
    the e4m3 codes + xab rows (:func:`_store_g64`); UNSIGNED (F8 only): the codes of x/λ + shift."""
    HALF: tl.constexpr = QK // 2
    NGS: tl.constexpr = QK // G
    c, offs_m, row_ok, col, k_lo, k_ok = _g64_unit_columns(u, QS, M, K, QM, QK)
    x_lo, lam_lo = _load_x_lam(x_ptr, stride_xm, smooth_ptr, offs_m, k_lo, row_ok, k_ok)
    if LOADS_FIRST:
        x_hi, lam_hi = _load_x_lam(x_ptr, stride_xm, smooth_ptr, offs_m, k_lo + 32, row_ok, k_ok)
        _loads_in_flight(LOADS_FIRST)
    xs_lo = _div_lam(x_lo, lam_lo)
    if not LOADS_FIRST:
        x_hi, lam_hi = _load_x_lam(x_ptr, stride_xm, smooth_ptr, offs_m, k_lo + 32, row_ok, k_ok)
    xs_hi = _div_lam(x_hi, lam_hi)
    if UNSIGNED:
        q_lo, q_hi, scale = _g64_codes_unsigned(xs_lo + tl.load(shift_ptr + k_lo, mask=k_ok, other=0.0)[None, :],
                                                xs_hi + tl.load(shift_ptr + k_lo + 32, mask=k_ok, other=0.0)[None, :],
                                                QM, NGS, G // 2, SCALE_BF16)
    else:
        q_lo, q_hi, scale = _g64_codes(xs_lo, xs_hi, QM, NGS, G // 2, SCALE_BF16)
    gi = c * NGS + tl.arange(0, NGS)
    _store_g64(q_ptr, stride_qm, sc_ptr, stride_sg, q_lo, q_hi, scale, offs_m, k_lo, c * HALF + col, gi,
               row_ok[:, None] & k_ok[None, :], row_ok[:, None] & (gi < K // G)[None, :], M, QM, NGS, G // 2,
               SCALE_BF16, F8)


@triton.jit
def _g64_live_scales(xs, BM: tl.constexpr, NG: tl.constexpr, G: tl.constexpr, SCALE_BF16: tl.constexpr):
    """Smoothed columns [BM, NG·G] (whole groups) → the 16-bit scale of every group that gets a nonzero code, 0 for
    the others [BM, NG]. :func:`_group_codes` gives a group with no NaN and a finite nonzero scale RN16(top / 7) a
    code of magnitude ≥ 4 at its largest element (the scale is within a factor 2 of top / 7, subnormal or not); a
    NaN group (NaN scale), an Inf group (Inf scale) and a group whose scale rounds to 0 (made 1: every |x| < ½) get
    only zeros."""
    v = tl.reshape(xs, (BM, NG, G))
    top = tl.max(tl.abs(v), axis=2)
    n_nan = tl.sum((v != v).to(tl.int32), axis=2)
    s = _round_scale16(tl.math.div_rn(top, 7.0), SCALE_BF16)
    return tl.where((n_nan == 0) & (s > 0.0) & (s < float("inf")), s, 0.0)


@triton.jit
def _fused_g64_f16_unit(x_ptr, stride_xm, smooth_ptr, x16_ptr, stride_x16, t_ptr, u, QS, M, K,
                        G: tl.constexpr, QM: tl.constexpr, QK: tl.constexpr, CH: tl.constexpr,
                        SCALE_BF16: tl.constexpr):
    """Rows [r0, r0 + QM), columns chunk c of QK: the int4_g64 decode kernel's fp16 token operand straight from x —
    ``w4_expand.f16_act_operands`` of this kernel's packed output, bit for bit. The row's power of two p needs the
    largest scale of its live groups, so the unit first walks the whole row (CH columns at a time, as the 2l unit
    does for its absmax: L2-resident re-reads), then codes its own chunk exactly as the packed unit does and stores
    q·scale·2⁻ᵖ as fp16 at the permuted columns (``w4_expand.F16_K_PERM``); chunk 0 stores t = 2ᵖ."""
    NGS: tl.constexpr = QK // G
    c, offs_m, row_ok, col, k_lo, k_ok = _g64_unit_columns(u, QS, M, K, QM, QK)
    # the unit's own columns first, as raw 16-bit values: in flight during the row walk, which does not need them
    x_lo, lam_lo = _load_x_lam(x_ptr, stride_xm, smooth_ptr, offs_m, k_lo, row_ok, k_ok)
    x_hi, lam_hi = _load_x_lam(x_ptr, stride_xm, smooth_ptr, offs_m, k_lo + 32, row_ok, k_ok)
    top = tl.zeros((QM,), tl.float32)
    for k0 in range(0, K, CH):
        offs_k = k0 + tl.arange(0, CH)
        xs = _load_smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, offs_k, row_ok, offs_k < K)
        top = tl.maximum(top, tl.max(_g64_live_scales(xs, QM, CH // G, G, SCALE_BF16), axis=1))
    p = f16_row_exponent(top)
    q_lo, q_hi, scale = _g64_codes(_div_lam(x_lo, lam_lo), _div_lam(x_hi, lam_hi), QM, NGS, G // 2, SCALE_BF16)
    sd = _bcast_groups(f16_scaled_down(scale, p[:, None]), QM, NGS, G // 2)
    row = x16_ptr + offs_m.to(tl.int64)[:, None] * stride_x16
    mask = row_ok[:, None] & k_ok[None, :]
    tl.store(row + f16_column(k_lo)[None, :], (q_lo.to(tl.float32) * sd).to(tl.float16), mask=mask)
    tl.store(row + f16_column(k_lo + 32)[None, :], (q_hi.to(tl.float32) * sd).to(tl.float16), mask=mask)
    if c == 0:
        tl.store(t_ptr + offs_m, f16_row_power(p), mask=row_ok)


@triton.jit
def _act_quant_fused_kernel(
    x_ptr, stride_xm,          # (M, K) bf16/fp16
    smooth_ptr,                # (K,)
    q_ptr, stride_qm,          # g64: (M, K/2) uint8 packed; 2l: (M, K) int8 e = q·v
    sc_ptr, stride_sg,         # g64: (K/G, M) 16-bit scales; 2l: (M,) fp32 row scales t (stride unused)
    a_ptr, stride_ar,          # (R, K) lora_down
    sp_ptr, stride_sps, stride_spm,  # (SPLIT, M, R) fp32 S slabs (unused when SPLIT = 1)
    s_ptr, stride_sm,          # (M, R) fp32 S
    cnt_ptr,                   # (≥ row blocks,) int32 tickets: zero on entry, left zero on exit
    M, K, R, SPLIT, STEPS_PER_SLICE, N_SPROG, QS, ROT,
    TWO_LEVEL: tl.constexpr, G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr, SPLIT_P2: tl.constexpr, SUM_ROWS: tl.constexpr, QM: tl.constexpr,
    QK: tl.constexpr, CH: tl.constexpr, SCALE_BF16: tl.constexpr,
    S_RANK: tl.constexpr = False, SR: tl.constexpr = 1, RB: tl.constexpr = 1, CK: tl.constexpr = 64,
    NCH: tl.constexpr = 1, F8: tl.constexpr = False, PDL: tl.constexpr = False, LOADS_FIRST: tl.constexpr = False,
    LATE_DEPS: tl.constexpr = False, UNSIGNED: tl.constexpr = False, shift_ptr=None, F16: tl.constexpr = False,
):
    """Programs [0, N_SPROG): S — (row block, K slice) + ticket, or with S_RANK (SR rows, RB ranks) over all
    of K; the rest: quant unit u = pid − N_SPROG (rows (u // QS)·QM …, column chunk u % QS).
    F16 (g64): q / sc are the decode kernel's fp16 token operand x16 [M, K] / t [M] (:func:`_fused_g64_f16_unit`).
    F8 (g64): q / sc are the e4m3 operands x8 [M, K] / xab [K/G, 2, M] (:func:`_store_g64`); with UNSIGNED
    (``shift_ptr`` fp32 [K]) their codes are 0…15 of x/λ + shift (:func:`_g64_codes_unsigned`), S unshifted.
    PDL (kernels/pdl.py): every program first lets the next kernel (the GEMM) be scheduled, so it can start
    its weight loads during this one, then waits for the previous kernel (x's producer) before its first
    global access — x, λ, A and also the tickets and outputs (a predecessor may still read them).
    LOADS_FIRST: the rank-split S program and the g64 quant unit issue all their loads before the first use
    (:func:`_loads_in_flight`).
    LATE_DEPS (``act_quant(early_launch=False)``, chosen per GEMV route by ``w4a4_gemv.act_quant_early_launch``;
    env ``LOWRANK_GEMM_ACT_QUANT_EARLY_DEPS`` overrides): no ``launch_dependents`` — each program lets the next
    kernel be scheduled only by exiting, so that kernel's early weight loads (the GEMV's first chunk, ~7 MB at
    N = 28672) do not compete with this kernel's own."""
    if PDL:
        if not LATE_DEPS:
            gdc_launch_dependents()
        gdc_wait()
    pid = tl.program_id(0)
    if pid < N_SPROG:
        if S_RANK:  # constexpr: the ticket code (atomics, slab sum) is not even compiled
            _fused_s_rank_program(x_ptr, stride_xm, smooth_ptr, a_ptr, stride_ar, s_ptr, stride_sm, pid, M, K,
                                  R, SR, RB, CK, NCH, LOADS_FIRST)
        else:
            _fused_s_program(x_ptr, stride_xm, smooth_ptr, a_ptr, stride_ar, sp_ptr, stride_sps, stride_spm,
                             s_ptr, stride_sm, cnt_ptr, pid, M, K, R, SPLIT, STEPS_PER_SLICE, ROT,
                             BLOCK_M, BLOCK_K, BLOCK_R, SPLIT_P2, SUM_ROWS)
    elif F16:
        _fused_g64_f16_unit(x_ptr, stride_xm, smooth_ptr, q_ptr, stride_qm, sc_ptr, pid - N_SPROG, QS, M, K,
                            G, QM, QK, CH, SCALE_BF16)
    elif TWO_LEVEL:
        _fused_2l_unit(x_ptr, stride_xm, smooth_ptr, q_ptr, stride_qm, sc_ptr, pid - N_SPROG, QS, M, K,
                       G, QM, QK, CH)
    else:
        _fused_g64_unit(x_ptr, stride_xm, smooth_ptr, q_ptr, stride_qm, sc_ptr, stride_sg, pid - N_SPROG, QS,
                        M, K, G, QM, QK, SCALE_BF16, F8, LOADS_FIRST, UNSIGNED, shift_ptr)


MAX_SPLIT = 64  # K slices per row block: bounds the partials' size and the reduce tile
MAX_FUSED_SPLIT = 256  # fused: one G-wide slice per program up to K = 16384 at M = 1


VARIANTS = ("v1", "v2", "v3", "fused")
# Pin the kernel variant without code changes:
#   LOWRANK_GEMM_ACT_QUANT=v1|v2|fused         every M;
#   LOWRANK_GEMM_ACT_QUANT_SMALL=v1|v2|fused   M ≤ 64 only (default fused; v1 = the old multi-launch path);
#   LOWRANK_GEMM_ACT_QUANT_LARGE=v2|v3         M > 64 only (default v3).
# Large M (> 64) defaults to v3: H200, M=4608, same process (probes/act_quant_large_s4.md): g64 74.3 → 42.9 µs
# (K=3072), 249.1 → 98.3 (K=12288, split 16); 2l 61.7 → 54.0, 191.3 → 138.2 (split 16).
_ENV_VARIANT = getenv("LOWRANK_GEMM_ACT_QUANT", "").strip() or None
_ENV_LARGE = getenv("LOWRANK_GEMM_ACT_QUANT_LARGE", "").strip() or None
# v3 K slices: enough programs for V3_WAVES per SM (v2: 2), and at most V3_MAX_STEPS K steps per slice — the
# K=12288 sweep (192 steps) ran best at split 16 (12 steps per slice: g64 98.3 µs vs 114.0 at the wave-sized
# split 8), K=3072 (48 steps) at the wave-sized split 8. LOWRANK_GEMM_ACT_QUANT_V3_WAVES overrides the waves.
V3_WAVES = int(getenv("LOWRANK_GEMM_ACT_QUANT_V3_WAVES", "").strip() or 4)
V3_MAX_STEPS = 12
_ENV_SMALL = getenv("LOWRANK_GEMM_ACT_QUANT_SMALL", "").strip() or None
SMALL_M = 64


class ActQuantPlan(NamedTuple):
    """How act_quant tiles X: rows per program, columns per step (whole groups), K slices per row block
    (S partials summed afterwards), steps per slice, warps, kernel variant (``v1`` | ``v2`` | ``fused``);
    fused only: quant unit of ``quant_rows`` rows × ``quant_cols`` columns (0 elsewhere), and the S mode:
    ``s_ranks`` = 0 → (row block, K slice) programs + ticketed sum (block_m / block_k / split apply);
    ``s_ranks`` ≥ 1 → rank-split: ``s_rows`` rows × ``s_ranks`` ranks per program over all of K."""

    block_m: int
    block_k: int
    split: int
    steps_per_slice: int
    num_warps: int
    variant: str = "v1"
    quant_rows: int = 0
    quant_cols: int = 0
    s_rows: int = 0
    s_ranks: int = 0


def _block_k(k: int, group_size: int, want: int) -> int:
    """Widest step ≤ ``want`` that is whole groups and divides K (K % G == 0, so G always qualifies)."""
    for bk in (256, 128, 64):
        if bk <= max(want, group_size) and bk % group_size == 0 and k % bk == 0:
            return bk
    return group_size


def _pow2_floor(v: int) -> int:
    return 1 << (max(1, v).bit_length() - 1)


# Fused S mode: LOWRANK_GEMM_ACT_QUANT_FUSED_S=ticket|rank pins it for every M; unset → rank-split for
# M ≤ FUSED_RANK_MAX_M, ticket above (the rank path re-reads X once per rank group: predicted to lose at M=64).
_ENV_FUSED_S = getenv("LOWRANK_GEMM_ACT_QUANT_FUSED_S", "").strip() or None
FUSED_RANK_MAX_M = 16
_RANK_TILE_ELEMS = 4096  # [SR·RB, CK] per K chunk: 32 fp32 per thread at 4 warps
# Fused LOADS_FIRST (see _loads_in_flight): LOWRANK_GEMM_ACT_QUANT_LOADS_FIRST=0/1, read per call (one process can
# A/B it), else on for M ≤ LOADS_FIRST_MAX_M. H200 (probes/s5/probe_actquant_decode, K=4096, r=32, alone): g64 M=1
# 3.59 → 2.99 µs (layer f8+PDL 33.9 → 32.5), 2l M=1 neutral (4.26 → 4.29); M=16 worse (g64 4.06 → 4.54, 2l 5.16 →
# 5.40: more registers, fewer programs per SM), M=64 neutral. Only M=1 was measured below 16.
LOADS_FIRST_MAX_M = 1


def _early_deps(early_launch: bool | None = None) -> bool:
    """Whether the fused kernel's programs let the next kernel launch as they start (True) or only as they exit:
    env ``LOWRANK_GEMM_ACT_QUANT_EARLY_DEPS`` (0 / 1, read per call) if set, else ``early_launch`` (the caller's
    choice for the kernel that follows: w4a4_gemv.act_quant_early_launch), else True."""
    env = getenv("LOWRANK_GEMM_ACT_QUANT_EARLY_DEPS", "")
    if env in ("0", "1"):
        return env == "1"
    return True if early_launch is None else bool(early_launch)


def _loads_first_default(m: int) -> bool:
    env = getenv("LOWRANK_GEMM_ACT_QUANT_LOADS_FIRST", "")
    return env == "1" if env in ("0", "1") else m <= LOADS_FIRST_MAX_M


def _fused_s_mode(m: int, s_rows, s_ranks) -> tuple[int, int]:
    """(s_rows, s_ranks) of the fused S programs; s_ranks = 0 is the ticket path."""
    if s_ranks is None:
        mode = _ENV_FUSED_S or ("rank" if m <= FUSED_RANK_MAX_M else "ticket")
        if mode not in ("rank", "ticket"):
            raise ValueError(f"LOWRANK_GEMM_ACT_QUANT_FUSED_S must be 'rank' or 'ticket', got {mode!r}")
        s_ranks = 1 if mode == "rank" else 0
    if s_ranks == 0:
        return 0, 0
    # every unrolled chunk's loads are live at once in the PTX, so registers grow with SR:
    # sm_90, 4 warps, K = 4096, 2l: SR 1/2/4 → 105/112/164 registers, SR 8 → 255 + 73 spill stores
    sr = s_rows or min(next_pow2(max(m, 1)), 2 if m <= FUSED_RANK_MAX_M else 4)
    if sr & (sr - 1) or s_ranks & (s_ranks - 1) or s_ranks < 0:
        raise ValueError(f"fused act_quant: s_rows and s_ranks must be powers of two, got s_rows={sr}, "
                         f"s_ranks={s_ranks}")
    return sr, s_ranks


def _rank_chunks(k: int, sr: int, rb: int) -> tuple[int, int]:
    """(CK, NCH): K columns per unrolled chunk of a rank-split S program and the chunk count."""
    ck = min(next_pow2(k), max(64, _RANK_TILE_ELEMS // (sr * rb)))
    return ck, cdiv(k, ck)


def _plan_fused(m: int, k: int, group_size: int, fmt: str, rank: int, split, block_m, block_k, num_warps,
                quant_rows, quant_cols, s_rows=None, s_ranks=None) -> ActQuantPlan:
    """Fused (one launch). S programs: 16-row blocks, one step per slice where the electing program's
    sum tile [SPLIT, min(BM, M) rows, BLOCK_R] stays ≤ 64 KB (M=1: 64 slices of G columns at K=4096;
    M=16/64, r ≤ 32: 32 slices of 128 columns): one load round trip per program, no serial K loop.
    Quant units: 1 row × QK columns, QK = M·K/192 rounded to a power of two in [256 (g64) | 512 (2l),
    2048] (~128–256 units at M = 16–64; 2l units each re-read the row for its absmax, so ≥ 512)."""
    bm = block_m or 16
    rows = min(bm, next_pow2(max(m, 1)))
    cap = _pow2_floor(max(1, _FUSED_SUM_ELEMS // (rows * rank_block(rank))))
    cap = min(cap, MAX_FUSED_SPLIT)
    if block_k:
        bk = _block_k(k, group_size, block_k)
    else:
        bk = group_size
        while k // bk > cap and bk < _FUSED_MAX_BK and k % (2 * bk) == 0:
            bk *= 2
    nsteps = k // bk
    split = max(1, min(split or nsteps, nsteps, cap))
    sps = cdiv(nsteps, split)
    qm = quant_rows or 1
    lo = 512 if fmt == "int4_2l" else 256
    qk = quant_cols or min(2048, max(lo, next_pow2(cdiv(max(m, 1) * k, 192))))
    qk = max(group_size, min(qk, next_pow2(k)))
    if qm & (qm - 1) or qk & (qk - 1) or qk % group_size:
        raise ValueError(f"fused act_quant: quant_rows must be a power of two and quant_cols a power-of-two "
                         f"multiple of group_size={group_size}, got quant_rows={qm}, quant_cols={qk}")
    sr, rb = _fused_s_mode(m, s_rows, s_ranks)
    return ActQuantPlan(bm, bk, cdiv(nsteps, sps), sps, num_warps or 4, "fused", qm, qk, sr, rb)


def _small_default(m: int, k: int, fmt: str) -> tuple[str, int | None]:
    """(variant, s_ranks) for M ≤ SMALL_M. Measured on the H200 (K=4096, r=32, graph µs; probes/act_quant_ab_s3 then
    act_quant_ab_s3b with the rank-split S): old v1 → fused: int4_2l 20.1 → 7.5 (M=1), 13.0 → 8.4 (M=16), 14.0 → 12.8
    (M=64, ticket S); int4_g64 15.3 → 7.7 (M=1), 10.0 → 7.9 (M=16), but 10.5 → 12.4 at M=64. So fused for int4_2l and
    for int4_g64 up to M=16; int4_g64 above: :func:`_g64_tens_of_rows`."""
    if fmt == "int4_2l" or m <= FUSED_G64_MAX_M:
        return "fused", None
    return _g64_tens_of_rows(m, k) if m > 16 else ("v1", None)


# int4_g64, FUSED_G64_MAX_M < M ≤ SMALL_M (probes/s10/actquant_midm, act_quant alone, graph µs, r = 32), v1 / fused
# rank-split S / v3:
#   K = 3072:  M = 17 12.1 / 3.7 / 9.0,  M = 32 6.0 / 4.2 / 9.1,  M = 64 6.5 / 5.4 / 9.7
#   K = 4096:  M = 17 12.2 / 4.4 / 9.4,  M = 48 6.7 / 6.0 / 9.9,  M = 64 6.7 / 7.5 / 10.0
#   K = 8192:  M = 17 20.6 / 7.3 / 10.1, M = 32 8.8 / 9.1 / 10.2, M = 64 9.5 / 15.1 / 11.2
#   K = 14336: M = 17 36.8 / 122 / 11.7, M = 32 13.3 / 42.6 / 11.8, M = 64 14.8 / 79.5 / 13.2
# The rank-split program walks all of K for its 4 rows (cost ∝ M·K per program, and its unrolled chunks spill past
# K = 8192); v1 is 2–3× slower when M is not a whole number of its 16-row blocks (M = 17 / 24 vs 32); v3 is flat.
RANK_S_MAX_MK = 48 * 4096
RANK_S_MAX_K = 8192
V3_MIN_K = 12288


def _g64_tens_of_rows(m: int, k: int) -> tuple[str, int | None]:
    if m * k <= RANK_S_MAX_MK and k <= RANK_S_MAX_K:
        return "fused", 1
    if k >= V3_MIN_K or m % 16:
        return "v3", None
    return "v1", None


F16_ROW_CHUNK = 2048


def f16_s_ranks(m: int, k: int) -> int:
    """The S programs of ``act_quant(out="f16")`` (always fused): rank-split (1) where :func:`_g64_tens_of_rows`
    takes it for the packed output, else the ticketed K-split sum (0) — the packed output's v1 / v3 there are not
    fused kernels. ``LOWRANK_GEMM_ACT_QUANT_FUSED_S`` (rank / ticket) overrides."""
    if _ENV_FUSED_S:
        return 1 if _ENV_FUSED_S == "rank" else 0
    return 1 if _g64_tens_of_rows(m, k) == ("fused", 1) else 0


# LOWRANK_GEMM_ACT_QUANT_G64_FUSED_MAX_M pins the int4_g64 fused/v1 boundary (0 = v1 always).
FUSED_G64_MAX_M = int(getenv("LOWRANK_GEMM_ACT_QUANT_G64_FUSED_MAX_M", "").strip() or 16)


def plan_act_quant(m: int, k: int, group_size: int, device=None, split: int | None = None,
                   block_m: int | None = None, block_k: int | None = None,
                   num_warps: int | None = None, variant: str | None = None, *, fmt: str = "int4_g64",
                   rank: int = 32, quant_rows: int | None = None, quant_cols: int | None = None,
                   s_rows: int | None = None, s_ranks: int | None = None) -> ActQuantPlan:
    """Memory-bound: aim at ≥ 2 programs per SM, splitting K across programs when there are too few row
    blocks (decode: M = 1 has one row block, so K is split).

    Large M (> 64): 64-row blocks, one group (G columns) per step, 4 warps. Measured on the H200 at FLUX
    fc1 (M=4608, K=3072; probes/probe_w4a4_actquant.md): v1 64×64 steps 83 µs (g64) / 109 µs (2l), against
    130/140 µs for 64×128 and 110/138 µs for the v1 32×64 tiles — wider steps lose (more registers,
    fewer programs in flight). That grid is already 72 row blocks × 4 K slices = 288 programs: v1 is
    issue-bound (~73 SASS instructions per element), not grid-bound; v2 (see the v2 kernels) cuts that.
    Small M (≤ 64): ``fused``, one launch (:func:`_plan_fused`; ``fmt`` and ``rank`` size it). The old
    split path (``v1``: 16 × G steps, K split ≤ 64 ways, 2–3 launches) measured 10–21 µs there.

    ``variant``: None → ``LOWRANK_GEMM_ACT_QUANT`` if set, else v2 for M > 64 and
    ``LOWRANK_GEMM_ACT_QUANT_SMALL`` or fused below. v2 needs G % 64 == 0 and always steps one group
    (block_k = G); where it does not apply, v1 is used. ``v3`` (same tiles and bits as v2, the exact path
    out of the loop; split sized for ``V3_WAVES`` programs per SM, ≤ ``V3_MAX_STEPS`` steps per slice) is the
    M > 64 default (``LOWRANK_GEMM_ACT_QUANT_LARGE=v2`` restores v2)."""
    large = m > SMALL_M
    if not (variant or _ENV_VARIANT or large or _ENV_SMALL):
        variant, ranks = _small_default(m, k, fmt)
        s_ranks = ranks if s_ranks is None else s_ranks
    variant = variant or _ENV_VARIANT or ((_ENV_LARGE or "v3") if large else _ENV_SMALL)
    if variant not in VARIANTS:
        raise ValueError(f"act_quant variant must be one of {VARIANTS}, got {variant!r}")
    if variant in ("v2", "v3") and group_size % 64:
        variant = "v1"
    if variant == "fused" and group_size & (group_size - 1):
        variant = "v1"  # tl.arange over groups needs a power-of-two G
    if variant == "fused":
        return _plan_fused(m, k, group_size, fmt, rank, split, block_m, block_k, num_warps, quant_rows, quant_cols,
                           s_rows, s_ranks)
    bm = block_m or (64 if large else 16)
    bk = group_size if variant in ("v2", "v3") else _block_k(k, group_size, block_k or group_size)
    warps = num_warps or (8 if bm * bk >= 64 * 256 else 4)
    nsteps = k // bk
    if split is None:
        sms = num_sms(device) if device is not None and device.type == "cuda" else 8
        split = cdiv((V3_WAVES if variant == "v3" else 2) * sms, cdiv(m, bm))
        if variant == "v3":
            split = max(split, cdiv(nsteps, V3_MAX_STEPS))
    split = max(1, min(split, nsteps, MAX_SPLIT))
    sps = cdiv(nsteps, split)
    return ActQuantPlan(bm, bk, cdiv(nsteps, sps), sps, warps, variant)


_PIECE_SHIFT = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}


_interpreting = interpreting


def _prep(x, smooth, lora_down, r: int, br: int, unscaled: bool = False):
    """v2 prep launch: RN(1/λ) [K] fp32 and the A'ᵀ pieces [3, K, BLOCK_R] (or a 1-element dummy); ``unscaled``
    (S feed "one"): the pieces at SHIFT 0, summed by the MMAs into one accumulator."""
    k = x.shape[1]
    # the MMA reads X as it is; the interpreter's bf16 dot is wrong, so there the pieces are fp32
    pdt = torch.float32 if (x.dtype == torch.bfloat16 and _interpreting()) else x.dtype
    shift = 0 if unscaled else _PIECE_SHIFT[pdt]
    rl = torch.empty((k,), device=x.device, dtype=torch.float32)
    pieces = torch.empty((3, k, br) if r else (1, 1, 1), device=x.device, dtype=pdt)
    a = lora_down if r else smooth
    bk = 128
    launch(_prep_kernel, (cdiv(k, bk),), smooth, a, a.stride(0) if r else 0, rl, pieces, pieces.stride(0), k, r,
           SHIFT=shift, BLOCK_K=bk, BLOCK_R=br, HAS_LOWRANK=r > 0, num_warps=4)
    return rl, pieces, shift


# S feed of the v3 first passes (S_FEEDS and the ledger: see _down_one): act_quant(s_feed=...), else
# LOWRANK_GEMM_ACT_QUANT_S_FEED=split|one|one_tma read per call, else "one" at rank ≤ S_FEED_ONE_MAX_RANK (the ranks
# whose ledger was checked: r = 16 / 32) and "split" above. "one": one accumulator, 2 stages, and the K split sized
# for ONE wave at the feed's occupancy (:func:`_one_wave_split`); "one_tma": the same, and X by TMA in the int4_2l
# stats pass (the g64 pass stays "one"). Applies to v3 with r > 0 and bf16 X only ("split" elsewhere: unscaled fp16
# pieces would underflow); "one_tma" falls back to "one" where X is not TMA-legal (tma.tma_ready). Same x_q / scales
# / t bits as "split"; S to fp32 rounding, not bit-identical to "split".
# H200, act_quant alone at M = 4608, rank 32, graph µs, split → one at the one-wave split (probes/s12/aq_feed,
# 3724c3a): int4_g64 e4m3 K = 3072 42.4 → 36.0, K = 12288 110.2 → 105.3; packed 37.0 → 32.4, 92.6 → 90.1; int4_2l
# 49.0 → 44.7, 132.3 → 122.9. "one" at the default split was level or slower for g64 (42.9, 117.5, 38.3, 101.6:
# still more programs than slots) and −4 / −1 µs for 2l; "one_tma" within 1.5 µs of "one" (not routed).
S_FEED_STAGES = 2
S_FEED_ONE_MAX_RANK = 32
# CTAs per SM of the "one" first passes at r ≤ 32 (sm_90 ledger: g64 124–128 registers → 4, 2l stats 91–96 → 5)
_ONE_FEED_CTAS = {"int4_g64": 4, "int4_2l": 5}
# ...which the unsigned g64 kernel (act_shift) keeps only under a register cap: ptxas gives it 130 (3 CTAs per SM, a
# 1.33-wave split; H200 FLUX fc2 185 µs against the signed 105, probes/s37); at 128 it does not spill (sm_90 ptxas)
_ONE_FEED_MAXNREG = 65536 // (_ONE_FEED_CTAS["int4_g64"] * 128)


def _s_feed(s_feed: str | None, x: torch.Tensor, r: int, variant: str) -> str:
    feed = s_feed or getenv("LOWRANK_GEMM_ACT_QUANT_S_FEED", "").strip() or (
        "one" if r <= S_FEED_ONE_MAX_RANK else "split")
    if feed not in S_FEEDS:
        raise ValueError(f"act_quant: s_feed (LOWRANK_GEMM_ACT_QUANT_S_FEED) must be one of {S_FEEDS}, got {feed!r}")
    if variant != "v3" or r == 0 or x.dtype != torch.bfloat16:
        return "split"
    return "one" if feed == "one_tma" and not tma_ready(x) else feed


def _fed_plan(plan: "ActQuantPlan", x: torch.Tensor, r: int, fmt: str, group_size: int, s_feed: str | None = None,
              split: int | None = None, block_m: int | None = None, block_k: int | None = None,
              num_warps: int | None = None) -> tuple["ActQuantPlan", str]:
    """(plan, S feed) of a v2 / v3 plan (other variants: "split"): the "one" feeds size the K split for one wave
    unless ``split`` is given (:func:`_one_wave_split`)."""
    feed = _s_feed(s_feed, x, r, plan.variant) if plan.variant in ("v2", "v3") else "split"
    if feed != "split" and split is None:
        m, k = x.shape
        plan = plan_act_quant(m, k, group_size, x.device, _one_wave_split(m, plan.block_m, fmt, x.device), block_m,
                              block_k, num_warps, plan.variant, fmt=fmt, rank=r)
    return plan, feed


def _one_wave_split(m: int, block_m: int, fmt: str, device) -> int:
    """K slices per row block so that every program of the "one" feed is resident at once: ⌊slots / row blocks⌋
    (the measured optimum at M = 4608: g64 split 7 at 4 CTAs per SM, 2l split 8 / 9 at 5; more slices than slots
    ran a second partial wave, K = 3072 g64: 42.9 vs 36.0 µs)."""
    sms = num_sms(device) if device is not None and device.type == "cuda" else 8
    return max(1, _ONE_FEED_CTAS[fmt] * sms // cdiv(m, block_m))


OUTPUTS = ("packed", "f8", "f16")
# variants that write the e4m3 operands themselves (out="f8"); the others quantize packed, then expand_act_f8
_F8_NATIVE = ("v1", "v3", "fused")


def _g64_outputs(m: int, k: int, group_size: int, dev, scale_dtype, f8: bool):
    """Fresh int4_g64 outputs: packed uint8 [M, K/2] + 16-bit scales [K/G, M], or (f8) x8 e4m3 [M, K] +
    xab fp32 [K/G, 2, M] (the layout of ``w4_expand.expand_act_f8``)."""
    if f8:
        return (torch.empty((m, k), device=dev, dtype=torch.float8_e4m3fn),
                torch.empty((k // group_size, 2, m), device=dev, dtype=torch.float32))
    return (torch.empty((m, k // 2), device=dev, dtype=torch.uint8),
            torch.empty((k // group_size, m), device=dev, dtype=scale_dtype))


def act_quant(x: torch.Tensor, smooth: torch.Tensor, lora_down: torch.Tensor, group_size: int = 64,
              fmt: str = "int4_g64", scale_dtype: torch.dtype = torch.bfloat16, *, out: str = "packed",
              split: int | None = None, block_m: int | None = None, block_k: int | None = None,
              num_warps: int | None = None, variant: str | None = None, quant_rows: int | None = None,
              quant_cols: int | None = None, s_rows: int | None = None, s_ranks: int | None = None,
              loads_first: bool | None = None, early_launch: bool | None = None, s_feed: str | None = None,
              act_shift: torch.Tensor | None = None, _slice_rot: int = 0):
    """Quantize ``x`` [M, K] (bf16/fp16, contiguous rows) after dividing by ``smooth`` [K].

    Returns ``(x_q, x_scale, lowrank_act)``:
      int4_g64: x_q uint8 [M, K/2], x_scale ``scale_dtype`` [K/G, M];
      int4_g64, ``out="f8"``: the operands of the e4m3 GEMM paths, x_q float8_e4m3fn [M, K] and x_scale =
                xab float32 [K/G, 2, M], bit-identical to ``w4_expand.expand_act_f8`` of the packed pair
                (``scale_dtype`` still sets the 16-bit scale xab is built from). The fused / v1 / v3 kernels
                write them directly (no packed intermediate, no expansion launch); v2 expands after;
      int4_g64, ``out="f16"``: the decode kernel's fp16 operands, x_q float16 [M, K] = q·scale·2⁻ᵖ with K permuted
                in every 16 columns and x_scale = t float32 [M] = 2ᵖ, bit-identical to ``w4_expand.f16_act_operands``
                of the packed pair; always the fused kernel (S programs as :func:`f16_s_ranks` picks);
      int4_2l:  x_q int8 [M, K],    x_scale float32 [M];
    and lowrank_act float32 [M, r] = (x / smooth) · lora_downᵀ (lora_down [r, K]; r may be 0).
    ``split`` (K slices per row block), ``block_m``, ``block_k`` (columns per step, a multiple of G that
    divides K; rounded down to one), ``num_warps``, ``variant`` (``v1`` | ``v2`` | ``fused``, same bits;
    v2 adds a tiny prep launch) and, for fused, ``quant_rows`` / ``quant_cols`` override the plan
    (:func:`plan_act_quant`), and ``s_ranks`` (0: ticketed K-split S; ≥ 1: rank-split S, ``s_rows`` rows
    per program) picks the fused S mode (default: ``LOWRANK_GEMM_ACT_QUANT_FUSED_S`` or rank for M ≤ 16);
    ``loads_first`` (fused; None: ``LOWRANK_GEMM_ACT_QUANT_LOADS_FIRST``, default off) makes the rank-split S
    programs and the g64 quant units issue all their loads before the first use (same bits).
    ``early_launch`` (fused, with PDL; None: on): the next kernel may launch as the programs start rather than as
    they exit (env ``LOWRANK_GEMM_ACT_QUANT_EARLY_DEPS`` overrides; same bits either way).
    ``s_feed`` (v3, r > 0, bf16 X; None: ``LOWRANK_GEMM_ACT_QUANT_S_FEED``, else ``"one"`` at r ≤ 32 and
    ``"split"`` above): how the first passes compute S — ``"one"`` / ``"one_tma"`` sum the three A' pieces in one
    accumulator, with the K split sized for one wave unless ``split`` is given (:data:`S_FEEDS`; same x_q / x_scale
    bits, S to fp32 rounding but not bit-identical to ``"split"``).
    ``act_shift`` (float32 [K], ``formats.int4.act_shift_vector``; int4_g64 with ``out="f8"``; the fused or v3
    kernel, v3 where the plan picks another): unsigned codes 0…15 of x/λ + act_shift
    (``formats.int4.quantize_act_uint4``), S still of the unshifted x/λ.
    ``_slice_rot`` (tests only) rotates which fused program owns which slice (ticket mode).
    Launches: fused one; v1/v2 g64 one kernel, 2l two passes (+ v2's prep, + the S reduce when split > 1).
    The fused kernel is launched with programmatic dependent launch when ``pdl.pdl_enabled`` (off by default).
    The fused path keeps a per-device int32 ticket buffer (zero between calls): calls that run
    concurrently on two streams of one device must not both use it (a graph replay is one call per node).
    Inputs are assumed validated by the op (``w4a4_gemm.check_linear_args``).
    """
    m, k = x.shape
    r = lora_down.shape[0]
    dev = x.device
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    if out not in OUTPUTS:
        raise ValueError(f"act_quant: out must be one of {OUTPUTS}, got {out!r}")
    f8 = out == "f8"
    if out != "packed" and (fmt != "int4_g64" or group_size % 64):
        raise ValueError(f"act_quant: out={out!r} (the {'e4m3' if f8 else 'fp16'} GEMM operands) needs fmt='int4_g64' "
                         f"and a group size that is a multiple of 64, got fmt={fmt!r}, group_size={group_size}")
    if out == "f16":
        if act_shift is not None or variant not in (None, "fused"):
            raise ValueError(f"act_quant: out='f16' runs the fused kernel on signed codes, got variant={variant!r}"
                             f"{', act_shift' if act_shift is not None else ''}")
        plan = plan_act_quant(m, k, group_size, dev, split, block_m, block_k, num_warps, "fused", fmt=fmt, rank=r,
                              quant_rows=quant_rows, quant_cols=quant_cols, s_rows=s_rows,
                              s_ranks=f16_s_ranks(m, k) if s_ranks is None else s_ranks)
        return _act_quant_fused(x, smooth, lora_down, group_size, fmt, scale_dtype, plan, _slice_rot,
                                loads_first=_loads_first_default(m) if loads_first is None else loads_first,
                                early_deps=_early_deps(early_launch), f16=True)
    if act_shift is not None:
        if not f8 or variant not in (None, "v3", "fused"):
            raise ValueError(f"act_quant: act_shift (unsigned codes) runs the v3 or fused kernel with out='f8', got "
                             f"out={out!r}, variant={variant!r}")
        if act_shift.dtype != torch.float32 or act_shift.shape != (k,) or act_shift.device != dev:
            raise ValueError(f"act_quant: act_shift must be float32 [K={k}] on {dev}, got {act_shift.dtype} "
                             f"{list(act_shift.shape)} on {act_shift.device}")
    plan = plan_act_quant(m, k, group_size, dev, split, block_m, block_k, num_warps, variant, fmt=fmt, rank=r,
                          quant_rows=quant_rows, quant_cols=quant_cols, s_rows=s_rows, s_ranks=s_ranks)
    if act_shift is not None and plan.variant not in ("v3", "fused"):      # the two kernels with the shift
        plan = plan_act_quant(m, k, group_size, dev, split, block_m, block_k, num_warps, "v3", fmt=fmt, rank=r)
    if f8 and plan.variant not in _F8_NATIVE:
        x_q, x_scale, lowrank_act = act_quant(x, smooth, lora_down, group_size, fmt, scale_dtype, split=split,
                                              block_m=block_m, block_k=block_k, num_warps=num_warps,
                                              variant=plan.variant)
        return (*expand_act_f8(x_q, x_scale, group_size), lowrank_act)
    if plan.variant == "fused":
        return _act_quant_fused(x, smooth, lora_down, group_size, fmt, scale_dtype, plan, _slice_rot, f8,
                                _loads_first_default(m) if loads_first is None else loads_first,
                                _early_deps(early_launch), act_shift)
    plan, feed = _fed_plan(plan, x, r, fmt, group_size, s_feed, split, block_m, block_k, num_warps)
    lowrank_act = torch.empty((m, r), device=dev, dtype=torch.float32)
    bm, bk, nsplit, sps, warps, variant = plan[:6]
    br = rank_block(r)
    grid = (cdiv(m, bm), nsplit)
    a = lora_down if r else x  # any valid pointer when the branch is off
    # S partials: one fp32 [M, r] slab per K slice, summed in slice order afterwards; no slab at split 1
    sp = lowrank_act if (nsplit == 1 or r == 0) else torch.empty((nsplit, m, r), device=dev, dtype=torch.float32)
    spst = sp.stride(0) if sp.dim() == 3 else 0
    if variant in ("v2", "v3"):
        return _act_quant_v2(x, smooth, lora_down, group_size, fmt, scale_dtype, lowrank_act, sp, spst,
                             grid, bm, nsplit, sps, warps, br, variant == "v3", f8, feed, act_shift)
    if fmt == "int4_g64":
        x_q, x_scale = _g64_outputs(m, k, group_size, dev, scale_dtype, f8)
        launch(_act_quant_g_kernel, grid, x, x.stride(0), smooth, x_q, x_q.stride(0), x_scale, x_scale.stride(0),
               a, a.stride(0), sp, spst, max(r, 1), m, k, r, sps,
               G=group_size, BLOCK_M=bm, BLOCK_K=bk, BLOCK_R=br, HAS_LOWRANK=r > 0,
               SCALE_BF16=scale_dtype == torch.bfloat16, F8=f8, num_warps=warps)
    elif fmt == "int4_2l":
        x_q = torch.empty((m, k), device=dev, dtype=torch.int8)
        x_scale = torch.empty((m,), device=dev, dtype=torch.float32)
        amax_part = torch.empty((nsplit, m), device=dev, dtype=torch.float32)
        launch(_act_2l_stats_kernel, grid, x, x.stride(0), smooth, a, a.stride(0), sp, spst, max(r, 1),
               amax_part, amax_part.stride(0), m, k, r, sps,
               BLOCK_M=bm, BLOCK_K=bk, BLOCK_R=br, HAS_LOWRANK=r > 0, num_warps=warps)
        launch(_act_2l_quant_kernel, grid, x, x.stride(0), smooth, x_q, x_q.stride(0), x_scale,
               amax_part, amax_part.stride(0), m, k, nsplit, sps,
               G=group_size, BLOCK_M=bm, BLOCK_K=bk, SPLIT_P2=next_pow2(nsplit),
               num_warps=warps)
    else:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    _sum_partials(sp, lowrank_act, nsplit, br)
    return x_q, x_scale, lowrank_act


def act_quant_shifted(x: torch.Tensor, smooth: torch.Tensor, lora_down: torch.Tensor, shift: torch.Tensor,
                      group_size: int = 64, scale_dtype: torch.dtype = torch.bfloat16):
    """The unsigned-activation layers' act_quant (``SVDQLinear(act_shift=...)``): (x8 float8_e4m3fn [M, K], xab fp32
    [K/G, 2, M], lowrank_act fp32 [M, r]) — the e4m3 operands of codes ``formats.int4.quantize_act_uint4(x/λ,
    shift)`` (0…15, which packed int4 cannot carry) and S = (x/λ)·lora_downᵀ on the unshifted x.

    On CUDA and under the interpreter: :func:`act_quant`'s fused (small M) or v3 kernel with the shift (one read of
    x for the codes and S). On the plain CPU: torch ops, the same code bits and S to fp32 rounding. Inputs are
    assumed validated by the op (``w4a4_gemm.check_linear_args``)."""
    if x.is_cuda or _interpreting():
        return act_quant(x, smooth, lora_down, group_size, "int4_g64", scale_dtype, out="f8", act_shift=shift)
    from ..formats.int4 import quantize_act_uint4
    m = x.shape[0]
    r = lora_down.shape[0]
    xs = x.float() / smooth.float()
    q, scales = quantize_act_uint4(xs, shift, group_size, scale_dtype)
    s = xs @ lora_down.float().t() if r else x.new_zeros((m, 0), dtype=torch.float32)
    return (*e4m3_operands(q, scales, group_size), s)


def _sum_partials(sp, lowrank_act, nsplit: int, br: int) -> None:
    m, r = lowrank_act.shape
    if r and nsplit > 1:
        launch(_sum_partials_kernel, (m,), sp, sp.stride(0), sp.stride(1), lowrank_act, lowrank_act.stride(0), m, r,
               nsplit, SPLIT_P2=next_pow2(nsplit), BLOCK_R=br, num_warps=1)


def _act_quant_v2(x, smooth, lora_down, group_size, fmt, scale_dtype, lowrank_act, sp, spst, grid, bm,
                  nsplit, sps, warps, br, v3=False, f8=False, feed="split", act_shift=None):
    """v2 / v3 launches (same arguments): prep (1/λ, A'ᵀ pieces), then g64 one kernel / 2l two passes,
    then the S reduce. ``f8``: v3 only (the e4m3 outputs); ``feed``: v3 only (:func:`_s_feed`);
    ``act_shift``: v3 g64 with f8 only (the unsigned codes)."""
    g_kernel = _act_quant_g_v3_kernel if v3 else _act_quant_g_v2_kernel
    stats_kernel = _act_2l_stats_v3_kernel if v3 else _act_2l_stats_v2_kernel
    quant_kernel = _act_2l_quant_v3_kernel if v3 else _act_2l_quant_v2_kernel
    m, k = x.shape
    r = lora_down.shape[0]
    dev = x.device
    rl, pieces, shift = _prep(x, smooth, lora_down, r, br, unscaled=feed != "split")
    emu = _interpreting()
    one = dict(ONE_ACC=True, num_stages=S_FEED_STAGES) if feed != "split" else {}
    if fmt == "int4_g64":
        unsigned = {}
        if act_shift is not None:
            unsigned = dict(UNSIGNED=True, shift_ptr=act_shift, **({"maxnreg": _ONE_FEED_MAXNREG} if one else {}))
        x_q, x_scale = _g64_outputs(m, k, group_size, dev, scale_dtype, f8)
        launch(g_kernel, grid, x, x.stride(0), smooth, rl, x_q, x_q.stride(0), x_scale, x_scale.stride(0),
               pieces, pieces.stride(0), sp, spst, max(r, 1), m, k, r, sps,
               G=group_size, BLOCK_M=bm, BLOCK_R=br, HAS_LOWRANK=r > 0,
               SCALE_BF16=scale_dtype == torch.bfloat16, SHIFT=shift, EMU_FMA=emu,
               **({"F8": True} if f8 else {}), **one, **unsigned, num_warps=warps)  # f8: v3 only (act_quant)
    else:
        x_q = torch.empty((m, k), device=dev, dtype=torch.int8)
        x_scale = torch.empty((m,), device=dev, dtype=torch.float32)
        amax_part = torch.empty((nsplit, m), device=dev, dtype=torch.float32)
        _launch_row_stats(stats_kernel, grid, x, smooth, rl, pieces, sp, spst, r, amax_part, sps, bm, group_size, br,
                          shift, emu, feed, warps)
        launch(quant_kernel, grid, x, x.stride(0), smooth, rl, x_q, x_q.stride(0), x_scale,
               amax_part, amax_part.stride(0), m, k, nsplit, sps,
               G=group_size, BLOCK_M=bm, SPLIT_P2=next_pow2(nsplit),
               EMU_FMA=emu, num_warps=warps)
    _sum_partials(sp, lowrank_act, nsplit, br)
    return x_q, x_scale, lowrank_act


def _launch_row_stats(stats_kernel, grid, x, smooth, rl, pieces, sp, spst, r: int, amax_part, sps: int, bm: int,
                      group_size: int, br: int, shift: int, emu: bool, feed: str, warps: int) -> None:
    """The int4_2l pass 1 (per (row block, K slice): row-maximum partials of x/λ into ``amax_part`` [split, M] and
    the S partials), shared by the e4m3 activations' quantizer (kernels/act_e4m3.py)."""
    m, k = x.shape
    one = dict(ONE_ACC=True, num_stages=S_FEED_STAGES) if feed != "split" else {}
    tma = feed == "one_tma"
    x_arg = TensorDescriptor.from_tensor(x, [bm, group_size]) if tma else x
    launch(stats_kernel, grid, x_arg, x.stride(0), smooth, rl, pieces, pieces.stride(0), sp, spst, max(r, 1),
           amax_part, amax_part.stride(0), m, k, r, sps,
           BLOCK_M=bm, BLOCK_K=group_size, BLOCK_R=br, HAS_LOWRANK=r > 0,
           SHIFT=shift, EMU_FMA=emu, **one, **({"X_TMA": True} if tma else {}),
           num_warps=warps)


_TICKETS: dict[torch.device, torch.Tensor] = {}


def _tickets(dev: torch.device, n: int) -> torch.Tensor:
    """Persistent int32 arrival tickets (≥ n), zero between launches (each electing program resets its
    own). Created once per device outside graph capture; a first call inside a capture gets a private
    zeroed buffer (captured as a memset) and leaves the cache alone."""
    buf = _TICKETS.get(dev)
    if buf is not None and buf.numel() >= n:
        return buf
    if capturing(dev):
        return torch.zeros((max(n, 256),), device=dev, dtype=torch.int32)
    buf = _TICKETS[dev] = persistent_zeros((max(n, 256),), torch.int32, dev)
    return buf


def _act_quant_fused(x, smooth, lora_down, group_size, fmt, scale_dtype, plan: ActQuantPlan, rot: int = 0,
                     f8: bool = False, loads_first: bool = False, early_deps: bool = True, act_shift=None,
                     f16: bool = False):
    """One launch: S programs (row block × slice, ticketed fixed-order sum) + quant units (``act_shift``: the
    unsigned codes, g64 with f8; ``f16``: the decode kernel's fp16 token operand, g64)."""
    m, k = x.shape
    r = lora_down.shape[0]
    dev = x.device
    bm, bk, nsplit, sps, warps, _, qm, qk, sr, rb = plan
    two_level = fmt == "int4_2l"
    if two_level or f16:
        x_q = torch.empty((m, k), device=dev, dtype=torch.float16 if f16 else torch.int8)
        x_scale = torch.empty((m,), device=dev, dtype=torch.float32)
    else:
        x_q, x_scale = _g64_outputs(m, k, group_size, dev, scale_dtype, f8)
    lowrank_act = torch.empty((m, r), device=dev, dtype=torch.float32)
    if m == 0:
        return x_q, x_scale, lowrank_act
    br = rank_block(r)
    qs = cdiv(k, qk)
    n_q = cdiv(m, qm) * qs
    a = lora_down if r else x
    pdl = pdl_enabled(dev)
    modes = dict(F8=f8, PDL=pdl, LOADS_FIRST=loads_first, launch_pdl=pdl)
    if pdl and not early_deps:
        modes["LATE_DEPS"] = True
    if act_shift is not None:
        modes.update(UNSIGNED=True, shift_ptr=act_shift)
    ch = min(next_pow2(k), max(64, 4096 // qm))
    if f16:     # the row walk: whole groups, ≤ 2048 columns a chunk (sm_90: 4096 took the kernel 164 → 232 registers)
        modes["F16"] = True
        ch = max(group_size, min(next_pow2(k), F16_ROW_CHUNK))
    if rb:  # rank-split S: no slabs, no tickets
        ck, nch = _rank_chunks(k, sr, rb)
        n_s = cdiv(m, sr) * cdiv(r, rb) if r else 0
        launch(_act_quant_fused_kernel, (n_s + n_q,),
            x, x.stride(0), smooth, x_q, x_q.stride(0), x_scale, x_scale.stride(0), a, a.stride(0),
            lowrank_act, 0, 0, lowrank_act, lowrank_act.stride(0), lowrank_act,  # no slabs / tickets
            m, k, r, 1, 1, n_s, qs, 0,
            TWO_LEVEL=two_level, G=group_size, BLOCK_M=16, BLOCK_K=group_size, BLOCK_R=br, SPLIT_P2=1, SUM_ROWS=1,
            QM=qm, QK=qk, CH=ch,
            SCALE_BF16=scale_dtype == torch.bfloat16, S_RANK=True, SR=sr, RB=rb, CK=ck, NCH=nch, num_warps=warps,
            **modes)
        return x_q, x_scale, lowrank_act
    n_rb = cdiv(m, bm)
    n_s = n_rb * nsplit if r else 0
    sp = torch.empty((nsplit, m, r), device=dev, dtype=torch.float32) if (r and nsplit > 1) else lowrank_act
    cnt = _tickets(dev, n_rb)
    launch(_act_quant_fused_kernel, (n_s + n_q,),
        x, x.stride(0), smooth, x_q, x_q.stride(0), x_scale, x_scale.stride(0), a, a.stride(0),
        sp, sp.stride(0) if sp.dim() == 3 else 0, sp.stride(-2), lowrank_act, lowrank_act.stride(0), cnt,
        m, k, r, nsplit, sps, n_s, qs, rot % nsplit,
        TWO_LEVEL=two_level, G=group_size, BLOCK_M=bm, BLOCK_K=bk, BLOCK_R=br,
        SPLIT_P2=next_pow2(nsplit), SUM_ROWS=min(bm, next_pow2(m)), QM=qm, QK=qk,
        CH=ch, SCALE_BF16=scale_dtype == torch.bfloat16,
        num_warps=warps, **modes)
    return x_q, x_scale, lowrank_act
