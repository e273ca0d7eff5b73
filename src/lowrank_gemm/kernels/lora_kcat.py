"""The ``kcat`` LoRA strategy: the branch folded into the base GEMM's K dimension.

    y = [x | scale·x·Aᵀ] · [W | B]ᵀ + bias          (K grows by the rank, padded to 64)

One memory-bound pass (:func:`xcat_kernel`) reads x once, writes it into ``xcat[:, :K]`` and
``bf16(scale·x·Aᵀ)`` into the next columns; one cuBLAS GEMM over K + r_pad does the rest. The derived
weight ``[W | B | 0]`` is built once (the strategies' weight cache, or a module that stores it).

Why: at compute-bound M the base product is cuBLAS's best case, and Triton's main loop on Hopper
runs it 4–12 % slower (``lora.md``, M ≥ 1024); here the branch costs r_pad/K more MMA work plus a copy
of x, i.e. ~M·K·4 bytes — small next to the GEMM when N is large (M·N·K flops). S is rounded to the
activation dtype before the expand, as the unfused torch path does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launch
from .schedule import cdiv, next_pow2, num_sms
from .splitk import splitk_arrive, splitk_reset, splitk_store, splitk_sum

# K grows by the rank padded to 64: cuBLAS's bf16 kernels ran K + 8 / K + 16 up to 8 % / 4.5 % slower than K, K + 64
# within ±1 % (H200, probes/s15/kcat)
R_ALIGN = 64


def r_padded(r: int) -> int:
    return cdiv(r, R_ALIGN) * R_ALIGN


@triton.jit
def xcat_kernel(x_ptr, a_ptr, out_ptr, ws_ptr, cnt_ptr, M, K, R, RP, scale, K_PER_SPLIT,
                stride_xm, stride_ar, stride_om,
                BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, SPLIT: tl.constexpr,
                NUM_STAGES: tl.constexpr):
    """out[:, :K] = x; out[:, K:K+RP] = scale·x·Aᵀ (columns ≥ R zero). Grid (row blocks, SPLIT K slices): one
    program walking all of K is a chain of dependent loads (~0.75 µs a step measured, 24 µs at K = 4096 even for
    one row), so K is sliced; S's slices are parked in ``ws`` and summed in slice order by the row block's last
    arriver (:mod:`.splitk`), so the result does not depend on arrival order."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(K, k_lo + K_PER_SPLIT)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
        kk = k0 + offs_k
        k_ok = kk < k_hi
        m2 = row_ok[:, None] & k_ok[None, :]
        xt = tl.load(x_ptr + rows[:, None] * stride_xm + kk[None, :], mask=m2, other=0.0,
                     eviction_policy="evict_first")
        tl.store(out_ptr + rows[:, None] * stride_om + kk[None, :], xt, mask=m2)
        at = tl.load(a_ptr + offs_r[:, None] * stride_ar + kk[None, :], mask=(offs_r[:, None] < R) & k_ok[None, :],
                     other=0.0, eviction_policy="evict_last")
        acc = tl.dot(xt, tl.trans(at), acc)
    s_ptrs = out_ptr + rows[:, None] * stride_om + (K + offs_r)[None, :]
    s_mask = row_ok[:, None] & (offs_r[None, :] < RP)
    if SPLIT == 1:
        tl.store(s_ptrs, (acc * scale).to(out_ptr.dtype.element_ty), mask=s_mask)
    else:
        p_offs = rows[:, None] * BLOCK_R + offs_r[None, :]
        splitk_store(ws_ptr, p_offs, M * BLOCK_R, pid_k, acc, row_ok[:, None])
        if splitk_arrive(cnt_ptr + pid_m, SPLIT):
            total = splitk_sum(ws_ptr, p_offs, M * BLOCK_R, row_ok[:, None], SPLIT,
                               tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32), IN_FLIGHT=2)
            tl.store(s_ptrs, (total * scale).to(out_ptr.dtype.element_ty), mask=s_mask)
            splitk_reset(cnt_ptr + pid_m)


def xcat_plan(M: int, K: int, sms: int, block_k: int = 128) -> tuple[int, int, int]:
    """(rows per program, K slices, pipeline stages). H200, ``probes/s15/kcat2`` and ``xcat_check``:

    - 64-row blocks are the fast ones at M ≥ 1024 (M = 4096, K = 4096: 29 µs against 52–70 for 16 / 32 rows), but
      64 (and 128) rows with a pipelined K loop (stages ≥ 2) — the S product then runs as an async wgmma — gave
      wrong S (1e-2 relative error) and repeats that differ, while the x copy stayed exact. The same tiles with
      one stage (no pipelining) are right and bit-identical on repeat (every one of 8 configs × 4 shapes), at 2–8 µs
      more; so 64 rows, one stage, and K sliced for ~256 programs (M = 4096: 4 slices, 27.3 / 50.7 µs at K = 4096 /
      8192 against 31.0 / 56.4 with 8; M = 1024: 16, within ±1.6 µs of 8). (8 warps with 3 stages was also right,
      but nothing explains why, so it is not relied on.)
    - below M = 1024, 16-row blocks (an mma.sync product), 3 stages, 8 slices: 7.8 µs at M = 256, right and
      repeatable.
    At most 16 slices: the last arriver's sum is a chain of L2 round trips, one per slice. ``sms`` is kept for
    other GPUs' rules."""
    k_steps = cdiv(K, block_k)
    if M < 1024:
        return 16, max(1, min(8, k_steps)), 3
    return 64, max(1, min(16, k_steps, cdiv(256, cdiv(M, 64)))), 1


def build_xcat(x: torch.Tensor, a: torch.Tensor, scale: float, rp: int, *, block_m: int | None = None,
               split: int | None = None, block_k: int = 128, num_stages: int | None = None, num_warps: int = 4,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """[x | scale·x·Aᵀ | 0] as one [M, K + rp] tensor in x's dtype (x [M, K] with unit column stride)."""
    from .lora_gemm import _TICKETS
    M, K = x.shape
    R = a.shape[0]
    if out is None:
        out = torch.empty(M, K + rp, dtype=x.dtype, device=x.device)
    bm, sp, stages = xcat_plan(M, K, num_sms(x.device), block_k)
    bm, sp, stages = block_m or bm, split or sp, num_stages or stages
    block_r = max(16, next_pow2(rp))
    k_per_split = cdiv(cdiv(K, block_k), sp) * block_k
    sp = cdiv(K, k_per_split)          # every slice non-empty
    row_blocks = cdiv(M, bm)
    if sp > 1:
        ws = torch.empty(sp, M, block_r, dtype=torch.float32, device=x.device)
        cnt = _TICKETS.get(x.device, row_blocks)
    else:
        ws = cnt = out
    launch(xcat_kernel, (row_blocks, sp), x, a, out, ws, cnt, M, K, R, rp, float(scale), k_per_split,
           x.stride(0), a.stride(0), out.stride(0), BLOCK_M=bm, BLOCK_K=block_k,
           BLOCK_R=block_r, SPLIT=sp, NUM_STAGES=stages, num_warps=num_warps)
    return out


def packed_wcat(w: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """The [N, K + r_pad] view [W | B | pad] when ``w`` [N, K] and ``b`` [N, r] are adjacent column blocks of one
    row-major buffer (:func:`pack_lora_weights`), else None. The pad columns meet S's zero columns: any finite
    value there is harmless; the packer writes zeros."""
    if w.dim() != 2 or b.dim() != 2 or w.dtype != b.dtype or w.device != b.device:
        return None
    N, K = w.shape
    r = b.shape[1]
    pitch = K + r_padded(r)
    es = w.element_size()
    if (b.shape[0] != N or N == 0 or w.stride() != (pitch, 1) or b.stride() != (pitch, 1)
            or b.data_ptr() != w.data_ptr() + K * es
            or w.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
            or (w.storage_offset() + N * pitch) * es > w.untyped_storage().nbytes()):
        return None
    return w.as_strided((N, pitch), (pitch, 1))


def pack_lora_weights(weight: torch.Tensor, lora_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, lora_b) as views of one [N, K + r_pad] buffer [W | B | 0], the layout on which ``auto`` may run the
    ``kcat`` strategy with no derived weight (same memory as W and B apart, plus the zero pad). Every strategy
    accepts the views (16-byte row pitch when K is a multiple of 8). Keep the pad zero; write new values into the
    views in place (``copy_``) to keep the layout."""
    wcat = kcat_weight(weight, lora_b, r_padded(lora_b.shape[1]))
    K, r = weight.shape[1], lora_b.shape[1]
    return wcat[:, :K], wcat[:, K:K + r]


def kcat_weight(w: torch.Tensor, b: torch.Tensor, rp: int) -> torch.Tensor:
    """[W | B | 0]: [N, K + rp], contiguous (the scale stays on the x side, so one weight serves any scale)."""
    N, R = b.shape
    pad = torch.zeros(N, rp - R, dtype=w.dtype, device=w.device)
    return torch.cat([w, b.to(w.dtype), pad], 1)


def kcat_gemm(xcat: torch.Tensor, wcat: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    if bias is None:
        return torch.mm(xcat, wcat.t(), out=y)
    return torch.addmm(bias, xcat, wcat.t(), out=y)
