"""Host-side pieces every Gluon launcher shares: torch → Gluon dtypes, TMA descriptors with the default
NVMMA shared layout, and cached placeholder tensors for arguments a specialization never reads."""

from __future__ import annotations

import functools

import torch
from triton.experimental.gluon import language as gl

from ..persistent import capturing, persistent_zeros

__all__ = ["TORCH_TO_GL", "nvmma_layout", "flat_layout", "desc", "dummy"]

TORCH_TO_GL = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32,
               torch.int8: gl.int8, torch.uint8: gl.uint8, torch.float8_e4m3fn: gl.float8e4nv}


def nvmma_layout(block, dtype):
    return _nvmma_layout(tuple(block), dtype)


# Layouts are immutable; building one costs 3–6 µs of a CPU core (Gluon validates it in __post_init__), and a W4A4
# launch describes five to seven tensors per call.
@functools.lru_cache(maxsize=256)
def _nvmma_layout(block: tuple, dtype):
    return gl.NVMMASharedLayout.get_default_for(list(block), TORCH_TO_GL[dtype])


@functools.lru_cache(maxsize=64)
def flat_layout(bits: int, rank: int = 1):
    """The unswizzled shared layout of a row-table box (scale rows, multiplier rows): plain slots the consumer loads
    straight into a slice layout."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=rank)


def desc(t, block, layout=None):
    """Host TMA descriptor of ``t`` with box ``block`` (default: the NVMMA layout wgmma reads)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    return TensorDescriptor.from_tensor(t, list(block), layout or nvmma_layout(block, t.dtype))


_DUMMIES: dict = {}


def dummy(device, dtype, shape):
    """A cached zero tensor standing in for an argument the compiled variant never reads."""
    key = (str(device), dtype, tuple(shape))
    t = _DUMMIES.get(key)
    if t is None:
        device = torch.device(device)
        if capturing(device):          # the graph owns it; made again by the next capture if none exists by then
            return torch.zeros(shape, dtype=dtype, device=device)
        t = _DUMMIES[key] = persistent_zeros(shape, dtype, device)
    return t
