"""The epilogue every kernel shares, on the fp32 accumulator tile.

    y = acc ⊙ row_scale[:, None] ⊙ col_scale[None, :] + s · Bᵀ + bias     (reference.lowrank_epilogue_ref)

The scales dequantize the main product only; the low-rank term ``s · Bᵀ`` is one more small MMA
(K = rank) onto the same accumulator, so Y is written once. ``s`` is rounded to B's dtype before
the up-projection, as an unfused ``(x @ A.T) @ B.T`` in that dtype would do.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .schedule import next_pow2

__all__ = ["rank_block", "lowrank_up", "affine", "add_bias", "store_tile", "store_y"]


def rank_block(rank: int) -> int:
    """BLOCK_R of :func:`lowrank_up`: the rank padded to the MMA's K granularity, a power of two ≥ 16
    (``tl.arange``); slots ≥ rank are masked to zero."""
    return max(16, next_pow2(max(rank, 1)))


@triton.jit
def lowrank_up(acc, s, b_ptr, stride_bn, stride_br, offs_n, N, R, BLOCK_R: tl.constexpr):
    """acc [BM, BN] += s [BM, BLOCK_R] · B[offs_n, :R]ᵀ  (B is [N, R]; columns ≥ R read as 0)."""
    offs_r = tl.arange(0, BLOCK_R)
    b_t = tl.load(b_ptr + offs_r[:, None] * stride_br + offs_n[None, :] * stride_bn,
                  mask=(offs_r[:, None] < R) & (offs_n[None, :] < N), other=0.0)  # [BLOCK_R, BN]
    return tl.dot(s.to(b_t.dtype), b_t, acc)


@triton.jit
def affine(acc, offs_m, offs_n, M, N, row_scale_ptr, col_scale_ptr,
           HAS_ROW_SCALE: tl.constexpr, HAS_COL_SCALE: tl.constexpr):
    """Dequantize the main product (row × column scales) — call before :func:`lowrank_up`."""
    if HAS_ROW_SCALE:
        acc = acc * tl.load(row_scale_ptr + offs_m, mask=offs_m < M, other=0.0).to(tl.float32)[:, None]
    if HAS_COL_SCALE:
        acc = acc * tl.load(col_scale_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def add_bias(acc, offs_n, N, bias_ptr, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def store_tile(y_ptr, acc, offs_m, offs_n, M, N, stride_ym, stride_yn):
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn,
             acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_pieces(y_desc, part, off_m, off_n, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr, PIECE: tl.constexpr):
    """``part`` [BM, WIDTH] by TMA in column pieces of ``PIECE`` (halving recursively: ``split`` takes one axis of 2)."""
    if WIDTH == PIECE:
        y_desc.store([off_m, off_n], part)
    else:
        lo, hi = part.reshape(BLOCK_M, 2, WIDTH // 2).permute(0, 2, 1).split()
        _store_pieces(y_desc, lo, off_m, off_n, BLOCK_M, WIDTH // 2, PIECE)
        _store_pieces(y_desc, hi, off_m, off_n + WIDTH // 2, BLOCK_M, WIDTH // 2, PIECE)


@triton.jit
def store_y(y_ptr, acc, offs_m, offs_n, M, N, stride_ym, stride_yn, y_desc, off_m, off_n,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, Y_TMA: tl.constexpr, Y_PIECES: tl.constexpr = 2):
    """Y's tile: by :func:`store_tile`, or (Y_TMA) by TMA in ``Y_PIECES`` column pieces from one staging buffer
    (``y_desc`` box ``[BM, BN / Y_PIECES]``; the copy clips rows past M and columns past N). Pointer stores of a wgmma
    accumulator go through shared memory in chunks with two CTA barriers each; the TMA form writes each piece by
    ``stmatrix`` and lets the copy run on behind the next tile's K loop (session 52). Pieces keep the staging buffer
    small (16 KB a quarter of a 128×256 bf16 tile), so it fits beside the flattened kernel's 4-stage ring."""
    if Y_TMA:
        _store_pieces(y_desc, acc.to(y_ptr.dtype.element_ty), off_m, off_n, BLOCK_M, BLOCK_N, BLOCK_N // Y_PIECES)
    else:
        store_tile(y_ptr, acc, offs_m, offs_n, M, N, stride_ym, stride_yn)
