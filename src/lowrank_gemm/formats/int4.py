"""Signed int4, packed two per byte along K, with 16-bit per-group scales (the SVDQuant W4A4 format).

Packing layout (the Hopper kernels rely on it): K is cut into blocks of ``PACK_BLOCK = 64``; in block b,
byte j (0 ≤ j < 32) holds element ``b·64 + j`` in its LOW nibble and element ``b·64 + 32 + j`` in its
HIGH nibble, as two's-complement nibbles. A kernel that loads a 32-byte row slice gets two ready
``[rows, 32]`` tiles (low and high nibbles) without shuffles.

Scales are group-major, ``[K // G, rows]``, so a kernel reads one contiguous row per K group. Group sizes:
64 (the SVDQuant standard), 128, or K (per-channel). Quantization numerics (rounded 16-bit scales,
zero groups, NaN/Inf) are documented in :mod:`lowrank_gemm.formats._groups`.
"""

from __future__ import annotations

import torch

from ._groups import (check_float, check_group, check_scale_dtype, dequantize_groups, quantize_groups,
                      quantize_groups_unsigned)

PACK_BLOCK = 64
INT4_MIN, INT4_MAX = -8, 7
UINT4_MAX = 15
# the constant shift that puts GELU outputs (≥ −0.16997) above 0 for unsigned activations (Nunchaku's fc2 layers)
GELU_SHIFT = 0.171875


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Pack int8 ``q`` [..., K] with values in [-8, 7] (K % 64 == 0) into uint8 [..., K // 2]."""
    if not isinstance(q, torch.Tensor) or q.dtype != torch.int8:
        raise ValueError(f"pack_int4 expects an int8 tensor, got {getattr(q, 'dtype', type(q).__name__)}")
    if q.dim() == 0 or q.shape[-1] % PACK_BLOCK != 0:
        raise ValueError(f"pack_int4 needs a last dim that is a multiple of {PACK_BLOCK}, got shape {list(q.shape)}")
    if q.numel() and (int(q.min()) < INT4_MIN or int(q.max()) > INT4_MAX):
        raise ValueError(f"pack_int4 values must lie in [{INT4_MIN}, {INT4_MAX}], got [{int(q.min())}, {int(q.max())}]")
    *lead, k = q.shape
    blocks = q.reshape(*lead, k // PACK_BLOCK, 2, PACK_BLOCK // 2).to(torch.int16) & 0xF  # (..., K/64, lo|hi, 32)
    packed = blocks[..., 0, :] | (blocks[..., 1, :] << 4)
    return packed.to(torch.uint8).reshape(*lead, k // 2)


def unpack_int4(p: torch.Tensor) -> torch.Tensor:
    """Exact inverse of :func:`pack_int4`: uint8 [..., K // 2] → int8 [..., K]."""
    if not isinstance(p, torch.Tensor) or p.dtype != torch.uint8:
        raise ValueError(f"unpack_int4 expects a uint8 tensor, got {getattr(p, 'dtype', type(p).__name__)}")
    if p.dim() == 0 or p.shape[-1] % (PACK_BLOCK // 2) != 0:
        raise ValueError(f"unpack_int4 needs a last dim that is a multiple of {PACK_BLOCK // 2}, got {list(p.shape)}")
    *lead, half = p.shape
    b = p.reshape(*lead, half // (PACK_BLOCK // 2), 1, PACK_BLOCK // 2).to(torch.int16)
    nibbles = torch.cat([b & 0xF, b >> 4], dim=-2)  # (..., K/64, lo|hi, 32)
    signed = (nibbles ^ 8) - 8  # sign-extend two's-complement nibbles
    return signed.to(torch.int8).reshape(*lead, half * 2)


def quantize_weight_int4(
    w: torch.Tensor, group_size: int, scale_dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-group int4 of a weight ``w`` [N, K].

    Returns ``q`` int8 [N, K] in [-8, 7] and ``scales`` [K // G, N] in ``scale_dtype`` (bf16 by default:
    the q values are computed with the rounded scale, so the scale's 8-bit mantissa costs no accuracy, and
    bf16 never underflows on small activations the way fp16 can).
    """
    return _quantize_2d(w, group_size, scale_dtype, "w")


def quantize_act_int4(
    x: torch.Tensor, group_size: int, scale_dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token, per-group int4 of activations ``x`` [M, K] → (q int8 [M, K], scales [K // G, M]).

    Same rules as :func:`quantize_weight_int4`. NaN/Inf: a group holding NaN gets scale NaN, one holding
    ±Inf gets scale +Inf; its q values are 0, so the group dequantizes to NaN.
    """
    return _quantize_2d(x, group_size, scale_dtype, "x")


def act_shift_vector(shift: float, smooth: torch.Tensor) -> torch.Tensor:
    """float32 [K] = RN(shift / λ): the shift of an unsigned-activation layer (``SVDQLinear(act_shift=...)``) in
    the smoothed domain, computed once in float64 and rounded, so every path adds the same bits."""
    return (float(shift) / smooth.double()).float()


def quantize_act_uint4(
    xs: torch.Tensor, shift: torch.Tensor, group_size: int, scale_dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unsigned per-token, per-group int4 of smoothed activations after a constant shift: u = RN(xs + shift) in
    float32 (``xs`` [M, K] rounded to float32 first, ``shift`` float32 [K], :func:`act_shift_vector`) → (q int8
    [M, K] in [0, 15], scales [K // G, M]). Dequantized, ``q·scale − shift`` stands for ``xs``.

    For inputs with a floor: GELU outputs are ≥ −0.17, so with shift 0.171875 (Nunchaku's fc2 layers) every u ≥ 0
    and the 16 codes cover [0, max] where the signed codes would spend half their range on values that never come.
    Numerics as :func:`quantize_act_int4` (module doc of ``formats._groups``); values below the floor clamp to 0."""
    check_float(xs, "xs")
    check_scale_dtype(scale_dtype)
    if xs.dim() != 2:
        raise ValueError(f"xs must be 2-D [rows, K], got shape {list(xs.shape)}")
    if shift.shape != (xs.shape[1],) or shift.dtype != torch.float32:
        raise ValueError(f"shift must be float32 [K={xs.shape[1]}], got {shift.dtype} {list(shift.shape)}")
    check_group(xs.shape[1], group_size)
    return quantize_groups_unsigned(xs.float() + shift.to(xs.device), group_size, UINT4_MAX, scale_dtype)


def dequantize_int4(q: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """``q`` int8 [R, K] (unpacked) and ``scales`` [K // G, R] → float32 [R, K] = q · scale."""
    if q.dtype != torch.int8 or q.dim() != 2:
        raise ValueError(f"dequantize_int4 expects unpacked int8 [R, K], got {q.dtype} {list(q.shape)}")
    return dequantize_groups(q, scales, group_size)


def _quantize_2d(t: torch.Tensor, group_size: int, scale_dtype: torch.dtype, name: str):
    check_float(t, name)
    check_scale_dtype(scale_dtype)
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D [rows, K], got shape {list(t.shape)}")
    check_group(t.shape[1], group_size)
    return quantize_groups(t, group_size, INT4_MAX, scale_dtype)
