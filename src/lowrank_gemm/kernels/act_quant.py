"""Activation quantization for the W4A4 layer: one pass over X does the smoothing divide, the 4-bit
quantization and the low-rank down-projection ``S = (X / λ) · Aᵀ``.

Work is split over (row block, K slice) programs so a decode row (M = 1: one row block) is still
spread over ~2 programs per SM; v1 walked all of K in ONE program per row block, a serial chain of
~K/64 dependent load→dot steps (hundreds of µs at M = 1). Each slice writes an fp32 S partial; a tiny
kernel sums them in slice order (deterministic, no atomics). With one slice S is written directly.
Formats (``formats``):

- ``int4_g64`` (standard): packed int4 [M, K/2] in the :func:`formats.int4.pack_int4` layout and 16-bit
  group-major scales [K/G, M], bit-identical to ``quantize_act_int4(x / λ, G)``.
- ``int4_2l`` (two-level): expanded int8 ``q·v`` [M, K] and a float32 row scale [M], bit-identical to
  ``quantize_act_2l(x / λ, G)``. The row scale needs the whole row first: pass 1 (per slice) writes
  partial row absmax and S; pass 2 (per slice) reduces the absmax partials and re-reads its X slice.

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

__all__ = ["act_quant", "plan_act_quant", "FORMATS", "MAX_SPLIT"]

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
def _quant_g64_group(x_ptr, stride_xm, smooth_ptr, q_ptr, stride_qm, sc_ptr, stride_sg, a_ptr, stride_ar,
                     s_acc, g, offs_m, offs_r, M, R,
                     G: tl.constexpr, HAS_LOWRANK: tl.constexpr, SCALE_BF16: tl.constexpr):
    """Quantize group ``g`` of rows ``offs_m`` (packed int4 + 16-bit scale); returns the updated S partial."""
    HALF: tl.constexpr = G // 2
    col = tl.arange(0, HALF)
    # byte c of a group packs element (c // 32)·64 + c % 32 (low nibble) and that + 32 (high nibble)
    k_lo = g * G + (col // 32) * 64 + (col % 32)
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
    return s_acc


@triton.jit
def _act_quant_g_kernel(
    x_ptr, stride_xm,          # (M, K) bf16/fp16
    smooth_ptr,                # (K,)
    q_ptr, stride_qm,          # (M, K/2) uint8, packed int4 (formats.int4 layout)
    sc_ptr, stride_sg,         # (K/G, M) 16-bit scales, group-major
    a_ptr, stride_ar,          # (R, K) lora_down
    sp_ptr, stride_sps, stride_spm,  # (SPLIT, M, R) fp32 S partials (SPLIT = 1: S itself)
    M, K, R, GROUPS_PER_SLICE,
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
    HAS_LOWRANK: tl.constexpr, SCALE_BF16: tl.constexpr,
):
    """Program (row block, K slice): quantizes its groups (independent of the rest of the row) and
    writes its S partial; the partials are summed in slice order by :func:`_sum_partials_kernel`."""
    pid_k = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    g0 = pid_k * GROUPS_PER_SLICE
    g1 = tl.minimum(g0 + GROUPS_PER_SLICE, K // G)
    s_acc = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    for g in range(g0, g1):
        s_acc = _quant_g64_group(x_ptr, stride_xm, smooth_ptr, q_ptr, stride_qm, sc_ptr, stride_sg, a_ptr,
                                 stride_ar, s_acc, g, offs_m, offs_r, M, R, G, HAS_LOWRANK, SCALE_BF16)
    if HAS_LOWRANK:
        tl.store(sp_ptr + pid_k * stride_sps + offs_m[:, None] * stride_spm + offs_r[None, :], s_acc,
                 mask=(offs_m[:, None] < M) & (offs_r[None, :] < R))


@triton.jit
def _act_2l_stats_kernel(
    x_ptr, stride_xm, smooth_ptr,
    a_ptr, stride_ar,
    sp_ptr, stride_sps, stride_spm,  # (SPLIT, M, R) fp32 S partials
    ap_ptr, stride_aps,              # (SPLIT, M) fp32 partial row absmax (NaN if the slice holds NaN)
    M, K, R, GROUPS_PER_SLICE,
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, HAS_LOWRANK: tl.constexpr,
):
    """Two-level pass 1 per (row block, K slice): partial row absmax and partial S."""
    pid_k = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    offs_g = tl.arange(0, G)
    g0 = pid_k * GROUPS_PER_SLICE
    g1 = tl.minimum(g0 + GROUPS_PER_SLICE, K // G)
    s_acc = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    amax = tl.zeros((BLOCK_M,), tl.float32)
    n_nan = tl.zeros((BLOCK_M,), tl.int32)
    for g in range(g0, g1):
        xs = _smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, g * G + offs_g, M)
        if HAS_LOWRANK:
            s_acc = _down(s_acc, xs, a_ptr, stride_ar, g * G + offs_g, offs_r, R)
        amax = tl.maximum(amax, tl.max(tl.abs(xs), axis=1))
        n_nan += tl.sum((xs != xs).to(tl.int32), axis=1)
    row_ok = offs_m < M
    tl.store(ap_ptr + pid_k * stride_aps + offs_m, tl.where(n_nan > 0, float("nan"), amax), mask=row_ok)
    if HAS_LOWRANK:
        tl.store(sp_ptr + pid_k * stride_sps + offs_m[:, None] * stride_spm + offs_r[None, :], s_acc,
                 mask=(offs_m[:, None] < M) & (offs_r[None, :] < R))


@triton.jit
def _act_2l_quant_kernel(
    x_ptr, stride_xm, smooth_ptr,
    e_ptr, stride_em,          # (M, K) int8: expanded q·v
    t_ptr,                     # (M,) fp32 row scales
    ap_ptr, stride_aps,        # (SPLIT, M) partial absmax from pass 1
    M, K, SPLIT, GROUPS_PER_SLICE,
    G: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT_P2: tl.constexpr,
):
    """Two-level pass 2 per (row block, K slice): row scale t from the partials (every slice program
    recomputes it from the same values in the same order), then multipliers v ∈ [1, 15] and e = q·v."""
    pid_k = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_s = tl.arange(0, SPLIT_P2)
    offs_g = tl.arange(0, G)
    row_ok = offs_m < M
    part = tl.load(ap_ptr + offs_s[:, None] * stride_aps + offs_m[None, :],
                   mask=(offs_s[:, None] < SPLIT) & row_ok[None, :], other=0.0)
    has_nan = tl.sum((part != part).to(tl.int32), axis=0) > 0
    amax = tl.max(tl.where(part != part, 0.0, part), axis=0)
    t = tl.math.div_rn(amax, 105.0)
    t = tl.where(t == 0.0, 1.0, t)
    t = tl.where(has_nan, float("nan"), t)
    ok = _is_finite(t)
    safe_t = tl.where(ok, t, 1.0)
    g0 = pid_k * GROUPS_PER_SLICE
    g1 = tl.minimum(g0 + GROUPS_PER_SLICE, K // G)
    for g in range(g0, g1):
        xs = _smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, g * G + offs_g, M)
        gmax = tl.max(tl.abs(xs), axis=1)
        v = tl.math.ceil(tl.math.div_rn(gmax, safe_t * 7.0))
        v = tl.minimum(tl.maximum(v, 1.0), 15.0)
        v = tl.where(_is_finite(v), v, 1.0)
        r = tl.math.div_rn(xs, (safe_t * v)[:, None])
        q = tl.where(ok[:, None] & _is_finite(r), _rne(tl.minimum(tl.maximum(r, -8.0), 7.0)), 0.0)
        e = (q * v[:, None]).to(tl.int8)
        tl.store(e_ptr + offs_m[:, None] * stride_em + (g * G + offs_g)[None, :], e, mask=row_ok[:, None])
    if pid_k == 0:
        tl.store(t_ptr + offs_m, t, mask=row_ok)


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


def block_r_for(rank: int) -> int:
    """Rank padded to the MMA's K granularity (power of two ≥ 16)."""
    return max(16, triton.next_power_of_2(max(rank, 1)))


MAX_SPLIT = 64  # K slices per row block: bounds the partials' size and the reduce tile


def _block_m(m: int) -> int:
    return 16 if m <= 64 else 32


def plan_act_quant(m: int, k: int, group_size: int, device=None, split: int | None = None,
                   block_m: int | None = None) -> tuple[int, int, int]:
    """(block_m, split, groups_per_slice). Memory-bound: aim at ≥ 2 programs per SM, splitting K across
    programs when there are too few row blocks (decode: M = 1 has one row block, so K is split)."""
    bm = block_m or _block_m(m)
    ng = k // group_size
    if split is None:
        sms = num_sms(device) if device is not None and device.type == "cuda" else 8
        split = cdiv(2 * sms, cdiv(m, bm))
    split = max(1, min(split, ng, MAX_SPLIT))
    gps = cdiv(ng, split)
    return bm, cdiv(ng, gps), gps


def act_quant(x: torch.Tensor, smooth: torch.Tensor, lora_down: torch.Tensor, group_size: int = 64,
              fmt: str = "int4_g64", scale_dtype: torch.dtype = torch.bfloat16, *, split: int | None = None,
              block_m: int | None = None):
    """Quantize ``x`` [M, K] (bf16/fp16, contiguous rows) after dividing by ``smooth`` [K].

    Returns ``(x_q, x_scale, lowrank_act)``:
      int4_g64: x_q uint8 [M, K/2], x_scale ``scale_dtype`` [K/G, M];
      int4_2l:  x_q int8 [M, K],    x_scale float32 [M];
    and lowrank_act float32 [M, r] = (x / smooth) · lora_downᵀ (lora_down [r, K]; r may be 0).
    ``split`` (K slices per row block) and ``block_m`` override the plan (:func:`plan_act_quant`).
    Launches: g64 one kernel (+ the S reduce when split > 1); 2l two passes (+ the S reduce when split > 1).
    Inputs are assumed validated by the op (``w4a4_gemm.check_linear_args``).
    """
    m, k = x.shape
    r = lora_down.shape[0]
    dev = x.device
    lowrank_act = torch.empty((m, r), device=dev, dtype=torch.float32)
    bm, nsplit, gps = plan_act_quant(m, k, group_size, dev, split, block_m)
    br = block_r_for(r)
    grid = (cdiv(m, bm), nsplit)
    a = lora_down if r else x  # any valid pointer when the branch is off
    # S partials: one fp32 [M, r] slab per K slice, summed in slice order afterwards; no slab at split 1
    sp = lowrank_act if (nsplit == 1 or r == 0) else torch.empty((nsplit, m, r), device=dev, dtype=torch.float32)
    sps = sp.stride(0) if sp.dim() == 3 else 0
    if fmt == "int4_g64":
        x_q = torch.empty((m, k // 2), device=dev, dtype=torch.uint8)
        x_scale = torch.empty((k // group_size, m), device=dev, dtype=scale_dtype)
        _act_quant_g_kernel[grid](x, x.stride(0), smooth, x_q, x_q.stride(0), x_scale, x_scale.stride(0),
                                  a, a.stride(0), sp, sps, max(r, 1), m, k, r, gps,
                                  G=group_size, BLOCK_M=bm, BLOCK_R=br, HAS_LOWRANK=r > 0,
                                  SCALE_BF16=scale_dtype == torch.bfloat16, num_warps=4)
    elif fmt == "int4_2l":
        x_q = torch.empty((m, k), device=dev, dtype=torch.int8)
        x_scale = torch.empty((m,), device=dev, dtype=torch.float32)
        amax_part = torch.empty((nsplit, m), device=dev, dtype=torch.float32)
        _act_2l_stats_kernel[grid](x, x.stride(0), smooth, a, a.stride(0), sp, sps, max(r, 1),
                                   amax_part, amax_part.stride(0), m, k, r, gps,
                                   G=group_size, BLOCK_M=bm, BLOCK_R=br, HAS_LOWRANK=r > 0, num_warps=4)
        _act_2l_quant_kernel[grid](x, x.stride(0), smooth, x_q, x_q.stride(0), x_scale,
                                   amax_part, amax_part.stride(0), m, k, nsplit, gps,
                                   G=group_size, BLOCK_M=bm, SPLIT_P2=triton.next_power_of_2(nsplit), num_warps=4)
    else:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    if r and nsplit > 1:
        _sum_partials_kernel[(m,)](sp, sp.stride(0), sp.stride(1), lowrank_act, lowrank_act.stride(0), m, r,
                                   nsplit, SPLIT_P2=triton.next_power_of_2(nsplit), BLOCK_R=br, num_warps=1)
    return x_q, x_scale, lowrank_act
