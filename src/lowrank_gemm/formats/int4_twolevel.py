"""``int4_2l``: int4 with two-level scales whose second level folds into the int4 → int8 expansion.

The SVDQuant-standard format (:mod:`.int4`) carries a 16-bit scale per group of 64 along K, so a GEMM
must rescale its fp32 accumulator once per group: CUDA-core work on every accumulator element that
competes with the 8-bit MMA on Hopper (DESIGN.md §2). Here (after QServe's progressive quantization)
the group scale is split into a per-row fp32 scale and a per-group small integer multiplier:

    weights      w[n, k] ≈ s[n] · u[g, n] · q[n, k]      q ∈ [-8, 7] int4, u ∈ [1, 15], g = k // G
    activations  x[m, k] ≈ t[m] · v[m, g] · q[m, k]

``|q · u| ≤ 8 · 15 = 120`` fits int8, so a kernel multiplies the unpacked nibble by ``u`` (one integer
multiply) and the whole K extent accumulates in int32 on the 8-bit tensor cores; ``s`` and ``t`` are
applied once in the epilogue (``epilogue.affine``). Overflow bound: ``120 · 120 · K < 2³¹`` for
K ≤ 149 130 (:data:`MAX_K` uses the looser ``127²`` bound, K ≤ 133 143).

Storage:
    weights     q packed with :func:`.int4.pack_int4` (uint8 [N, K/2]), u uint8 [K/G, N] (group-major,
                like the standard scales), s float32 [N].
    activations the EXPANDED int8 values ``e = q · v`` [M, K] and t float32 [M]. Activations are
                transient (written by the quantize kernel, read once by the GEMM), so their *storage* is
                8-bit while their *precision* is int4 × a 4-bit group multiplier; only weights are stored
                at 4 bits.

Choice of the levels: ``s = absmax_row / (7 · 15)`` so the row's largest group gets u = 15, then
``u = clamp(ceil(absmax_group / (7 s)), 1, 15)`` (ceil: no group is clipped), then
``q = clamp(round(x / (s · u)), -8, 7)``. A group much smaller than its row's largest uses u = 1 and
a coarser step than a 16-bit group scale would give: that is this format's accuracy cost
(tests/test_formats_twolevel.py measures it against int4 g64).

Numerics (all in float32, the same expressions as the quantize kernel, so both agree bit for bit):
a row of zeros gets s = 1 and q = 0; a row holding NaN gets s = NaN, one holding ±Inf (no NaN) gets
s = +Inf, and all its q are 0, so the whole row dequantizes to NaN. (In the g64 format only the group
is poisoned; here the per-row scale is, so the row's GEMM outputs are NaN in both formats.)
"""

from __future__ import annotations

import torch

from ._groups import check_float, check_group
from .int4 import INT4_MAX, INT4_MIN, PACK_BLOCK, pack_int4, unpack_int4

__all__ = ["FMT", "MUL_MAX", "MAX_K", "quantize_weight_2l", "quantize_act_2l", "dequantize_weight_2l",
           "dequantize_act_2l", "pack_weight_2l"]

FMT = "int4_2l"
MUL_MAX = 15
LEVEL_MAX = INT4_MAX * MUL_MAX  # 105: the top of the expanded range used by the row scale
MAX_K = (2**31 - 1) // (127 * 127)


def _check(t: torch.Tensor, group_size: int, name: str) -> None:
    check_float(t, name)
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D [rows, K], got shape {list(t.shape)}")
    check_group(t.shape[1], group_size)
    if t.shape[1] % PACK_BLOCK:
        raise ValueError(f"{name}: K={t.shape[1]} must be a multiple of {PACK_BLOCK} (int4 packing block)")
    if t.shape[1] > MAX_K:
        raise ValueError(f"{name}: K={t.shape[1]} exceeds {MAX_K}, where the int32 accumulation could overflow")


def _two_level(t: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of ``t`` [R, K] → (q int8 [R, K], mul float32 [R, K/G], row scale float32 [R])."""
    rows, k = t.shape
    x = t.float()
    xg = x.reshape(rows, k // group_size, group_size)
    gmax = xg.abs().amax(dim=-1)  # (R, K/G); NaN propagates
    amax = gmax.amax(dim=-1) if k else x.new_zeros(rows)
    has_nan = torch.isnan(x).any(dim=-1)
    # a tensor divisor, not the Python scalar: on CUDA, torch turns ``t / scalar`` into ``t · (1/scalar)``
    # (not IEEE division), which differs from the kernel's div_rn in the last bit for many rows
    scale = amax / torch.full_like(amax, LEVEL_MAX)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    scale = torch.where(has_nan, torch.full_like(scale, float("nan")), scale)
    finite = torch.isfinite(scale)
    safe = torch.where(finite, scale, torch.ones_like(scale))[:, None]
    mul = (gmax / (safe * INT4_MAX)).ceil().clamp(1, MUL_MAX)  # tensor ÷ tensor: IEEE on CPU and CUDA
    mul = torch.where(torch.isfinite(mul), mul, torch.ones_like(mul))
    ratio = xg / (safe * mul)[..., None]
    ratio = torch.where(finite[:, None, None] & torch.isfinite(ratio), ratio, torch.zeros_like(ratio))
    q = ratio.round().clamp(INT4_MIN, INT4_MAX).to(torch.int8).reshape(rows, k)
    return q, mul, scale


def quantize_weight_2l(w: torch.Tensor, group_size: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weights ``w`` [N, K] → (q int8 [N, K] in [-8, 7], u uint8 [K/G, N] in [1, 15], s float32 [N])."""
    _check(w, group_size, "w")
    q, mul, scale = _two_level(w, group_size)
    return q, mul.to(torch.uint8).t().contiguous(), scale


def pack_weight_2l(w: torch.Tensor, group_size: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weights [N, K] → what the GEMM reads: (qweight uint8 [N, K/2] packed, u uint8 [K/G, N], s fp32 [N])."""
    q, u, s = quantize_weight_2l(w, group_size)
    return pack_int4(q), u, s


def quantize_act_2l(x: torch.Tensor, group_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations ``x`` [M, K] → (e int8 [M, K] = q · v in [-120, 120], t float32 [M]).

    Same expressions as ``kernels.act_quant`` (fmt ``int4_2l``), which reproduces it bit for bit.
    """
    _check(x, group_size, "x")
    q, mul, scale = _two_level(x, group_size)
    rows, k = x.shape
    e = q.reshape(rows, k // group_size, group_size).to(torch.int16) * mul.to(torch.int16)[..., None]
    return e.to(torch.int8).reshape(rows, k), scale


def dequantize_weight_2l(q: torch.Tensor, u: torch.Tensor, s: torch.Tensor, group_size: int = 64) -> torch.Tensor:
    """``q`` int8 [N, K] (unpacked) or uint8 [N, K/2] (packed), u [K/G, N], s [N] → float32 [N, K]."""
    if q.dtype == torch.uint8:
        q = unpack_int4(q)
    n, k = q.shape
    check_group(k, group_size)
    if u.shape != (k // group_size, n) or s.shape != (n,):
        raise ValueError(f"expected u [{k // group_size}, {n}] and s [{n}], got {list(u.shape)} and {list(s.shape)}")
    qg = q.float().reshape(n, k // group_size, group_size) * u.t().float()[..., None]
    return (qg.reshape(n, k) * s.float()[:, None])


def dequantize_act_2l(e: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Expanded activations ``e`` int8 [M, K] and row scales ``t`` [M] → float32 [M, K]."""
    if e.dtype != torch.int8 or e.dim() != 2 or t.shape != (e.shape[0],):
        raise ValueError(f"expected e int8 [M, K] and t [M], got {e.dtype} {list(e.shape)} and {list(t.shape)}")
    return e.float() * t.float()[:, None]
