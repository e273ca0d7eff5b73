"""Per-token e4m3 activations (``act_bits=8``, "W4A8"): the spec the kernels reproduce bit for bit.

On Hopper every W4A4 kernel multiplies in 8 bits (int4 values are exact in int8 and e4m3), so 4-bit activations buy
no tensor-core speed there, only smaller activation reads. Per-token e4m3 keeps ~16× finer steps than int4 and needs
no per-group activation scale: the GEMM's per-group rescale is then one multiply by the weight scale instead of two
(kernels/gluon/w4a4_ws.py, A8), and the token's scale waits for the epilogue. The weights stay in the standard
int4_g64 format (a Nunchaku checkpoint's bits), so the choice is the runtime's: ``SVDQLinear.act_bits = 8``.

    xs = RN32(x / λ)            (float32, as the kernels divide)
    t  = RN32(amax_k |xs| / 448)   per row; an all-zero row gets t = 1
    q  = RN_e4m3(RN32(xs / t))  |q| ≤ 448, never saturating

A row holding NaN gets t = 1 and NaN codes, one holding ±Inf t = Inf: the row's outputs are NaN either way.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0

__all__ = ["E4M3_MAX", "quantize_act_e4m3", "dequantize_act_e4m3"]


def quantize_act_e4m3(xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Smoothed activations ``xs`` [M, K] (rounded to float32 first) → (q float8_e4m3fn [M, K], t float32 [M])."""
    if xs.dim() != 2 or not xs.is_floating_point():
        raise ValueError(f"quantize_act_e4m3 expects a floating [M, K] tensor, got {xs.dtype} {list(xs.shape)}")
    x = xs.float()
    if x.shape[1] == 0:
        return torch.empty(x.shape, dtype=E4M3, device=x.device), torch.ones(x.shape[0], device=x.device)
    amax = x.abs().amax(dim=1)
    # a tensor divisor: PyTorch's CUDA division by a Python scalar multiplies by its rounded reciprocal instead
    t = torch.where(amax > 0, amax / torch.full_like(amax, E4M3_MAX), torch.ones_like(amax))
    return (x / t[:, None]).to(E4M3), t.contiguous()


def dequantize_act_e4m3(q: torch.Tensor, t: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(q e4m3 [M, K], t [M]) → ``dtype`` [M, K] = q·t (float32 rounds it; the references ask for float64)."""
    if q.dtype != E4M3 or q.dim() != 2 or t.shape != (q.shape[0], ):
        raise ValueError(f"expected q float8_e4m3fn [M, K] and t [M], got {q.dtype} {list(q.shape)} and "
                         f"{list(t.shape)}")
    return q.to(dtype) * t.to(dtype)[:, None]
