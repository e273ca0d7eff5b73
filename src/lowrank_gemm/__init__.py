"""lowrank-gemm: a matrix product plus a low-rank branch, fused, on NVIDIA Hopper.

    y = main(x, W) + (x · Aᵀ) · Bᵀ, then per-column scale and bias

``main`` is a bf16/fp16 GEMM (LoRA serving) or a 4-bit W4A4 GEMM (SVDQuant).
The functional API lives in :mod:`lowrank_gemm.ops`, modules in :mod:`lowrank_gemm.nn`,
the float64 spec in :mod:`lowrank_gemm.reference`.
"""

__version__ = "0.1.0"
