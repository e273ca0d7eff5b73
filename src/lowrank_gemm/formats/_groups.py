"""Symmetric absmax quantization over groups along the last axis (shared by int4 and int8).

The numerics contract, stated once for every integer format in this package:

- The scale of a group is ``absmax / qmax`` computed in float32, then ROUNDED to the 16-bit scale dtype.
  Values are quantized with the rounded scale, ``q = clamp(round(x / scale16), qmin, qmax)``, so
  ``dequant = q * scale16`` is exact in float32.
- A group whose scale is 0 (all zeros, or an absmax so small that the 16-bit scale underflows) gets
  scale 1: never 0, never NaN from a finite input; its q values are then 0.
- Non-finite inputs: a group holding any NaN gets scale NaN, a group holding ±Inf (and no NaN) gets scale
  +Inf. Every q of such a group is 0, so the whole group dequantizes to NaN (0·NaN, 0·Inf) and the NaN
  reaches the matmul output the way torch itself would propagate it.

Unsigned groups (:func:`quantize_groups_unsigned`, activations that sit above a known floor after a constant
shift, e.g. GELU outputs + 0.171875): the scale is ``max(max(u), 0) / qmax`` in float32, rounded the same way, and
``q = clamp(round(u / scale16), 0, qmax)``; zero and non-finite groups as above (±Inf found by absolute value).
"""

from __future__ import annotations

import torch

SCALE_DTYPES = (torch.bfloat16, torch.float16)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_float(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_DTYPES:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a float tensor ({', '.join(map(str, FLOAT_DTYPES))}), got {got}")


def check_scale_dtype(scale_dtype: torch.dtype) -> None:
    if scale_dtype not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype must be torch.bfloat16 or torch.float16, got {scale_dtype}")


def check_group(k: int, group_size: int) -> None:
    if group_size <= 0 or k % group_size != 0:
        raise ValueError(f"K={k} is not a multiple of group_size={group_size}")


def quantize_groups(
    x: torch.Tensor, group_size: int, qmax: int, scale_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize rows of ``x`` [R, K] in groups of ``group_size`` along K.

    Returns ``q`` int8 [R, K] in [-qmax - 1, qmax] and ``scales`` [K // G, R] (group-major, scale_dtype).
    """
    rows, k = x.shape
    check_group(k, group_size)
    xg = x.float().reshape(rows, k // group_size, group_size)  # (R, K/G, G)
    absmax = xg.abs().amax(dim=-1, keepdim=True) if k else xg.new_zeros(rows, 0, 1)
    return _codes(xg, absmax, -qmax - 1, qmax, scale_dtype)


def _codes(xg: torch.Tensor, top: torch.Tensor, qmin: int, qmax: int,
           scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The shared tail of both rules: groups ``xg`` (R, K/G, G) and their magnitudes ``top`` (R, K/G, 1) → q int8
    [R, K] and group-major 16-bit scales (module doc)."""
    rows, ng, group_size = xg.shape
    # divide by a tensor: on CUDA torch turns ``t / python_scalar`` into ``t · (1/scalar)`` (not IEEE)
    scale16 = (top / torch.full_like(top, qmax)).to(scale_dtype)
    scale16 = torch.where(scale16 == 0, torch.ones_like(scale16), scale16)
    ratio = xg / scale16.float()
    # NaN/Inf groups: q = 0 everywhere in the group (the scale carries the NaN/Inf, see module doc).
    ratio = torch.where(torch.isfinite(scale16.float()) & torch.isfinite(ratio), ratio, torch.zeros_like(ratio))
    q = ratio.round().clamp(qmin, qmax).to(torch.int8).reshape(rows, ng * group_size)
    return q, scale16.reshape(rows, ng).t().contiguous()


def quantize_groups_unsigned(
    u: torch.Tensor, group_size: int, qmax: int, scale_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unsigned counterpart of :func:`quantize_groups` (module doc): ``u`` [R, K] → ``q`` int8 [R, K] in
    [0, qmax] and ``scales`` [K // G, R] (group-major, scale_dtype)."""
    rows, k = u.shape
    check_group(k, group_size)
    ug = u.float().reshape(rows, k // group_size, group_size)
    if k:
        top = ug.amax(dim=-1, keepdim=True).clamp_min(0)
        # amax propagates NaN; an Inf anywhere in the group (either sign) makes the scale +Inf, as in the signed rule
        top = torch.where(torch.isinf(ug).any(-1, keepdim=True) & ~torch.isnan(top), torch.full_like(top, float("inf")),
                          top)
    else:
        top = ug.new_zeros(rows, 0, 1)
    return _codes(ug, top, 0, qmax, scale_dtype)


def dequantize_groups(q: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """Inverse of :func:`quantize_groups`: ``q`` int [R, K], ``scales`` [K // G, R] → float32 [R, K]."""
    rows, k = q.shape
    check_group(k, group_size)
    if scales.shape != (k // group_size, rows):
        raise ValueError(f"scales must be [K // G, R] = {[k // group_size, rows]}, got {list(scales.shape)}")
    qg = q.float().reshape(rows, k // group_size, group_size)
    return (qg * scales.float().t().unsqueeze(-1)).reshape(rows, k)
