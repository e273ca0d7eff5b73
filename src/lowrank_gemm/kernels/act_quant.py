"""Activation quantization for the W4A4 layer: one pass over X does the smoothing divide, the 4-bit
quantization and the low-rank down-projection ``S = (X / λ) · Aᵀ``.

Each program owns BLOCK_M whole rows and walks all of K, so S accumulates in registers across the
K loop: deterministic, no atomics, no second kernel. Formats (``formats``):

- ``int4_g64`` (standard): packed int4 [M, K/2] in the :func:`formats.int4.pack_int4` layout and 16-bit
  group-major scales [K/G, M], bit-identical to ``quantize_act_int4(x / λ, G)``.
- ``int4_2l`` (two-level): expanded int8 ``q·v`` [M, K] and a float32 row scale [M], bit-identical to
  ``quantize_act_2l(x / λ, G)``. The row scale needs the whole row first, so this path reads X twice
  (the second read of a BLOCK_M × K slab mostly hits L2).

Numerics shared with the torch quantizers: divisions are IEEE round-to-nearest (``div_rn``, not the
approximate GPU divide), rounding is half-to-even, a 16-bit scale is rounded before it is used. NaN/Inf
in a group (g64) or row (2l) gives that scale NaN/Inf and zero q, so the row's GEMM outputs are NaN.
S is accumulated with 3×TF32 MMAs (≈ fp32) so it matches the float64 spec to ~1e-6.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .schedule import cdiv, num_sms

__all__ = ["act_quant", "FORMATS"]

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
    return tl.dot(xs, a_t.to(tl.float32), s_acc, input_precision="tf32x3")


@triton.jit
def _act_quant_g_kernel(
    x_ptr, stride_xm,          # (M, K) bf16/fp16
    smooth_ptr,                # (K,)
    q_ptr, stride_qm,          # (M, K/2) uint8, packed int4 (formats.int4 layout)
    sc_ptr, stride_sg,         # (K/G, M) 16-bit scales, group-major
    a_ptr, stride_ar,          # (R, K) lora_down
    s_ptr, stride_sm,          # (M, R) fp32 low-rank activations
    M, K, R,
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
    HAS_LOWRANK: tl.constexpr, SCALE_BF16: tl.constexpr,
):
    HALF: tl.constexpr = G // 2
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    col = tl.arange(0, HALF)
    # byte c of a group packs element (c // 32)·64 + c % 32 (low nibble) and that + 32 (high nibble)
    k_in = (col // 32) * 64 + (col % 32)
    s_acc = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    for g in range(0, K // G):
        k_lo = g * G + k_in
        xs_lo = _smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, k_lo, M)
        xs_hi = _smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, k_lo + 32, M)
        if HAS_LOWRANK:
            s_acc = _down(s_acc, xs_lo, a_ptr, stride_ar, k_lo, offs_r, R)
            s_acc = _down(s_acc, xs_hi, a_ptr, stride_ar, k_lo + 32, offs_r, R)
        amax = tl.maximum(tl.max(tl.abs(xs_lo), axis=1), tl.max(tl.abs(xs_hi), axis=1))
        n_nan = tl.sum((xs_lo != xs_lo).to(tl.int32), axis=1) + tl.sum((xs_hi != xs_hi).to(tl.int32), axis=1)
        scale = _round_scale16(tl.math.div_rn(amax, 7.0), SCALE_BF16)
        scale = tl.where(scale == 0.0, 1.0, scale)
        scale = tl.where(n_nan > 0, float("nan"), scale)
        ok = _is_finite(scale)[:, None]
        r_lo = tl.math.div_rn(xs_lo, scale[:, None])
        r_hi = tl.math.div_rn(xs_hi, scale[:, None])
        q_lo = tl.where(ok & _is_finite(r_lo), _rne(tl.minimum(tl.maximum(r_lo, -8.0), 7.0)), 0.0).to(tl.int32)
        q_hi = tl.where(ok & _is_finite(r_hi), _rne(tl.minimum(tl.maximum(r_hi, -8.0), 7.0)), 0.0).to(tl.int32)
        packed = ((q_lo & 0xF) | ((q_hi & 0xF) << 4)).to(tl.uint8)
        row_ok = offs_m < M
        tl.store(q_ptr + offs_m[:, None] * stride_qm + (g * HALF + col)[None, :], packed, mask=row_ok[:, None])
        tl.store(sc_ptr + g * stride_sg + offs_m, scale.to(sc_ptr.dtype.element_ty), mask=row_ok)
    if HAS_LOWRANK:
        tl.store(s_ptr + offs_m[:, None] * stride_sm + offs_r[None, :], s_acc,
                 mask=(offs_m[:, None] < M) & (offs_r[None, :] < R))


@triton.jit
def _act_quant_2l_kernel(
    x_ptr, stride_xm,          # (M, K) bf16/fp16
    smooth_ptr,                # (K,)
    e_ptr, stride_em,          # (M, K) int8: expanded q·v
    t_ptr,                     # (M,) fp32 row scales
    a_ptr, stride_ar,          # (R, K) lora_down
    s_ptr, stride_sm,          # (M, R) fp32 low-rank activations
    M, K, R,
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, HAS_LOWRANK: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    offs_g = tl.arange(0, G)
    row_ok = offs_m < M
    s_acc = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    amax = tl.zeros((BLOCK_M,), tl.float32)
    n_nan = tl.zeros((BLOCK_M,), tl.int32)
    # pass 1: row absmax (the row scale) and S
    for g in range(0, K // G):
        xs = _smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, g * G + offs_g, M)
        if HAS_LOWRANK:
            s_acc = _down(s_acc, xs, a_ptr, stride_ar, g * G + offs_g, offs_r, R)
        amax = tl.maximum(amax, tl.max(tl.abs(xs), axis=1))
        n_nan += tl.sum((xs != xs).to(tl.int32), axis=1)
    t = tl.math.div_rn(amax, 105.0)
    t = tl.where(t == 0.0, 1.0, t)
    t = tl.where(n_nan > 0, float("nan"), t)
    ok = _is_finite(t)
    safe_t = tl.where(ok, t, 1.0)
    # pass 2: group multipliers v ∈ [1, 15] and e = q·v
    for g in range(0, K // G):
        xs = _smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, g * G + offs_g, M)
        gmax = tl.max(tl.abs(xs), axis=1)
        v = tl.math.ceil(tl.math.div_rn(gmax, 7.0 * safe_t))
        v = tl.minimum(tl.maximum(v, 1.0), 15.0)
        v = tl.where(_is_finite(v), v, 1.0)
        r = tl.math.div_rn(xs, (safe_t * v)[:, None])
        q = tl.where(ok[:, None] & _is_finite(r), _rne(tl.minimum(tl.maximum(r, -8.0), 7.0)), 0.0)
        e = (q * v[:, None]).to(tl.int8)
        tl.store(e_ptr + offs_m[:, None] * stride_em + (g * G + offs_g)[None, :], e, mask=row_ok[:, None])
    tl.store(t_ptr + offs_m, t, mask=row_ok)
    if HAS_LOWRANK:
        tl.store(s_ptr + offs_m[:, None] * stride_sm + offs_r[None, :], s_acc,
                 mask=(offs_m[:, None] < M) & (offs_r[None, :] < R))


def block_r_for(rank: int) -> int:
    """Rank padded to the MMA's K granularity (power of two ≥ 16)."""
    return max(16, triton.next_power_of_2(max(rank, 1)))


def _block_m(m: int, device) -> int:
    # memory-bound: enough programs to cover every SM twice before growing the row block
    return 32 if cdiv(m, 32) >= 2 * num_sms(device) else 16


def act_quant(x: torch.Tensor, smooth: torch.Tensor, lora_down: torch.Tensor, group_size: int = 64,
              fmt: str = "int4_g64", scale_dtype: torch.dtype = torch.bfloat16):
    """Quantize ``x`` [M, K] (bf16/fp16, contiguous rows) after dividing by ``smooth`` [K].

    Returns ``(x_q, x_scale, lowrank_act)``:
      int4_g64: x_q uint8 [M, K/2], x_scale ``scale_dtype`` [K/G, M];
      int4_2l:  x_q int8 [M, K],    x_scale float32 [M];
    and lowrank_act float32 [M, r] = (x / smooth) · lora_downᵀ (lora_down [r, K]; r may be 0).
    Inputs are assumed validated by the op (``w4a4_gemm.check_linear_args``).
    """
    m, k = x.shape
    r = lora_down.shape[0]
    dev = x.device
    lowrank_act = torch.empty((m, r), device=dev, dtype=torch.float32)
    bm, br = _block_m(m, dev), block_r_for(r)
    grid = (cdiv(m, bm),)
    a = lora_down if r else x  # any valid pointer when the branch is off
    if fmt == "int4_g64":
        x_q = torch.empty((m, k // 2), device=dev, dtype=torch.uint8)
        x_scale = torch.empty((k // group_size, m), device=dev, dtype=scale_dtype)
        _act_quant_g_kernel[grid](x, x.stride(0), smooth, x_q, x_q.stride(0), x_scale, x_scale.stride(0),
                                  a, a.stride(0), lowrank_act, max(r, 1), m, k, r,
                                  G=group_size, BLOCK_M=bm, BLOCK_R=br, HAS_LOWRANK=r > 0,
                                  SCALE_BF16=scale_dtype == torch.bfloat16, num_warps=4)
    elif fmt == "int4_2l":
        x_q = torch.empty((m, k), device=dev, dtype=torch.int8)
        x_scale = torch.empty((m,), device=dev, dtype=torch.float32)
        _act_quant_2l_kernel[grid](x, x.stride(0), smooth, x_q, x_q.stride(0), x_scale,
                                   a, a.stride(0), lowrank_act, max(r, 1), m, k, r,
                                   G=group_size, BLOCK_M=bm, BLOCK_R=br, HAS_LOWRANK=r > 0, num_warps=4)
    else:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    return x_q, x_scale, lowrank_act
