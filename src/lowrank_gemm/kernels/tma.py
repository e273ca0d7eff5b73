"""Host-side TMA rules shared by every launcher: what a tensor must satisfy to be a TMA operand, and the
cheapest way to make it so."""

from __future__ import annotations

import torch

__all__ = ["TMA_ALIGN", "tma_ready", "tma_operand"]

TMA_ALIGN = 16   # bytes: base address and every row pitch of a TMA tensor


def tma_ready(t: torch.Tensor) -> bool:
    """Unit stride along the last dim, 16-byte aligned base and row pitches."""
    es = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % TMA_ALIGN == 0
            and all((s * es) % TMA_ALIGN == 0 for s in t.stride()[:-1]))


def tma_operand(t: torch.Tensor, cols: int) -> torch.Tensor:
    """``t [rows, c]`` as a TMA-legal tensor: last dim zero-padded to ``cols``, contiguous, aligned. A copy
    only when the caller's tensor is not already legal."""
    if t.shape[-1] != cols:
        t = torch.nn.functional.pad(t, (0, cols - t.shape[-1]))
    if not tma_ready(t):
        t = t.contiguous()
        if not tma_ready(t):
            t = t.clone()  # contiguous but offset view: a fresh allocation is 256-B aligned
    return t
