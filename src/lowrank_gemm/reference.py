"""The spec: every op of the package written in plain PyTorch, computed in float64.

Tests compare kernels against these functions; they are deliberately simple and slow.
Layouts follow ``nn.Linear`` and PEFT: ``weight [N, K]``, ``lora_a [r, K]``, ``lora_b [N, r]``.
"""

from __future__ import annotations

import torch

__all__ = ["lora_linear_ref", "multi_lora_linear_ref", "lowrank_epilogue_ref"]


def _f64(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().to(torch.float64)


def lowrank_epilogue_ref(main: torch.Tensor, s: torch.Tensor | None, lora_b: torch.Tensor | None,
                         col_scale: torch.Tensor | None = None, row_scale: torch.Tensor | None = None,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """The shared epilogue, in float64.

    ``y = main ⊙ row_scale[:, None] ⊙ col_scale[None, :] + s · lora_bᵀ + bias``

    The scales dequantize the *main* product only (per-token × per-channel for W8A8); the
    low-rank term is already in output units, so it is added after them.
    main [M, N], s [M, r], lora_b [N, r], col_scale/bias [N], row_scale [M].
    """
    y = _f64(main)
    if row_scale is not None:
        y = y * _f64(row_scale)[:, None]
    if col_scale is not None:
        y = y * _f64(col_scale)[None, :]
    if s is not None and lora_b is not None and s.shape[-1] > 0:
        y = y + _f64(s) @ _f64(lora_b).T
    if bias is not None:
        y = y + _f64(bias)
    return y


def lora_linear_ref(x: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                    scale: float = 1.0, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``y = x·Wᵀ + scale·(x·Aᵀ)·Bᵀ + bias`` in float64.

    x [..., K], weight [N, K], lora_a [r, K], lora_b [N, r], bias [N] → y [..., N] (float64).
    """
    x64 = _f64(x).reshape(-1, x.shape[-1])
    s = (x64 @ _f64(lora_a).T) * float(scale)
    y = lowrank_epilogue_ref(x64 @ _f64(weight).T, s, lora_b, bias=bias)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def multi_lora_linear_ref(x: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                          adapter_ids: torch.Tensor, scales: torch.Tensor | None = None,
                          ranks: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row adapters, in float64.

    x [M, K], weight [N, K], lora_a [L, r_max, K], lora_b [L, N, r_max], adapter_ids [M] (−1 = base only),
    scales [L] (default 1), ranks [L] (default r_max: rank slots ≥ ranks[l] are ignored), bias [N].
    """
    x64 = _f64(x)
    y = x64 @ _f64(weight).T
    a64, b64 = _f64(lora_a), _f64(lora_b)
    for row, l in enumerate(adapter_ids.tolist()):
        if l < 0:
            continue
        r = int(ranks[l]) if ranks is not None else a64.shape[1]
        sc = float(scales[l]) if scales is not None else 1.0
        s = (x64[row] @ a64[l, :r].T) * sc
        y[row] += b64[l, :, :r] @ s
    if bias is not None:
        y = y + _f64(bias)
    return y
