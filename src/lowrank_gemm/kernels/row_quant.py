"""Per-row fp8 quantization in one launch: ``(q, scale) = fp8_rows(x)`` with scale = amax(|row|) / fp8 max.

The W8A8 LoRA path quantizes x per token on every call. In PyTorch that is five passes over x (abs, amax, a float32
copy, the division, the cast: ~2 + 4 + 4 + 4 + 1 bytes read or written per element beside the 2 read); here one
program reads a row (once when it fits in registers, twice from L1/L2 otherwise) and writes 1 byte per element and
one float32 scale. Both paths give the same bits (``fp8_rows_torch`` is the spec, tested against this kernel):
- scale = RN(amax / fp8 max) (correctly rounded division on both sides: the spec divides by a tensor, since PyTorch's
  CUDA division by a Python scalar multiplies by the scalar's rounded reciprocal, which on the H200 differs in the
  last bit for many rows); an all-zero row gets scale 1;
- q = RN(x / scale) in fp8, never past the format's max because |x| ≤ amax;
- a row holding NaN has amax NaN and scale 1 (NaN > 0 is false, as in ``torch.where``), a row holding ±Inf scale
  Inf: the product comes out NaN either way, as it would in 16 bits. (Only q's elements past 448 in a NaN row
  differ: the cast saturates here and gives NaN in PyTorch; the row's product is NaN on both sides.)

``terms=2`` adds the residual's codes, RN(RN(x − q·scale) / scale) (one fma, one division), as rows M … 2M − 1:
x in two e4m3 terms on ONE row scale, x ≈ (q + q')·scale, about 8 significant bits, for the LoRA kernels' K loop
that feeds both terms into one accumulator (``lora_linear``'s ``fp8_activations=2``). The shared scale fits: the
residual is at most half a step of q, |r / scale| ≤ 16 < 448; and x loses nothing by it (normalized error of x
≈ 6e-4 on normal and heavy-tailed rows, a little below a residual with its own amax scale, whose larger grid step
coarsens the biggest residuals; the LoRA product's error on the H200 did rise, 2.3e-3 → 2.8e-3, from summing both
terms in one fp8 wgmma accumulator: ``_lora_kernels._main_loop``). Rows longer than the one-pass limit write both
terms in the second read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .act_quant import _fma, _max_nan    # RN(a·b + c) (emulated under the interpreter), NaN-propagating max
from .env import interpreting
from .launch import launch
from .schedule import next_pow2

__all__ = ["fp8_rows", "fp8_rows_torch"]

# a row of up to this many elements stays in registers (one read of x); longer rows take a second, cached read
_ONE_PASS_K = 8192
# (mantissa bits, smallest normal exponent) of the formats
_FP8_GRID = {torch.float8_e4m3fn: (3, -6), torch.float8_e5m2: (2, -14)}
_FP8_MAX = {dt: torch.finfo(dt).max for dt in _FP8_GRID}


def fp8_rows_torch(x2: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn,
                   terms: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The spec, in PyTorch (CPU tensors, and the reference the kernel is tested against)."""
    if x2.shape[1] == 0:
        return (torch.empty((terms * x2.shape[0], 0), dtype=dtype, device=x2.device),
                torch.ones(x2.shape[0], device=x2.device))
    amax = x2.abs().amax(dim=1).float()
    # a tensor divisor: PyTorch's CUDA division by a Python scalar multiplies by its rounded reciprocal instead
    xs = torch.where(amax > 0, amax / torch.full_like(amax, torch.finfo(dtype).max), torch.ones_like(amax))
    q = (x2.float() / xs[:, None]).to(dtype)
    if terms == 1:
        return q, xs.contiguous()
    # the residual with one rounding (exact in float64: q has ≤ 4 significant bits, the scale 24), on the same scale
    r = (x2.double() - q.double() * xs.double()[:, None]).float()
    return torch.cat([q, (r / xs[:, None]).to(dtype)]), xs.contiguous()


@triton.jit
def _round_fp8(v, dt: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr, EMU_CVT: tl.constexpr):
    """(RN-even fp32 → fp8, that value back in fp32). Triton 3.6's interpreter truncates instead (and drops the carry
    into the exponent), and cannot widen fp8 back; there v is first rounded onto the format's grid in fp32 (MANT
    mantissa bits, smallest normal exponent EMIN), which its conversion then keeps exactly."""
    if EMU_CVT:
        bits = v.to(tl.int32, bitcast=True)
        e = tl.maximum(((bits >> 23) & 0xFF) - 127, EMIN)
        ulp = ((e - MANT + 127) << 23).to(tl.float32, bitcast=True)
        g = ((tl.abs(v) / ulp + 12582912.0) - 12582912.0) * ulp    # 1.5·2²³: RN-even to an integer count of ulps
        g = (g.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)   # v's sign, −0 too
        nan8 = tl.full(v.shape, 0x7F, tl.uint8).to(dt, bitcast=True)   # its NaN comes out as a finite code
        return tl.where(g != g, nan8, g.to(dt)), g
    q = v.to(dt)
    return q, q.to(tl.float32)


@triton.jit
def _scale_of(amax, FP8_MAX: tl.constexpr):
    return tl.where(amax > 0, tl.math.div_rn(amax, FP8_MAX), 1.0)


@triton.jit
def _fp8_rows_kernel(x_ptr, stride_xm, q_ptr, stride_qm, s_ptr, M, K,
                     FP8_MAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
                     BLOCK_K: tl.constexpr, ONE_PASS: tl.constexpr, EMU_CVT: tl.constexpr, TERMS: tl.constexpr):
    # TERMS = 2: row M + row of q gets the residual x − q·scale on the same scale
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    q_row = q_ptr + row * stride_qm
    r_row = q_ptr + (row + M) * stride_qm
    offs = tl.arange(0, BLOCK_K)
    dt = q_ptr.dtype.element_ty
    if ONE_PASS:
        v = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
        scale = _scale_of(tl.reduce(tl.abs(v), 0, _max_nan), FP8_MAX)
        _store_terms(q_row, r_row, offs, offs < K, v, scale, dt, MANT, EMIN, EMU_CVT, TERMS)
    else:
        acc = tl.zeros([BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            acc = _max_nan(acc, tl.abs(tl.load(x_row + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)))
        scale = _scale_of(tl.reduce(acc, 0, _max_nan), FP8_MAX)
        for k0 in range(0, K, BLOCK_K):
            v = tl.load(x_row + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)
            _store_terms(q_row + k0, r_row + k0, offs, k0 + offs < K, v, scale, dt, MANT, EMIN, EMU_CVT, TERMS)
    tl.store(s_ptr + row, scale)


@triton.jit
def _store_terms(q_row, r_row, offs, mask, v, scale, dt: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
                 EMU_CVT: tl.constexpr, TERMS: tl.constexpr):
    q, qf = _round_fp8(tl.math.div_rn(v, scale), dt, MANT, EMIN, EMU_CVT)
    tl.store(q_row + offs, q, mask=mask)
    if TERMS == 2:
        r = _fma(-qf, scale, v, EMU_CVT)
        tl.store(r_row + offs, _round_fp8(tl.math.div_rn(r, scale), dt, MANT, EMIN, EMU_CVT)[0], mask=mask)


def fp8_rows(x2: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn,
             terms: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(``dtype`` [M, K], fp32 [M]) per-row quantization at the format's whole range: scale = amax / fp8 max (an
    all-zero row: 1); a row holding NaN or ±Inf comes out NaN, as the product would in 16 bits. x per token for the
    fp8 activations, W per output channel for an fp8 weight (``LoRALinear.quantize_weight_fp8_``). One Triton launch
    on CUDA (and under ``TRITON_INTERPRET=1``), :func:`fp8_rows_torch` on the CPU; the same bits either way.
    ``terms=2``: also the residual x − q·scale (one rounding) on the same row scale, as rows M … 2M − 1 of the
    codes ([2M, K] codes, [M] scales): x ≈ (q + q')·s holds about 8 significant bits, 16-bit x's precision."""
    if x2.dim() != 2:
        raise ValueError(f"fp8_rows expects a 2-D [rows, K] tensor, got shape {tuple(x2.shape)}")
    if dtype not in _FP8_GRID:
        raise ValueError(f"fp8_rows quantizes to float8_e4m3fn or float8_e5m2, got {dtype}")
    if x2.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"fp8_rows reads float16, bfloat16 or float32, got {x2.dtype}")
    if terms not in (1, 2):
        raise ValueError(f"fp8_rows: terms must be 1 or 2, got {terms!r}")
    M, K = x2.shape
    interp = x2.device.type == "cpu" and interpreting()
    if not (x2.is_cuda or interp) or M == 0 or K == 0:
        return fp8_rows_torch(x2, dtype, terms)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    q = torch.empty(terms * M, K, device=x2.device, dtype=dtype)
    s = torch.empty(M, device=x2.device, dtype=torch.float32)
    one_pass = K <= _ONE_PASS_K
    block_k = next_pow2(K) if one_pass else 2048
    mant, emin = _FP8_GRID[dtype]
    launch(_fp8_rows_kernel, (M, ), x2, x2.stride(0), q, q.stride(0), s, M, K, FP8_MAX=_FP8_MAX[dtype], MANT=mant,
           EMIN=emin, BLOCK_K=block_k, ONE_PASS=one_pass, EMU_CVT=interp, TERMS=terms,
           num_warps=8 if block_k >= 2048 else 4)
    return q, s
