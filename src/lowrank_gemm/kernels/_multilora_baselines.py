"""Bench baselines for the fused multi-LoRA GEMM (not used by the op).

- ``torch_loop``: cuBLAS base GEMM, then per adapter present a masked ``addmm`` (no host sync, so it
  can be captured; the caller passes the adapter slots to loop over).
- ``shrink_expand``: Punica/vLLM-style BGMV in our own Triton on top of the cuBLAS base GEMM: a shrink
  kernel ``S[m] = scale·x[m]·A[id[m]]ᵀ`` (one program per row × K slice, partial sums in an fp32
  workspace, no atomics) and an expand kernel ``y[m] += S[m]·B[id[m]]ᵀ`` (one program per row × N block).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lowrank_gemm.kernels.epilogue import rank_block
from lowrank_gemm.kernels.launch import launch
from lowrank_gemm.kernels.schedule import cdiv

__all__ = ["torch_loop", "shrink_expand"]


@triton.jit
def _bgmv_shrink_kernel(
        x_ptr,      # (M, K)
        a_ptr,      # (L, R_MAX, K)
        ids_ptr,    # (M,) int32
        ranks_ptr,  # (L,) int32
        s_ptr,      # (SPLIT, M, BLOCK_R) fp32, out
        K, L, R_MAX, K_PER_SPLIT, stride_xm, stride_al, stride_ar, stride_ss, stride_sm,
        BLOCK_R: tl.constexpr, BK: tl.constexpr):
    m = tl.program_id(0)
    split = tl.program_id(1)
    lid = tl.load(ids_ptr + m)
    offs_r = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_R,), tl.float32)
    if (lid >= 0) & (lid < L):
        rank = tl.minimum(tl.load(ranks_ptr + lid), R_MAX)
        k_lo = split * K_PER_SPLIT
        k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
        for k in range(k_lo, k_hi, BK):
            offs_k = k + tl.arange(0, BK)
            xv = tl.load(x_ptr + m * stride_xm + offs_k, mask=offs_k < k_hi, other=0.0).to(tl.float32)
            at = tl.load(a_ptr + lid.to(tl.int64) * stride_al + offs_r[:, None] * stride_ar + offs_k[None, :],
                         mask=(offs_r[:, None] < rank) & (offs_k[None, :] < k_hi), other=0.0)
            acc += tl.sum(at.to(tl.float32) * xv[None, :], axis=1)
    tl.store(s_ptr + split * stride_ss + m * stride_sm + offs_r, acc)


@triton.jit
def _bgmv_expand_kernel(
        y_ptr,      # (M, N), updated in place
        s_ptr,      # (SPLIT, M, BLOCK_R) fp32
        b_ptr,      # (L, N, R_MAX)
        ids_ptr, ranks_ptr, scales_ptr,
        N, L, R_MAX, SPLIT, stride_ym, stride_ss, stride_sm, stride_bl, stride_bn,
        BLOCK_R: tl.constexpr, BN: tl.constexpr):
    m = tl.program_id(0)
    pid_n = tl.program_id(1)
    lid = tl.load(ids_ptr + m)
    if (lid >= 0) & (lid < L):
        rank = tl.minimum(tl.load(ranks_ptr + lid), R_MAX)
        offs_r = tl.arange(0, BLOCK_R)
        s = tl.zeros((BLOCK_R,), tl.float32)
        for sp in range(0, SPLIT):
            s += tl.load(s_ptr + sp * stride_ss + m * stride_sm + offs_r)
        s = s * tl.load(scales_ptr + lid)
        s = s.to(b_ptr.dtype.element_ty).to(tl.float32)    # S rounded like the fused epilogue does
        offs_n = pid_n * BN + tl.arange(0, BN)
        bt = tl.load(b_ptr + lid.to(tl.int64) * stride_bl + offs_n[:, None] * stride_bn + offs_r[None, :],
                     mask=(offs_n[:, None] < N) & (offs_r[None, :] < rank), other=0.0)
        delta = tl.sum(bt.to(tl.float32) * s[None, :], axis=1)
        yp = y_ptr + m * stride_ym + offs_n
        y = tl.load(yp, mask=offs_n < N, other=0.0).to(tl.float32)
        tl.store(yp, (y + delta).to(y_ptr.dtype.element_ty), mask=offs_n < N)


def shrink_expand(x, weight, bank_a, bank_b, ranks, scales, adapter_ids, bias=None, split: int = 8,
                  block_k: int = 256, block_n: int = 128) -> torch.Tensor:
    """cuBLAS ``x·Wᵀ + bias``, then BGMV shrink and expand. Shapes as ``multi_lora_gemm``."""
    M, K = x.shape
    L, r_max, _ = bank_a.shape
    N = weight.shape[0]
    y = torch.nn.functional.linear(x, weight, bias)
    if M == 0 or L == 0:
        return y
    ids = adapter_ids.to(torch.int32)
    block_r = rank_block(r_max)
    split = max(1, min(split, cdiv(K, block_k)))
    k_per_split = cdiv(cdiv(K, split), block_k) * block_k
    s = torch.empty((split, M, block_r), dtype=torch.float32, device=x.device)
    launch(_bgmv_shrink_kernel, (M, split), x, bank_a, ids, ranks, s, K, L, r_max, k_per_split, x.stride(0),
           bank_a.stride(0), bank_a.stride(1), s.stride(0), s.stride(1), BLOCK_R=block_r, BK=block_k, num_warps=4)
    launch(_bgmv_expand_kernel, (M, cdiv(N, block_n)), y, s, bank_b, ids, ranks, scales, N, L, r_max, split,
           y.stride(0), s.stride(0), s.stride(1), bank_b.stride(0), bank_b.stride(1), BLOCK_R=block_r, BN=block_n,
           num_warps=4)
    return y


def torch_loop(x, weight, bank_a, bank_b, ranks_host: list[int], scales, adapter_ids, slots, bias=None):
    """cuBLAS base + one masked low-rank pair per adapter slot in ``slots`` (host list)."""
    y = torch.nn.functional.linear(x, weight, bias)
    for l in slots:
        r = ranks_host[l]
        s = (x @ bank_a[l, :r].T) * (scales[l] * (adapter_ids == l)).to(x.dtype)[:, None]
        y.addmm_(s, bank_b[l, :, :r].T)
    return y
