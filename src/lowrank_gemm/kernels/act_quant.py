"""Activation quantization for the W4A4 layer: one pass over X does the smoothing divide, the 4-bit
quantization and the low-rank down-projection ``S = (X / λ) · Aᵀ``.

Work is split over (row block, K slice) programs so a decode row (M = 1: one row block) is still
spread over ~2 programs per SM; v1 walked all of K in ONE program per row block, a serial chain of
~K/64 dependent load→dot steps (hundreds of µs at M = 1). Each slice writes an fp32 S partial; a tiny
kernel sums them in slice order (deterministic, no atomics). With one slice S is written directly.
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

from .epilogue import rank_block
from .schedule import cdiv, num_sms

__all__ = ["act_quant", "plan_act_quant", "ActQuantPlan", "FORMATS", "MAX_SPLIT"]

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
def _quant_g64_step(x_ptr, stride_xm, smooth_ptr, q_ptr, stride_qm, sc_ptr, stride_sg, a_ptr, stride_ar,
                    s_acc, k0, offs_m, offs_r, M, R,
                    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                    HAS_LOWRANK: tl.constexpr, SCALE_BF16: tl.constexpr):
    """Quantize columns [k0, k0 + BLOCK_K) (BLOCK_K/G whole groups) of rows ``offs_m``: packed int4 +
    16-bit scales; returns the updated S partial. One wide step instead of one group per step: the
    per-step latency chain (load → dot → reduce → store) is paid K/BLOCK_K times, not K/G times."""
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
    amax = tl.maximum(_group_max(tl.abs(xs_lo), BLOCK_M, NGS, HG), _group_max(tl.abs(xs_hi), BLOCK_M, NGS, HG))
    n_nan = (_group_max((xs_lo != xs_lo).to(tl.int32), BLOCK_M, NGS, HG)
             + _group_max((xs_hi != xs_hi).to(tl.int32), BLOCK_M, NGS, HG))
    scale = _round_scale16(tl.math.div_rn(amax, 7.0), SCALE_BF16)  # [BM, NGS]
    scale = tl.where(scale == 0.0, 1.0, scale)
    scale = tl.where(n_nan > 0, float("nan"), scale)
    scale_b = _bcast_groups(scale, BLOCK_M, NGS, HG)
    ok = _is_finite(scale_b)
    r_lo = tl.math.div_rn(xs_lo, scale_b)
    r_hi = tl.math.div_rn(xs_hi, scale_b)
    q_lo = tl.where(ok & _is_finite(r_lo), _rne(tl.minimum(tl.maximum(r_lo, -8.0), 7.0)), 0.0).to(tl.int32)
    q_hi = tl.where(ok & _is_finite(r_hi), _rne(tl.minimum(tl.maximum(r_hi, -8.0), 7.0)), 0.0).to(tl.int32)
    packed = ((q_lo & 0xF) | ((q_hi & 0xF) << 4)).to(tl.uint8)
    row_ok = offs_m < M
    tl.store(q_ptr + offs_m[:, None] * stride_qm + (k0 // 2 + col)[None, :], packed, mask=row_ok[:, None])
    gi = k0 // G + tl.arange(0, NGS)
    tl.store(sc_ptr + gi[None, :] * stride_sg + offs_m[:, None], scale.to(sc_ptr.dtype.element_ty),
             mask=row_ok[:, None])
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
    HAS_LOWRANK: tl.constexpr, SCALE_BF16: tl.constexpr,
):
    """Program (row block, K slice): quantizes its groups (independent of the rest of the row) and
    writes its S partial; the partials are summed in slice order by :func:`_sum_partials_kernel`."""
    pid_k = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    k_begin = pid_k * STEPS_PER_SLICE * BLOCK_K
    k_end = tl.minimum(k_begin + STEPS_PER_SLICE * BLOCK_K, K)
    s_acc = tl.zeros((BLOCK_M, BLOCK_R), tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        s_acc = _quant_g64_step(x_ptr, stride_xm, smooth_ptr, q_ptr, stride_qm, sc_ptr, stride_sg, a_ptr,
                                stride_ar, s_acc, k0, offs_m, offs_r, M, R, G, BLOCK_M, BLOCK_K, HAS_LOWRANK,
                                SCALE_BF16)
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
    offs_s = tl.arange(0, SPLIT_P2)
    offs_k = tl.arange(0, BLOCK_K)
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
    k_begin = pid_k * STEPS_PER_SLICE * BLOCK_K
    k_end = tl.minimum(k_begin + STEPS_PER_SLICE * BLOCK_K, K)
    for k0 in range(k_begin, k_end, BLOCK_K):
        xs = _smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, k0 + offs_k, M)
        gmax = _group_max(tl.abs(xs), BLOCK_M, NGS, G)  # [BM, NGS]
        v = tl.math.ceil(tl.math.div_rn(gmax, (safe_t * 7.0)[:, None]))
        v = tl.minimum(tl.maximum(v, 1.0), 15.0)
        v = tl.where(_is_finite(v), v, 1.0)
        vb = _bcast_groups(v, BLOCK_M, NGS, G)
        r = tl.math.div_rn(xs, safe_t[:, None] * vb)
        q = tl.where(ok[:, None] & _is_finite(r), _rne(tl.minimum(tl.maximum(r, -8.0), 7.0)), 0.0)
        e = (q * vb).to(tl.int8)
        tl.store(e_ptr + offs_m[:, None] * stride_em + (k0 + offs_k)[None, :], e, mask=row_ok[:, None])
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


MAX_SPLIT = 64  # K slices per row block: bounds the partials' size and the reduce tile


class ActQuantPlan(NamedTuple):
    """How act_quant tiles X: rows per program, columns per step (whole groups), K slices per row block
    (S partials summed afterwards), steps per slice, warps."""

    block_m: int
    block_k: int
    split: int
    steps_per_slice: int
    num_warps: int


def _block_k(k: int, group_size: int, want: int) -> int:
    """Widest step ≤ ``want`` that is whole groups and divides K (K % G == 0, so G always qualifies)."""
    for bk in (256, 128, 64):
        if bk <= max(want, group_size) and bk % group_size == 0 and k % bk == 0:
            return bk
    return group_size


def plan_act_quant(m: int, k: int, group_size: int, device=None, split: int | None = None,
                   block_m: int | None = None, block_k: int | None = None,
                   num_warps: int | None = None) -> ActQuantPlan:
    """Memory-bound: aim at ≥ 2 programs per SM, splitting K across programs when there are too few row
    blocks (decode: M = 1 has one row block, so K is split).

    Large M (> 64): 64-row blocks, one group (G columns) per step, 4 warps. Measured on the H200 at FLUX
    fc1 (M=4608, K=3072; probes/probe_w4a4_actquant.md): 64×64 steps 83 µs (g64) / 109 µs (2l), against
    130/140 µs for 64×128 and 110/138 µs for the v1 32×64 tiles — wider steps lose (more registers,
    fewer programs in flight). Still ~10× the 28 MB floor (~7 µs). Decode keeps 16 × G steps
    (measured ~11–16 µs; K split ≤ 64 ways)."""
    large = m > 64
    bm = block_m or (64 if large else 16)
    bk = _block_k(k, group_size, block_k or group_size)
    warps = num_warps or (8 if bm * bk >= 64 * 256 else 4)
    nsteps = k // bk
    if split is None:
        sms = num_sms(device) if device is not None and device.type == "cuda" else 8
        split = cdiv(2 * sms, cdiv(m, bm))
    split = max(1, min(split, nsteps, MAX_SPLIT))
    sps = cdiv(nsteps, split)
    return ActQuantPlan(bm, bk, cdiv(nsteps, sps), sps, warps)


def act_quant(x: torch.Tensor, smooth: torch.Tensor, lora_down: torch.Tensor, group_size: int = 64,
              fmt: str = "int4_g64", scale_dtype: torch.dtype = torch.bfloat16, *, split: int | None = None,
              block_m: int | None = None, block_k: int | None = None, num_warps: int | None = None):
    """Quantize ``x`` [M, K] (bf16/fp16, contiguous rows) after dividing by ``smooth`` [K].

    Returns ``(x_q, x_scale, lowrank_act)``:
      int4_g64: x_q uint8 [M, K/2], x_scale ``scale_dtype`` [K/G, M];
      int4_2l:  x_q int8 [M, K],    x_scale float32 [M];
    and lowrank_act float32 [M, r] = (x / smooth) · lora_downᵀ (lora_down [r, K]; r may be 0).
    ``split`` (K slices per row block), ``block_m``, ``block_k`` (columns per step, a multiple of G that
    divides K; rounded down to one) and ``num_warps`` override the plan (:func:`plan_act_quant`).
    Launches: g64 one kernel (+ the S reduce when split > 1); 2l two passes (+ the S reduce when split > 1).
    Inputs are assumed validated by the op (``w4a4_gemm.check_linear_args``).
    """
    m, k = x.shape
    r = lora_down.shape[0]
    dev = x.device
    lowrank_act = torch.empty((m, r), device=dev, dtype=torch.float32)
    bm, bk, nsplit, sps, warps = plan_act_quant(m, k, group_size, dev, split, block_m, block_k, num_warps)
    br = rank_block(r)
    grid = (cdiv(m, bm), nsplit)
    a = lora_down if r else x  # any valid pointer when the branch is off
    # S partials: one fp32 [M, r] slab per K slice, summed in slice order afterwards; no slab at split 1
    sp = lowrank_act if (nsplit == 1 or r == 0) else torch.empty((nsplit, m, r), device=dev, dtype=torch.float32)
    spst = sp.stride(0) if sp.dim() == 3 else 0
    if fmt == "int4_g64":
        x_q = torch.empty((m, k // 2), device=dev, dtype=torch.uint8)
        x_scale = torch.empty((k // group_size, m), device=dev, dtype=scale_dtype)
        _act_quant_g_kernel[grid](x, x.stride(0), smooth, x_q, x_q.stride(0), x_scale, x_scale.stride(0),
                                  a, a.stride(0), sp, spst, max(r, 1), m, k, r, sps,
                                  G=group_size, BLOCK_M=bm, BLOCK_K=bk, BLOCK_R=br, HAS_LOWRANK=r > 0,
                                  SCALE_BF16=scale_dtype == torch.bfloat16, num_warps=warps)
    elif fmt == "int4_2l":
        x_q = torch.empty((m, k), device=dev, dtype=torch.int8)
        x_scale = torch.empty((m,), device=dev, dtype=torch.float32)
        amax_part = torch.empty((nsplit, m), device=dev, dtype=torch.float32)
        _act_2l_stats_kernel[grid](x, x.stride(0), smooth, a, a.stride(0), sp, spst, max(r, 1),
                                   amax_part, amax_part.stride(0), m, k, r, sps,
                                   BLOCK_M=bm, BLOCK_K=bk, BLOCK_R=br, HAS_LOWRANK=r > 0, num_warps=warps)
        _act_2l_quant_kernel[grid](x, x.stride(0), smooth, x_q, x_q.stride(0), x_scale,
                                   amax_part, amax_part.stride(0), m, k, nsplit, sps,
                                   G=group_size, BLOCK_M=bm, BLOCK_K=bk, SPLIT_P2=triton.next_power_of_2(nsplit),
                                   num_warps=warps)
    else:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    if r and nsplit > 1:
        _sum_partials_kernel[(m,)](sp, sp.stride(0), sp.stride(1), lowrank_act, lowrank_act.stride(0), m, r,
                                   nsplit, SPLIT_P2=triton.next_power_of_2(nsplit), BLOCK_R=br, num_warps=1)
    return x_q, x_scale, lowrank_act
