"""The public functional API. Each op is a ``torch.library`` custom op (with a fake impl, so it
traces under ``torch.compile`` and captures in CUDA graphs); the kernel file of its family holds
the kernels, the launcher and the op, and this module gathers them.

- :func:`lora_linear` — ``y = x·Wᵀ + scale·(x·Aᵀ)·Bᵀ + bias`` (one adapter); :func:`pack_lora_weights` lays W and
  B out as one buffer, on which ``auto`` may fold the branch into a cuBLAS GEMM's K (the ``kcat`` strategy)
- :func:`multi_lora_linear` — per-row adapters from a bank (−1 = base only)
- :func:`w4a4_linear` — SVDQuant W4A4 layer: quantize activations, 4-bit GEMM, low-rank branch
"""

from .kernels.lora_gemm import lora_linear
from .kernels.lora_kcat import pack_lora_weights
from .kernels.multilora_gemm import multi_lora_linear
from .kernels.w4a4_gemm import w4a4_linear

__all__ = ["lora_linear", "pack_lora_weights", "multi_lora_linear", "w4a4_linear"]
