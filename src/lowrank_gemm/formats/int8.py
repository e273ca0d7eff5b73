"""Symmetric int8 for the W8A8 baseline: per-output-channel weights, per-token activations.

Scales are 16-bit and rounded before quantizing, like int4 (see :mod:`lowrank_gemm.formats._groups`).
"""

from __future__ import annotations

import torch

from ._groups import check_float, check_scale_dtype, dequantize_groups, quantize_groups

INT8_MAX = 127


def quantize_rows_int8(
    t: torch.Tensor, scale_dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row of ``t`` [R, K] → (q int8 [R, K] in [-128, 127], scales [R]).

    Used for weights [N, K] (per-channel) and activations [M, K] (per-token).
    """
    check_float(t, "t")
    check_scale_dtype(scale_dtype)
    if t.dim() != 2 or t.shape[1] == 0:
        raise ValueError(f"quantize_rows_int8 expects a 2-D [R, K>0] tensor, got {list(t.shape)}")
    q, scales = quantize_groups(t, t.shape[1], INT8_MAX, scale_dtype)
    return q, scales.reshape(-1)


def dequantize_rows_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``q`` int8 [R, K], ``scales`` [R] → float32 [R, K]."""
    return dequantize_groups(q, scales.reshape(1, -1), q.shape[1])
