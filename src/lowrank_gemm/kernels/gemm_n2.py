"""A plain GEMM whose output tile is two column blocks wide (``BLOCK_N0 + BLOCK_N1``: 128 + 64 = 192, 128 + 32 = 160):
the probe of session 58's finding, not routed by the planner.

Where our plans lose at partial waves of tiles, cuBLAS runs tiles 168, 192 or 320 columns wide, chosen so they fill
the 132 SMs (``probes/s58/s58g``: 168×128 at M = 256, N = 11008 — 132 tiles in 38 µs, where our 86 tiles of 128×256
take 48.6 µs in one round at a higher per-SM rate). Triton's block shapes are powers of two; a tile of two blocks
— one x tile, two W tiles and two accumulators per K step, two wgmmas of N = BLOCK_N0 and BLOCK_N1 — is the nearest
shape it can express. ``y = x·Wᵀ (+ bias)``, x [M, K], W [N, K], 16-bit, every tile in grouped order, one program
per tile (the shapes it is for have about one wave of them). Measured (``scripts/probe_wide_tiles.py``, session 59,
H100, ``probes/s59/s59a``): it does not close the gap — 1.39× cuBLAS at M = 256, N = 11008, and two wgmmas per K
step over the same area as one 128×256 tile cost 6–14 % more than one. The LoRA kernels keep their tiles; this stays
a measurement tool.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ..plan.smem import SmemError, SmemLedger, SmemTerm, barrier_bytes, solve_stages, tile_bytes
from .launch import launch
from .schedule import cdiv, grouped_tile

__all__ = ["gemm_n2", "n2_tiles", "n2_stages", "n2_ledger"]


@triton.jit
def gemm_n2_kernel(x_desc, w0_desc, w1_desc, y0_desc, y1_desc, bias_ptr, M, N, K,
                   BLOCK_M: tl.constexpr, BLOCK_N0: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr, STAGES: tl.constexpr):
    BLOCK_N: tl.constexpr = BLOCK_N0 + BLOCK_N1
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = grouped_tile(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n0 = pid_n * BLOCK_N
    off_n1 = off_n0 + BLOCK_N0
    acc0 = tl.zeros((BLOCK_M, BLOCK_N0), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, BLOCK_N1), dtype=tl.float32)
    for kt in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=STAGES):
        k = kt * BLOCK_K
        x = x_desc.load([off_m, k])
        acc0 = tl.dot(x, w0_desc.load([off_n0, k]).T, acc0)
        acc1 = tl.dot(x, w1_desc.load([off_n1, k]).T, acc1)
    if HAS_BIAS:
        offs0 = off_n0 + tl.arange(0, BLOCK_N0)
        offs1 = off_n1 + tl.arange(0, BLOCK_N1)
        acc0 += tl.load(bias_ptr + offs0, mask=offs0 < N, other=0.0).to(tl.float32)[None, :]
        acc1 += tl.load(bias_ptr + offs1, mask=offs1 < N, other=0.0).to(tl.float32)[None, :]
    # TMA stores clip at the tensor's edge: the second block of the last column tile may lie past N, wholly or in part
    y0_desc.store([off_m, off_n0], acc0.to(y0_desc.dtype))
    y1_desc.store([off_m, off_n1], acc1.to(y1_desc.dtype))


def n2_ledger(block_m: int, block_n0: int, block_n1: int, block_k: int, stages: int, bits: int = 16) -> SmemLedger:
    """The kernel's shared memory (:mod:`~lowrank_gemm.plan.smem`): its ring of x [BM, BK] and both W blocks
    [BN0 + BN1, BK] per stage, and one barrier per stage. The TMA stores' staging reuses the ring once the K loop is
    done (sm_90: 128 × (128 + 64) × 64 at 5 stages compiles to 204 888 B, the ring's 204 800 and its barriers), so
    the ring must hold the output tile."""
    return SmemLedger((SmemTerm("x tile", tile_bytes(block_m, block_k, bits), stages),
                       SmemTerm("W blocks", tile_bytes(block_n0 + block_n1, block_k, bits), stages),
                       SmemTerm("ready barriers", barrier_bytes(1), stages)),
                      label=f"gemm_n2 {block_m}x({block_n0}+{block_n1})x{block_k}")


def n2_stages(block_m: int, block_n0: int, block_n1: int, block_k: int) -> int:
    """The deepest ring (2–6 stages) the ledger lets through; refused (SmemError) where that ring cannot hold the
    output tile it stages last."""
    stages, _, ledger = solve_stages(lambda st, _: n2_ledger(block_m, block_n0, block_n1, block_k, st))
    ring = ledger.total() - barrier_bytes(stages)
    if ring < tile_bytes(block_m, block_n0 + block_n1, 16):
        raise SmemError(f"a ring of {ring} B cannot stage the {block_m}x{block_n0 + block_n1} output tile:\n"
                        f"{ledger.table()}")
    return stages


def n2_tiles(M: int, N: int, block_m: int, block_n0: int, block_n1: int) -> int:
    return cdiv(M, block_m) * cdiv(N, block_n0 + block_n1)


def gemm_n2(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, block_m: int = 128,
            block_n0: int = 128, block_n1: int = 64, block_k: int = 64, group_m: int = 2, num_warps: int = 8,
            stages: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x·Wᵀ (+ bias)`` on tiles of ``block_m × (block_n0 + block_n1)`` (module doc). 16-bit x and W of one dtype,
    K and N multiples of 8 (16-byte TMA rows); ``out`` (e.g. a NaN-poisoned buffer in tests) is written in place."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x [M, K] and W [N, K] with one K, got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16) or w.dtype != x.dtype:
        raise TypeError(f"x and W must be float16 or bfloat16 of one dtype, got {x.dtype} and {w.dtype}")
    if x.shape[1] % 8 or w.shape[0] % 8:
        raise ValueError(f"K and N must be multiples of 8 (16-byte TMA rows of x, W and y), got K={x.shape[1]}, "
                         f"N={w.shape[0]}")
    for name, v in (("block_m", block_m), ("block_n0", block_n0), ("block_n1", block_n1), ("block_k", block_k)):
        if v < 16 or v & (v - 1) or v > 256:
            raise ValueError(f"{name} must be a power of two in [16, 256], got {v}")
    M, K = x.shape
    N = w.shape[0]
    x, w = x.contiguous(), w.contiguous()
    y = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    if M == 0:
        return y
    stages = stages or n2_stages(block_m, block_n0, block_n1, block_k)
    launch(gemm_n2_kernel, (n2_tiles(M, N, block_m, block_n0, block_n1),),
           TensorDescriptor.from_tensor(x, [block_m, block_k]), TensorDescriptor.from_tensor(w, [block_n0, block_k]),
           TensorDescriptor.from_tensor(w, [block_n1, block_k]), TensorDescriptor.from_tensor(y, [block_m, block_n0]),
           TensorDescriptor.from_tensor(y, [block_m, block_n1]), bias if bias is not None else y, M, N, K,
           BLOCK_M=block_m, BLOCK_N0=block_n0, BLOCK_N1=block_n1, BLOCK_K=block_k, GROUP_M=group_m,
           HAS_BIAS=bias is not None, STAGES=stages, num_warps=num_warps)
    return y
