"""W4A4 GEMV for a handful of tokens: the layer as a weight stream on the CUDA cores, no tensor cores (impl="auto"
routes both formats with M ≤ :func:`auto_gemv_max_m` here; impl="gemv" forces it).

    out[m, n] = epilogue( Σ_g xs[g, m] · ws[g, n] · Σ_{k ∈ g} q_x[m, k] · q_w[n, k] )     (int4_g64)

Why: at M = 1 the decode GEMM (gluon/w4a4_decode.py) spends its time in a per-CTA chain — wait for the TMA slot,
ldmatrix, expand, wgmma, wait, rescale — while 15/16 of every wgmma multiplies zero tokens; it streams the 58.7 MB of
K=4096, N=28672 weights in ~29 µs where a plain load kernel with ≥ 4 programs per SM needs 16.3 µs
(NOTES.md, session 5, ``probe_stream``). Here every thread loads 16-byte runs of packed weights with ordinary
vectorized loads (many small programs keep the bytes in flight) and does the arithmetic in 8-bit SIMD:

- a 32-bit word of packed weights holds K positions 4j..4j+3 (low nibbles) and 32+4j..32+4j+3 (high nibbles) of a
  64-wide packing block (formats/int4.py). One LOP3 turns four nibbles into offset bytes n' = q + 8 (u8), so two
  ``dp4a.u32.s32`` against the token's signed bytes at the same K positions give Σ q_x·n' over those 8 positions:
  five instructions per 8 weights per token (``_DOT_ASM``);
- the token's packed word at the same index covers the same K positions; its nibbles become signed bytes (three
  integer ops per four, kernels/int4_unpack.py) with their sums R = Σ q_x over each 16-byte quarter;
- per quarter (half a group: it lies in one group): S = Σ q_x·n' − 8·R exact in int32, then
  acc += S · ws[g, n] · xs[g, m] in fp32 — per-(row, quarter) partials, reduced across the row's threads once;
- epilogue: × col_scale[n], + Σ_r lora_up[n, r]·s[m, r] (s rounded to lora_up's dtype like the unfused
  reference), + bias[n], store.

int4_2l (session 10; routed since session 11, after its GPU run): the activations are act_quant's expanded int8
values, so the token words need no unpacking (a weight word's low / high K positions are activation words 16b + j /
16b + 8 + j of its 64-block b); each quarter's exact int32 partial is multiplied by the group's integer multiplier u
and summed in int32, and the per-token t and per-row s scale the row sum once — no per-group float rescale.

Two kernels, one arithmetic. :func:`w4a4_gemv_gl_kernel` (Gluon, what runs on the GPU) states every layout: the
weights as [BN, Q, 4] words with 16 bytes per thread, and everything else in slices of that layout, so the K loop
has no shared memory, barrier or shuffle. :func:`w4a4_gemv_kernel` (Triton) is its interpreter twin for the CPU
tests (``SWAR=False``: plain integer ops instead of inline PTX); compiled, Triton lays the scale loads out along
rows and moves its accumulator through shared memory every iteration (NOTES.md, session 7).

One program per (BLOCK_N weight rows, token), token fastest, so a second token's read of the rows hits L2;
``GemvConfig.split`` > 1 deals a row block's K chunks to that many programs, which meet in the same launch
(kernels/splitk.py: an atomic ticket elects the reducer, the partials are summed in a fixed order). The config
depends on the row count (:func:`gemv_config`). Deterministic: fixed reduction orders, no result through an
atomic. PDL (kernels/pdl.py): the launch may start while act_quant finishes; the first weight chunk is loaded
before ``griddepcontrol.wait``, nothing the previous kernel writes is read before it.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from .env import env_on, getenv, pinned_config
from .epilogue import rank_block
from .gluon.host import dummy
from .int4_unpack import SWAR_DEFAULT
from .launch import launch
from .pdl import gdc_launch_dependents, gdc_wait, gl_gdc_launch_dependents, gl_gdc_wait, pdl_enabled
from .schedule import cdiv
from .splitk import splitk_arrive, splitk_reset, splitk_store, splitk_sum

FORMATS = ("int4_g64", "int4_2l")      # the weight formats the GEMV runs (int4_2l on act_quant's int8 activations)

__all__ = ["FORMATS", "launch_w4a4_gemv", "act_quant_early_launch", "w4a4_gemv_kernel", "w4a4_gemv_gl_kernel",
           "gemv_args", "AUTO_GEMV_MAX_M", "auto_gemv_max_m", "gemv_enabled", "gemv_config", "GemvConfig", "DEFAULT_CONFIG", "WIDE_CONFIG", "aot_signature_gemv"]

# impl="auto" routes int4_g64 with M ≤ this here (w4a4_gemm._route). H200 (probes/s7/gemv_run2, K=4096, N=28672,
# GEMM alone): M=1 23.4 µs vs the decode kernel's 30.8, M=2 28.0 vs 31.6, M=4 44.3 vs 31.5 (every token re-runs
# the dp4a work; past two the tensor cores' token reuse wins). int4_2l too (probes/s11/variants, layer vs the decode
# kernel's, µs): K = 4096, N = 28672 M = 1 / 2 21.7 / 28.5 vs 27.9 / 28.3; N = 4096 7.9 / 11.1 vs 19.8 / 21.9;
# N = 14336 13.7 / 16.5 vs 24.2 / 24.4; K = 14336, N = 4096 25.0 / 26.0 vs 58.9 / 60.6.
AUTO_GEMV_MAX_M = 2
# (Sessions 7–8 also sent M = 3–4 here when N < MANY_ROWS; since session 9 the skinny GEMM takes them: K = N = 4096,
# M = 4, GEMM alone 11.6 µs vs 17.0 here, probes/s9/skinny_rt.)


def auto_gemv_max_m(n: int) -> int:
    """The largest M impl="auto" sends here for a layer of ``n`` weight rows (the same for every ``n`` today)."""
    return AUTO_GEMV_MAX_M

# Σ q_x · n'_w over the 8 K positions of one packed weight word ($1) against the token's signed bytes at the low
# ($2) and high ($3) positions; n' = (nibble ^ 8) = q_w + 8 via LOP3 ((a & b) ^ c).
_DOT_ASM = tl.constexpr("""{
.reg .b32 lo, hi, t;
lop3.b32 lo, $1, 0x0F0F0F0F, 0x08080808, 0x6a;
shr.u32 t, $1, 4;
lop3.b32 hi, t, 0x0F0F0F0F, 0x08080808, 0x6a;
dp4a.u32.s32 t, lo, $2, 0;
dp4a.u32.s32 $0, hi, $3, t;
}""")


@triton.jit
def _signed_bytes(u):
    """Four nibbles (uint32 ``u``, one per byte, two's complement int4) → four int8 bytes as an int32 word:
    ((n ^ 8) + 120) ^ 128 per byte, no carry crossing a byte (kernels/int4_unpack.py)."""
    return (((u ^ 0x08080808) + 0x78787878) ^ 0x80808080).to(tl.int32, bitcast=True)


@triton.jit
def _word_dot(w, xlo, xhi, SWAR: tl.constexpr):
    """Σ over the word's 8 K positions of q_x · (q_w + 8) (int32)."""
    if SWAR:
        return tl.inline_asm_elementwise(_DOT_ASM, "=r,r,r,r", [w, xlo, xhi], dtype=tl.int32, is_pure=True, pack=1)
    else:
        acc = tl.zeros(w.shape, tl.int32)
        for i in tl.static_range(4):
            lo = (w >> (8 * i)) & 0x0F ^ 0x08
            hi = (w >> (8 * i + 4)) & 0x0F ^ 0x08
            xl = ((xlo >> (8 * i)) & 0xFF ^ 0x80) - 0x80          # the byte as int8
            xh = ((xhi >> (8 * i)) & 0xFF ^ 0x80) - 0x80
            acc += lo * xl + hi * xh
        return acc


# ``cp.async.bulk.prefetch.L2`` of $2 bytes at $1 when $2 > 0 (the GEMV's L2_PREFETCH knob); $0 is a dummy.
_L2_PREFETCH_ASM = tl.constexpr("""{
.reg .pred p;
setp.gt.s32 p, $2, 0;
@p cp.async.bulk.prefetch.L2.global [$1], $2;
mov.u32 $0, 0;
}""")

_SUM_ASM = tl.constexpr("""{
.reg .b32 t;
dp4a.s32.s32 t, $1, 0x01010101, 0;
dp4a.s32.s32 $0, $2, 0x01010101, t;
}""")


@triton.jit
def _byte_sum2(a, b, SWAR: tl.constexpr):
    """Sum of the eight int8 bytes of ``a`` and ``b`` (int32)."""
    if SWAR:
        return tl.inline_asm_elementwise(_SUM_ASM, "=r,r,r", [a, b], dtype=tl.int32, is_pure=True, pack=1)
    else:
        acc = tl.zeros(a.shape, tl.int32)
        for i in tl.static_range(4):
            acc += (((a >> (8 * i)) & 0xFF ^ 0x80) - 0x80) + (((b >> (8 * i)) & 0xFF ^ 0x80) - 0x80)
        return acc


@triton.jit
def _twolevel_words(w):
    """int4_2l: the int8-activation word holding the low-nibble K positions of packed weight word ``w`` (a word of
    64-block b, j = w % 8, covers K b·64 + 4j..4j+3 low and +32 high: activation words 16b + j and 16b + 8 + j)."""
    return (w // 8) * 16 + w % 8


@triton.jit(do_not_specialize=["M", "N", "K", "R"])
def w4a4_gemv_kernel(xq_ptr, xs_ptr, wq_ptr, ws_ptr, s_ptr, up_ptr, bias_ptr, cs_ptr, y_ptr,
                     M, N, K, R, stride_sm, stride_un, stride_ym, wu_ptr,
                     G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, BLOCK_R: tl.constexpr,
                     HAS_LOWRANK: tl.constexpr, HAS_COL_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
                     SWAR: tl.constexpr, PDL: tl.constexpr, TWO_LEVEL: tl.constexpr = False):
    """xq int32 words [M, K/8] (packed int4 activations), xs [K/G, M]; wq int32 words [N, K/8], ws [K/G, N]; s fp32
    [M, R], up [N, R]; y [M, N]. BLOCK_KW packed words (8·BLOCK_KW K positions) per K chunk, whole groups.
    TWO_LEVEL (int4_2l): xq the expanded int8 activations as words [M, K/4], xs t [M], ws s [N], wu u [K/G, N]:
    int32 partials × u summed exactly, × t·s once (:func:`_twolevel_words`)."""
    WPG: tl.constexpr = G // 8                 # packed words per group
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    m = pid % M
    n0 = (pid // M) * BLOCK_N
    rows = n0 + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    kw_total = tl.multiple_of(K // 8, 8)       # words per row: K % 64 == 0, so rows start 32-byte aligned
    offs_w = tl.arange(0, BLOCK_KW)
    zero_rows = tl.zeros((BLOCK_N, 1), tl.int32)
    # Every operand is addressed per (row, word) in the weights' [BN, BKW] shape (a 1-D token vector broadcast
    # into it cost a shared-memory round trip and ~8 bar.syncs per iteration in the first version); a thread's
    # repeated addresses (the token words of its rows, a group's scales) are loaded once (CSE). Compiled, Triton
    # still lays the scale loads out along rows and converts the accumulator through shared memory each iteration
    # (2 bar.syncs): the Gluon kernel below is the one that runs on the GPU. Per-word fp32 partials; one
    # reduction across the row's threads after the loop.
    acc2 = tl.zeros((BLOCK_N, BLOCK_KW), tl.float32)
    w_ptrs = wq_ptr + rows[:, None].to(tl.int64) * kw_total + offs_w[None, :]
    x_ptrs = xq_ptr + m * kw_total + offs_w[None, :] + zero_rows
    g_of_w = (offs_w // WPG)[None, :] + zero_rows                       # [BN, BKW] group of each word, chunk-relative
    ws_ptrs = ws_ptr + g_of_w * N + rows[:, None]
    xs_ptrs = xs_ptr + g_of_w * M + m
    w_next = tl.load(w_ptrs, mask=row_ok[:, None], other=0)       # the weights do not depend on the previous kernel
    if PDL:
        gdc_wait()            # the token, its scales and s come from the previous kernel (act_quant)
    if TWO_LEVEL:
        xt_ptrs = xq_ptr + m * (2 * kw_total) + _twolevel_words(offs_w)[None, :] + zero_rows
        acc_i = tl.zeros((BLOCK_N, BLOCK_KW), tl.int32)
        for kw in range(0, kw_total, BLOCK_KW):
            w = w_next
            w_next = tl.load(w_ptrs + kw + BLOCK_KW, mask=row_ok[:, None] & (kw + BLOCK_KW < kw_total), other=0)
            xlo = tl.load(xt_ptrs + 2 * kw)
            xhi = tl.load(xt_ptrs + 2 * kw + 8)
            u = tl.load(wu_ptr + (kw // WPG + g_of_w) * N + rows[:, None], mask=row_ok[:, None], other=0)
            acc_i += (_word_dot(w, xlo, xhi, SWAR) - 8 * _byte_sum2(xlo, xhi, SWAR)) * u.to(tl.int32)
        ts = tl.load(xs_ptr + m) * tl.load(ws_ptr + rows, mask=row_ok, other=0.0)
        acc = tl.sum(acc_i, axis=1).to(tl.float32) * ts
    else:
        for kw in range(0, kw_total, BLOCK_KW):
            w = w_next
            # the next chunk's loads go out before this one's arithmetic (a register double buffer: two chunks in
            # flight per thread)
            w_next = tl.load(w_ptrs + kw + BLOCK_KW, mask=row_ok[:, None] & (kw + BLOCK_KW < kw_total), other=0)
            xw = tl.load(x_ptrs + kw).to(tl.uint32, bitcast=True)
            xlo = _signed_bytes(xw & 0x0F0F0F0F)
            xhi = _signed_bytes((xw >> 4) & 0x0F0F0F0F)
            g0 = kw // WPG
            ws = tl.load(ws_ptrs + g0 * N, mask=row_ok[:, None], other=0.0).to(tl.float32)
            xs = tl.load(xs_ptrs + g0 * M).to(tl.float32)
            # Σ over the word's 8 positions of q_x·q_w = Σ q_x·(q_w + 8) − 8·Σ q_x, exact in int32
            d = _word_dot(w, xlo, xhi, SWAR) - 8 * _byte_sum2(xlo, xhi, SWAR)
            acc2 += d.to(tl.float32) * (ws * xs)
        acc = tl.sum(acc2, axis=1)
    if HAS_COL_SCALE:
        acc = acc * tl.load(cs_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    if HAS_LOWRANK:
        offs_r = tl.arange(0, BLOCK_R)
        r_ok = offs_r < R
        sv = tl.load(s_ptr + m * stride_sm + offs_r, mask=r_ok, other=0.0)
        sv = sv.to(up_ptr.dtype.element_ty).to(tl.float32)           # rounded like an unfused s @ B.T
        up = tl.load(up_ptr + rows[:, None] * stride_un + offs_r[None, :], mask=row_ok[:, None] & r_ok[None, :],
                     other=0.0).to(tl.float32)
        acc += tl.sum(up * sv[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_ym + rows, acc.to(y_ptr.dtype.element_ty), mask=row_ok)


@gluon.constexpr_function
def _word_layout(block_n, block_kw, num_warps):
    """[BN, Q, 4] packed words, 4 consecutive words (16 bytes: one vector load, one 16-byte quarter of a group)
    per thread; the quarters of a row across a warp's threads, rows across the rest and the warps."""
    q = block_kw // 4
    tk = min(q, 32)
    return gl.BlockedLayout([1, 1, 4], [32 // tk, tk, 1], [num_warps, 1, 1], [2, 1, 0])


@gluon.jit(do_not_specialize=["M", "N", "K", "R"])
def w4a4_gemv_gl_kernel(xq_ptr, xs_ptr, wq_ptr, ws_ptr, s_ptr, up_ptr, bias_ptr, cs_ptr, y_ptr, part_ptr, cnt_ptr,
                        M, N, K, R, stride_sm, stride_un, stride_ym, wu_ptr,
                        G: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_KW: gl.constexpr, BLOCK_R: gl.constexpr,
                        HAS_LOWRANK: gl.constexpr, HAS_COL_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr,
                        SWAR: gl.constexpr, PDL: gl.constexpr, SPLIT: gl.constexpr = 1,
                        TWO_LEVEL: gl.constexpr = False, W_CACHE: gl.constexpr = "", W_EVICT: gl.constexpr = "",
                        LATE_W: gl.constexpr = False, L2_PREFETCH: gl.constexpr = 0, CP_STAGES: gl.constexpr = 0,
                        EPI_EARLY: gl.constexpr = False):
    """:func:`w4a4_gemv_kernel` with every layout explicit (Gluon): the weights as [BN, Q, 4] words, 16 bytes per
    thread; the token words, their byte sums and the group scales in slices of that layout, so nothing crosses
    threads inside the K loop (the Triton version's compiler laid the scale loads out along rows and moved its
    accumulator through shared memory every iteration). Per (row, quarter) fp32 partials; one cross-thread
    reduction after the loop."""
    WPG: gl.constexpr = G // 8
    Q: gl.constexpr = BLOCK_KW // 4
    L3: gl.constexpr = _word_layout(BLOCK_N, BLOCK_KW, gl.num_warps())
    LQ: gl.constexpr = gl.SliceLayout(2, L3)            # [BN, Q]
    LROW: gl.constexpr = gl.SliceLayout(1, LQ)          # [BN]
    LQV: gl.constexpr = gl.SliceLayout(0, LQ)           # [Q]
    LX: gl.constexpr = gl.SliceLayout(0, L3)            # [Q, 4] token words
    if PDL:
        gl_gdc_launch_dependents()
    pid = gl.program_id(0)
    m = pid % M                      # programs: token fastest, then the split, then the row block
    split = (pid // M) % SPLIT
    n0 = (pid // M) // SPLIT * BLOCK_N
    kw_total = gl.multiple_of(K // 8, 8)       # words per row: K % 64 == 0, so rows start 32-byte aligned
    rows = n0 + gl.arange(0, BLOCK_N, LROW)
    row_ok = rows < N
    q = gl.arange(0, Q, LQV)
    i4 = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    i4x = gl.arange(0, 4, gl.SliceLayout(0, LX))
    qx = gl.arange(0, Q, gl.SliceLayout(1, LX))
    word3 = (q * 4)[None, :, None] + i4[None, None, :]                      # [1, Q, 4] word in the chunk
    w_ptrs = wq_ptr + (rows.to(gl.int64) * kw_total)[:, None, None] + word3
    w_mask = row_ok[:, None, None] & (word3 >= 0)
    x_ptrs = xq_ptr + m * kw_total + (qx * 4)[:, None] + i4x[None, :]       # [Q, 4]
    gq = (q * 4) // WPG                                                     # [Q] group of each quarter
    ws_ptrs = ws_ptr + gq[None, :] * N + rows[:, None]                      # [BN, Q]
    ws_mask = row_ok[:, None] & (gq >= 0)[None, :]
    xs_ptrs = xs_ptr + gq * M + m                                           # [Q]
    acc2 = gl.zeros([BLOCK_N, Q], gl.float32, LQ)
    # this program's K chunks [c_lo, c_hi) of the row block's chunks (SPLIT programs share a row block)
    n_chunks = kw_total // BLOCK_KW
    kw_lo = (split * n_chunks // SPLIT) * BLOCK_KW
    kw_hi = ((split + 1) * n_chunks // SPLIT) * BLOCK_KW
    # one chunk in flight ahead of the one in use (a deeper register ring measured slower: probes/s7/gemv_run4);
    # the weights do not depend on the previous kernel, so the first load goes out before griddepcontrol.wait
    # (LATE_W, probe knob: after it, so ~7 MB of weight loads do not queue ahead of act_quant's own)
    if PDL and LATE_W:
        gl_gdc_wait()
    if CP_STAGES > 0:
        # (probe knob) a cp.async ring of CP_STAGES chunks in shared memory instead of the register double buffer:
        # CP_STAGES − 1 chunks in flight without holding registers; each thread reads back only its own 16 bytes
        ring = gl.allocate_shared_memory(gl.int32, [CP_STAGES, BLOCK_N, Q, 4],
                                         gl.SwizzledSharedLayout(4, 1, 1, [2, 1, 0]))
        for s in gl.static_range(CP_STAGES - 1):
            async_copy.async_copy_global_to_shared(ring.index(s), w_ptrs + kw_lo + s * BLOCK_KW,
                                                   mask=w_mask & (kw_lo + s * BLOCK_KW < kw_hi),
                                                   eviction_policy=W_EVICT)
            async_copy.commit_group()
        w_next = gl.zeros([BLOCK_N, Q, 4], gl.int32, L3)
    else:
        ring = 0
        w_next = gl.load(w_ptrs + kw_lo, mask=w_mask & (kw_lo < kw_hi), other=0, cache_modifier=W_CACHE,
                         eviction_policy=W_EVICT)
    if L2_PREFETCH > 0:
        # (probe knob) the next L2_PREFETCH chunks of every row, which lie contiguous after the first, into L2
        # while the program waits for act_quant: one bulk prefetch per row, by the row's q = 0 thread
        ahead = gl.minimum(kw_hi - kw_lo - BLOCK_KW, L2_PREFETCH * BLOCK_KW) * 4
        pf_bytes = gl.where(row_ok[:, None] & (q == 0)[None, :], ahead, 0)               # [BN, Q]
        pf_ptrs = wq_ptr + (rows.to(gl.int64) * kw_total + kw_lo + BLOCK_KW)[:, None] + (q * 0)[None, :]
        gl.inline_asm_elementwise(_L2_PREFETCH_ASM, "=r,l,r", [pf_ptrs, pf_bytes], dtype=gl.int32, is_pure=False,
                                  pack=1)
    if EPI_EARLY:
        # (probe knob) the epilogue operands that act_quant does not write (col scale, the up rows, bias), loaded
        # before the K loop so their round trip is hidden by the stream; S, act_quant's, just after the wait
        cs, up_e, bias_e = _gl_epilogue_early(rows, row_ok, N, R, up_ptr, stride_un, bias_ptr, cs_ptr, BLOCK_R,
                                               HAS_LOWRANK, HAS_COL_SCALE, HAS_BIAS, LROW)
    if PDL and not LATE_W:
        gl_gdc_wait()
    if EPI_EARLY:
        sv_e = _gl_epilogue_s(m, R, s_ptr, stride_sm, up_ptr, BLOCK_R, HAS_LOWRANK)
    if TWO_LEVEL:
        gl.static_assert(SPLIT == 1, "int4_2l: no split-K")
        # int8 activations: the words of weight word w's low / high K positions (_twolevel_words, + 8)
        xt_ptrs = xq_ptr + m * (2 * kw_total) + _twolevel_words((qx * 4)[:, None] + i4x[None, :])
        acc_i = gl.zeros([BLOCK_N, Q], gl.int32, LQ)
        for kw in range(kw_lo, kw_hi, BLOCK_KW):
            w, w_next = _gl_weights(ring, w_next, w_ptrs, w_mask, kw, kw_lo, kw_hi, BLOCK_KW, CP_STAGES, W_CACHE,
                                    W_EVICT, L3)
            xlo = gl.load(xt_ptrs + 2 * kw)
            xhi = gl.load(xt_ptrs + 2 * kw + 8)
            rx = gl.sum(_byte_sum2(xlo, xhi, True), axis=1)
            d = gl.sum(_word_dot(w, xlo[None, :, :], xhi[None, :, :], True), axis=2)
            u = gl.load(wu_ptr + (kw // WPG + gq)[None, :] * N + rows[:, None], mask=ws_mask, other=0)
            acc_i += (d - 8 * gl.convert_layout(rx, LQV, assert_trivial=True)[None, :]) * u.to(gl.int32)
        ts = gl.load(xs_ptr + m) * gl.load(ws_ptr + rows, mask=row_ok, other=0.0)
        acc = gl.sum(acc_i, axis=1).to(gl.float32) * ts
    else:
        for kw in range(kw_lo, kw_hi, BLOCK_KW):
            w, w_next = _gl_weights(ring, w_next, w_ptrs, w_mask, kw, kw_lo, kw_hi, BLOCK_KW, CP_STAGES, W_CACHE,
                                    W_EVICT, L3)
            xw = gl.load(x_ptrs + kw).to(gl.uint32, bitcast=True)
            # (the Triton kernel's helpers: Gluon calls them on its own layouts)
            xlo = _signed_bytes(xw & 0x0F0F0F0F)
            xhi = _signed_bytes((xw >> 4) & 0x0F0F0F0F)
            rx = gl.sum(_byte_sum2(xlo, xhi, True), axis=1)                       # [Q]  Σ q_x over the quarter
            d = gl.sum(_word_dot(w, xlo[None, :, :], xhi[None, :, :], True), axis=2)   # [BN, Q]  Σ q_x·(q_w + 8)
            g0 = kw // WPG
            ws = gl.load(ws_ptrs + g0 * N, mask=ws_mask, other=0.0).to(gl.float32)
            xs = gl.load(xs_ptrs + g0 * M).to(gl.float32)
            rxq = gl.convert_layout(rx, LQV, assert_trivial=True)
            part = (d - 8 * rxq[None, :]).to(gl.float32)                         # Σ q_x·q_w, exact
            acc2 += part * ws * xs[None, :]
        acc = gl.sum(acc2, axis=1)                                               # [BN] LROW
    # (loading these before the K loop, to hide their round trip under the stream, measured within noise and cost
    # 8 registers: probes/s7/gemv_epi)
    if EPI_EARLY:
        add = _gl_epilogue_add(rows, up_e, sv_e, bias_e, HAS_LOWRANK, HAS_BIAS, LROW)
    else:
        cs, add = _gl_epilogue_terms(rows, row_ok, m, N, R, s_ptr, stride_sm, up_ptr, stride_un, bias_ptr, cs_ptr,
                                     BLOCK_R, HAS_LOWRANK, HAS_COL_SCALE, HAS_BIAS, LROW)
    if SPLIT > 1:
        # the row block's SPLIT partials meet in the workspace; the last to arrive sums them in split order
        # (kernels/splitk.py: the bits do not depend on who arrives last) and runs the epilogue
        tile = (pid // M) // SPLIT * M + m
        offs = gl.arange(0, BLOCK_N, LROW)
        base = part_ptr + tile.to(gl.int64) * (SPLIT * BLOCK_N)
        splitk_store(base, offs, BLOCK_N, split, acc, row_ok)
        if splitk_arrive(cnt_ptr + tile, SPLIT):
            acc = splitk_sum(base, offs, BLOCK_N, row_ok, SPLIT, gl.zeros_like(acc))
            splitk_reset(cnt_ptr + tile)
            gl.store(y_ptr + m * stride_ym + rows, (acc * cs + add).to(y_ptr.dtype.element_ty), mask=row_ok)
    else:
        gl.store(y_ptr + m * stride_ym + rows, (acc * cs + add).to(y_ptr.dtype.element_ty), mask=row_ok)


@gluon.jit
def _gl_weights(ring, w_next, w_ptrs, w_mask, kw, kw_lo, kw_hi, BLOCK_KW: gl.constexpr, CP_STAGES: gl.constexpr,
                W_CACHE: gl.constexpr, W_EVICT: gl.constexpr, L3: gl.constexpr):
    """(the weights of the chunk at ``kw``, the register buffer for the next): the register double buffer (its next
    load goes out before this chunk's arithmetic), or the cp.async ring (CP_STAGES > 0; ``w_next`` unused)."""
    if CP_STAGES > 0:
        w = _gl_ring_chunk(ring, w_ptrs, w_mask, kw, kw_lo, kw_hi, BLOCK_KW, CP_STAGES, W_EVICT, L3)
    else:
        w = w_next
        w_next = gl.load(w_ptrs + kw + BLOCK_KW, mask=w_mask & (kw + BLOCK_KW < kw_hi), other=0,
                         cache_modifier=W_CACHE, eviction_policy=W_EVICT)
    return w, w_next


@gluon.jit
def _gl_ring_chunk(ring, w_ptrs, w_mask, kw, kw_lo, kw_hi, BLOCK_KW: gl.constexpr, CP_STAGES: gl.constexpr,
                   W_EVICT: gl.constexpr, L3: gl.constexpr):
    """The chunk at ``kw`` from the cp.async ring (waits for it), then the copy of chunk + CP_STAGES − 1 into the slot
    the previous iteration read (its registers are consumed: no thread reads a slot being refilled)."""
    i = (kw - kw_lo) // BLOCK_KW
    async_copy.wait_group(CP_STAGES - 2)
    w = ring.index(i % CP_STAGES).load(L3)
    kw_n = kw + (CP_STAGES - 1) * BLOCK_KW
    async_copy.async_copy_global_to_shared(ring.index((i + CP_STAGES - 1) % CP_STAGES), w_ptrs + kw_n,
                                           mask=w_mask & (kw_n < kw_hi), eviction_policy=W_EVICT)
    async_copy.commit_group()
    return w


@gluon.jit
def _gl_epilogue_terms(rows, row_ok, m, N, R, s_ptr, stride_sm, up_ptr, stride_un, bias_ptr, cs_ptr,
                       BLOCK_R: gl.constexpr, HAS_LOWRANK: gl.constexpr, HAS_COL_SCALE: gl.constexpr,
                       HAS_BIAS: gl.constexpr, LROW: gl.constexpr):
    """(col_scale[n], Σ_r up[n, r]·s[m, r] + bias[n]) for the program's rows; s is rounded to up's dtype like an
    unfused s @ B.T. (EPI_EARLY's three helpers below compute the same terms; composing this one from them changes
    the shipped default's PTX — its load order — which was measured as it is, so it stays written out.)"""
    add = gl.zeros_like(rows.to(gl.float32))
    if HAS_COL_SCALE:
        cs = gl.load(cs_ptr + rows, mask=row_ok, other=0.0).to(gl.float32)
    else:
        cs = add + 1.0
    if HAS_LOWRANK:
        LE: gl.constexpr = _epilogue_layout(BLOCK_R, gl.num_warps())
        rows_e = gl.convert_layout(rows, gl.SliceLayout(1, LE))
        offs_r = gl.arange(0, BLOCK_R, gl.SliceLayout(0, LE))
        r_ok = offs_r < R
        sv = gl.load(s_ptr + m * stride_sm + offs_r, mask=r_ok, other=0.0)
        sv = sv.to(up_ptr.dtype.element_ty).to(gl.float32)
        up = gl.load(up_ptr + rows_e[:, None] * stride_un + offs_r[None, :],
                     mask=(rows_e < N)[:, None] & r_ok[None, :], other=0.0).to(gl.float32)
        add = add + gl.convert_layout(gl.sum(up * sv[None, :], axis=1), LROW)
    if HAS_BIAS:
        add = add + gl.load(bias_ptr + rows, mask=row_ok, other=0.0).to(gl.float32)
    return cs, add


@gluon.constexpr_function
def _epilogue_layout(block_r, num_warps):
    """[BN, BLOCK_R] tile of the up-projection: 4 ranks per thread."""
    return gl.BlockedLayout([1, 4], [32 // (block_r // 4), block_r // 4], [num_warps, 1], [1, 0])


@gluon.jit
def _gl_epilogue_early(rows, row_ok, N, R, up_ptr, stride_un, bias_ptr, cs_ptr, BLOCK_R: gl.constexpr,
                       HAS_LOWRANK: gl.constexpr, HAS_COL_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr,
                       LROW: gl.constexpr):
    """EPI_EARLY: (col_scale[n], up rows [BN, BLOCK_R] fp32, bias[n]) loaded before the K loop — the same values
    :func:`_gl_epilogue_terms` loads after it (0 where a term is off)."""
    zero = gl.zeros_like(rows.to(gl.float32))
    if HAS_COL_SCALE:
        cs = gl.load(cs_ptr + rows, mask=row_ok, other=0.0).to(gl.float32)
    else:
        cs = zero + 1.0
    if HAS_BIAS:
        bias = gl.load(bias_ptr + rows, mask=row_ok, other=0.0).to(gl.float32)
    else:
        bias = zero
    if HAS_LOWRANK:
        LE: gl.constexpr = _epilogue_layout(BLOCK_R, gl.num_warps())
        rows_e = gl.convert_layout(rows, gl.SliceLayout(1, LE))
        offs_r = gl.arange(0, BLOCK_R, gl.SliceLayout(0, LE))
        up = gl.load(up_ptr + rows_e[:, None] * stride_un + offs_r[None, :],
                     mask=(rows_e < N)[:, None] & (offs_r < R)[None, :], other=0.0).to(gl.float32)
    else:
        up = zero
    return cs, up, bias


@gluon.jit
def _gl_epilogue_s(m, R, s_ptr, stride_sm, up_ptr, BLOCK_R: gl.constexpr, HAS_LOWRANK: gl.constexpr):
    """EPI_EARLY: the token's S row (act_quant's output: after griddepcontrol.wait), rounded to up's dtype."""
    if HAS_LOWRANK:
        LE: gl.constexpr = _epilogue_layout(BLOCK_R, gl.num_warps())
        offs_r = gl.arange(0, BLOCK_R, gl.SliceLayout(0, LE))
        sv = gl.load(s_ptr + m * stride_sm + offs_r, mask=offs_r < R, other=0.0)
        sv = sv.to(up_ptr.dtype.element_ty).to(gl.float32)
    else:
        sv = 0.0
    return sv


@gluon.jit
def _gl_epilogue_add(rows, up, sv, bias, HAS_LOWRANK: gl.constexpr, HAS_BIAS: gl.constexpr, LROW: gl.constexpr):
    """EPI_EARLY: Σ_r up[n, r]·s[r] + bias[n], in :func:`_gl_epilogue_terms`'s order (same bits)."""
    add = gl.zeros_like(rows.to(gl.float32))
    if HAS_LOWRANK:
        add = add + gl.convert_layout(gl.sum(up * sv[None, :], axis=1), LROW)
    if HAS_BIAS:
        add = add + bias
    return add


class GemvConfig(tuple):
    """(block_n, block_kw, num_warps, num_stages, split): split > 1 (Gluon kernel) deals each row block's K chunks
    to that many programs, which meet in one launch (kernels/splitk.py)."""

    def __new__(cls, block_n: int, block_kw: int, num_warps: int, num_stages: int, split: int = 1):
        return super().__new__(cls, (block_n, block_kw, num_warps, num_stages, split))

    block_n = property(lambda s: s[0])
    block_kw = property(lambda s: s[1])
    num_warps = property(lambda s: s[2])
    num_stages = property(lambda s: s[3])
    split = property(lambda s: s[4])


# 16 weight rows × 512 K per chunk, 2 warps (16 words = 64 B per thread per chunk), one chunk in flight ahead.
# Session 11 (H200, K = 4096, N = 28672): 8 rows on 1 warp ran the GEMM alone faster (M = 1, evict_first: 18.7 vs
# 19.5 µs, probes/s11/gemv_hints) but not the layer behind act_quant (same process, three rotated weight sets:
# M = 1 20.8 vs 20.6, M = 2 26.9 vs 27.3; without evict_first 22.5 vs 21.1) — kept at 16 rows.
DEFAULT_CONFIG = GemvConfig(16, 64, 2, 2)
CONFIG_ENV = "LOWRANK_GEMM_GEMV_CONFIG"      # "block_n,block_kw,warps,stages" (probes)
# Cache hints on the Gluon kernel's weight stream (read once per call): "ef" evict_first, "el" evict_last, "cg" (L2
# only), comma-separated; kwarg ``hints``, else env, else DEFAULT_HINTS ("" turns them off). evict_first: the
# weights, read once, stop displacing what is read again (the token words, scales, the epilogue's rows) — H200,
# probes/s11/gemv_hints, M = 1, GEMM alone: N = 28672 −0.6…−0.7 µs (20.1 → 19.5 with 16,64,2; 19.4 → 18.7 with
# 8,64,1), K = 14336 × N = 4096 (WIDE_CONFIG) 12.1 → 11.6, K = N = 4096 4.60 / 4.63 (neutral); evict_last and .cg
# within noise or slower. The layer (act_quant + GEMV, same process, three rotated weight sets, N = 28672): M = 1
# 21.1 → 20.6 µs, M = 2 27.7 → 27.3. (With one weight set the gain read ~1 µs: evict_first let part of a 62 MB
# weight set survive in L2 between calls — why benches rotate weights.)
HINTS_ENV = "LOWRANK_GEMM_GEMV_HINTS"
EARLY_ENV = "LOWRANK_GEMM_GEMV_EARLY"        # 0: the first weight chunk after griddepcontrol.wait (probe knob)
L2_PREFETCH_ENV = "LOWRANK_GEMM_GEMV_L2_PREFETCH"   # n > 0: n more chunks per row prefetched to L2 before the wait
CP_STAGES_ENV = "LOWRANK_GEMM_GEMV_CP_STAGES"       # s ≥ 2: the weights through a cp.async ring of s chunks
EPI_EARLY_ENV = "LOWRANK_GEMM_GEMV_EPI_EARLY"       # 1 / 0: the epilogue's operands before the K loop or not
DEFAULT_HINTS = "ef"
_HINTS = {"ef": ("W_EVICT", "evict_first"), "el": ("W_EVICT", "evict_last"), "cg": ("W_CACHE", ".cg")}


def load_hints(hints: str | None = None) -> dict:
    """The weight loads' constexprs for ``hints`` ("ef,cg"; None: env ``LOWRANK_GEMM_GEMV_HINTS``, else
    :data:`DEFAULT_HINTS`)."""
    hints = getenv(HINTS_ENV, DEFAULT_HINTS) if hints is None else hints
    out = {}
    for h in (v.strip() for v in hints.split(",") if v.strip()):
        _expect(h in _HINTS, lambda: f"gemv load hints are {sorted(_HINTS)}, got {h!r}")
        out[_HINTS[h][0]] = _HINTS[h][1]
    _expect(not ("W_CACHE" in out and "W_EVICT" in out), lambda: f"gemv load hints: ptxas takes no L1 eviction hint on a .cg "
            f"load, got {hints!r}")
    return out
KERNEL_ENV = "LOWRANK_GEMM_GEMV_KERNEL"      # "gluon" | "triton"
DEFAULT_KERNEL = "gluon" if SWAR_DEFAULT else "triton"


# Per shape (H200, probes/s7/gemv_run3 and _run5, M=1, GEMM alone; cuBLAS bf16 beside): many weight rows → short
# programs of 16 rows × 256-byte chunks, all resident in one wave (K=4096: N=28672 23.2 µs, N=14336 16.5; split-K
# only slows these: 26.9–32.3 / 16.7–19.7); few rows → 8 rows × 2 KB chunks and K split over 2 programs (N=4096:
# K=4096 8.1 µs vs 11.0, K=14336 16.1 vs 28.3).
MANY_ROWS = 12288
WIDE_CONFIG = GemvConfig(8, 512, 4, 2, 2)


def gemv_config(config: GemvConfig | None = None, n: int | None = None) -> GemvConfig:
    """``config``, else env ``LOWRANK_GEMM_GEMV_CONFIG``, else by the row count ``n`` (above)."""
    pinned = pinned_config(config, CONFIG_ENV, (4, 5), "block_n,block_kw,warps,stages[,split]", GemvConfig)
    if pinned is not None:
        return pinned
    return DEFAULT_CONFIG if n is None or n >= MANY_ROWS else WIDE_CONFIG


def act_quant_early_launch(fmt: str, m: int, n: int, k: int) -> bool:
    """Whether act_quant (fused, PDL) should let this kernel launch as its programs start — the GEMV's programs then
    load their first weight chunk while act_quant runs — or only as they exit. H200, act_quant + GEMV layer, same
    process, rotated weights, early vs late µs (probes/s12/launch_order, the shipped / late_deps rows of
    probes/s12/l2_prefetch, and probes/s12/launch_order_check; the three runs agree within 0.3 µs):

    | early / late µs | N = 28672 | N = 28672, M = 2 | N = 14336 | N = 4096 | N = 6144 | K = 14336, N = 4096 |
    |-----------------|-----------|------------------|-----------|----------|----------|---------------------|
    | int4_g64        | 20.9/20.8 | 27.8/27.1        | 16.8/14.0 | 7.2/8.0  | 10.1/11.4| 17.1/18.5           |
    | int4_2l         | 21.6/21.8 | 27.5/26.1        | 14.5/14.7 | 8.2/9.6  | 11.8/13.2| 25.8/22.3           |

    (K = 4096 and M = 1 unless noted.) So: int4_g64 early only on the wide config (N < MANY_ROWS); int4_2l early at
    M = 1 up to K = 8192, late at M = 2 and at K = 14336. Checked off those points (probes/s12/checks, K = 8192,
    M = 1): int4_2l N = 8192 19.9 / 21.8, N = 28672 37.9 / 37.9; int4_g64 N = 8192 21.1 / 22.5, N = 28672 37.2 /
    36.6 — the rule's choice or a tie each time. Why the formats disagree is not profiled: their act_quant programs
    differ, and the 2l one grows with K.

    One exception for int4_g64, measured with :func:`epilogue_early` on (the two pay only together): M = 1, K ≤ 4096,
    N ≥ :data:`G64_EARLY_MIN_N` (:func:`_g64_early_pair`)."""
    if fmt == "int4_g64":
        return gemv_config(None, n) != DEFAULT_CONFIG or _g64_early_pair(m, n, k)
    return m == 1 and k <= 8192


# int4_g64's early act_quant trigger + EPI_EARLY pair at M = 1 (H200, layer µs, same process, shipped / pair, K = 4096):
# N = 28672 20.68 / 20.32 (probes/s13/epi_g64_deps), 20.64 / 20.26 and 20.66 / 20.25 (probes/s14/first, two
# processes); N = 14336 14.04 / 15.62 (both s14 runs) and M = 2, N = 28672 27.17 / 27.64 — slower, hence the bound
# between the two measured N. K = 8192 was slower with the early trigger alone (probes/s12/checks) and is not paired.
G64_EARLY_MIN_N = 24576


def _g64_early_pair(m: int, n: int, k: int) -> bool:
    return m == 1 and k <= 4096 and n >= G64_EARLY_MIN_N


def epilogue_early(fmt: str, m: int, n: int, k: int) -> bool:
    """Whether the Gluon GEMV loads its epilogue operands (col scale, up rows, bias) before the K loop and S right after
    griddepcontrol.wait (EPI_EARLY; same bits either way). ``LOWRANK_GEMM_GEMV_EPI_EARLY`` = 1 / 0 forces it.
    H200, act_quant + GEMV layer, same process, two runs (probes/s13/epi), shipped / early µs, K = 4096:

    | | N = 28672, M = 1 | M = 2 | N = 14336 | N = 4096 |
    |---|---|---|---|---|
    | int4_g64 | 20.87 / 20.86 | 27.11 / 27.45 | 14.04 / 14.24 | 7.14 / 8.05 |
    | int4_2l | 21.66 / **20.83** | 26.18 / 26.62 | 14.56 / 14.52 | 8.20 / 8.17 |

    It pays where act_quant lets the GEMV launch early (int4_2l at M = 1) on the many-rows config: the loads then
    overlap act_quant. Elsewhere it is neutral or slower (g64 at N = 4096: +0.9 µs) — except int4_g64 at M = 1,
    N = 28672 together with act_quant's early trigger (:func:`_g64_early_pair`): 20.66 → 20.25 µs, three runs."""
    env = getenv(EPI_EARLY_ENV, "")
    if env in ("0", "1"):
        return env == "1"
    if fmt == "int4_g64":
        return _g64_early_pair(m, n, k)
    return n >= MANY_ROWS and act_quant_early_launch(fmt, m, n, k)


def gemv_enabled() -> bool:
    """``LOWRANK_GEMM_GEMV=0`` routes M ≤ :func:`auto_gemv_max_m` back to the decode kernel (instant fallback)."""
    return env_on("LOWRANK_GEMM_GEMV")


def _expect(cond, msg):
    if not cond:                              # msg: a string or a callable building it (w4a4_gemm._expect)
        raise ValueError(f"w4a4 gemv: {msg() if callable(msg) else msg}")


def gemv_args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt: str = "int4_g64",
              group_size: int = 64, *, col_scale=None, config: GemvConfig | None = None, swar=None, pdl=None,
              kernel: str | None = None, hints: str | None = None, _dims: tuple | None = None):
    """Validate (the launcher contract, ``w4a4_gemm.check_gemm_args``; ``_dims``: already checked by the GEMM op,
    ``w4a4_gemm.check_packed_launch``), plan, and build one launch:
    (grid, args, constexprs, config). ``hints``: :func:`load_hints` (Gluon kernel)."""
    from .w4a4_gemm import check_packed_launch
    M, N, K, r = check_packed_launch("gemv", x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt,
                                     group_size, col_scale, 4, two_level=True, dims=_dims)
    two_level = fmt == "int4_2l"
    dev = x_q.device
    _expect(x_scale.is_contiguous() and w_scale.is_contiguous(), "x_scale / w_scale must be contiguous [K/G, ·]")
    cfg = gemv_config(config, N)
    bn, bkw = cfg.block_n, cfg.block_kw
    wpg = group_size // 8
    _expect(bkw % wpg == 0 and bkw & (bkw - 1) == 0 and bn & (bn - 1) == 0 and bn >= 4,
            lambda: f"block_kw must be a power of two of whole groups ({wpg} words per group of {group_size}), block_n a "
            f"power of two ≥ 4; got {cfg}")
    while (K // 8) % bkw:        # the K chunk divides K (K % G == 0, so one group always does): no K masks
        bkw //= 2
    kernel = kernel or getenv(KERNEL_ENV, DEFAULT_KERNEL)
    # split-K is the Gluon kernel's: a default config drops it for the Triton one, an explicit one is an error below
    split = max(1, min(cfg.split if (config is not None or kernel == "gluon") else 1, (K // 8) // bkw))
    if two_level:       # its int32 row sums are not split: a default config's split is dropped, an explicit one refused
        _expect(config is None or split == 1, lambda: f"int4_2l runs without split-K, got {cfg}")
        split = 1
    cfg = GemvConfig(bn, bkw, cfg.num_warps, cfg.num_stages, split)
    swar = SWAR_DEFAULT if swar is None else bool(swar)
    pdl = pdl_enabled(dev) if pdl is None else bool(pdl)
    f32 = dummy(dev, torch.float32, (1, ))
    br = rank_block(r) if r else 16
    if r:
        _expect(lowrank_act.stride(1) == 1 and lora_up.stride(1) == 1, "lowrank_act / lora_up need unit column stride")
    args = (x_q.view(torch.int32), x_scale, w_q.view(torch.int32), w_scale,
            lowrank_act if r else f32, lora_up if r else f32, bias if bias is not None else f32,
            col_scale if col_scale is not None else f32, out,
            M, N, K, r, lowrank_act.stride(0) if r else 0, lora_up.stride(0) if r else 0, out.stride(0),
            w_mul if two_level else dummy(dev, torch.uint8, (1, )))
    cx = dict(G=group_size, BLOCK_N=bn, BLOCK_KW=bkw, BLOCK_R=br, HAS_LOWRANK=bool(r),
              HAS_COL_SCALE=col_scale is not None, HAS_BIAS=bias is not None, SWAR=swar, PDL=pdl)
    if two_level:
        cx["TWO_LEVEL"] = True
    grid = (cdiv(N, bn) * M, )
    _expect(kernel in ("gluon", "triton"), lambda: f"kernel must be 'gluon' or 'triton', got {kernel!r}")
    _expect(kernel == "gluon" or split == 1, lambda: f"split-K ({cfg}) is the Gluon kernel's option")
    if kernel == "gluon":
        _expect(swar, "the Gluon kernel runs compiled only (SWAR); the interpreter takes kernel='triton'")
        _expect(bkw >= 4 and (bkw // 4) <= 32 * 32 and br >= 16, lambda: f"Gluon tiles: block_kw ≥ 4; got {cfg}")
        tiles = cdiv(N, bn) * M
        if split > 1:
            from .lora_gemm import _TICKETS     # zeroed once per (device, stream), left zero by every launch
            part, cnt = torch.empty(tiles * split * bn, dtype=torch.float32, device=dev), _TICKETS.get(dev, tiles)
        else:
            part, cnt = f32, dummy(dev, torch.int32, (1, ))
        args = args[:9] + (part, cnt) + args[9:]
        cx["SPLIT"] = split
        cx.update(load_hints(hints))
        if pdl and getenv(EARLY_ENV, "1") == "0":
            cx["LATE_W"] = True
        stages = getenv(CP_STAGES_ENV, "0").strip() or "0"
        _expect(stages.isdigit() and int(stages) != 1, lambda: f"{CP_STAGES_ENV} takes 0 (off) or a ring depth ≥ 2, got {stages!r}")
        if int(stages):
            cx["CP_STAGES"] = int(stages)
        prefetch = getenv(L2_PREFETCH_ENV, "0").strip() or "0"
        _expect(prefetch.isdigit(), lambda: f"{L2_PREFETCH_ENV} takes a chunk count, got {prefetch!r}")
        if int(prefetch):
            cx["L2_PREFETCH"] = int(prefetch)
        if epilogue_early(fmt, M, N, K):
            cx["EPI_EARLY"] = True
        grid = (tiles * split, )
    cx["KERNEL"] = kernel
    return grid, args, cx, cfg


def launch_w4a4_gemv(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt: str = "int4_g64",
                     group_size: int = 64, *, col_scale=None, config: GemvConfig | None = None, swar=None, pdl=None,
                     kernel: str | None = None, hints: str | None = None, _dims: tuple | None = None):
    """out [M, N] ← the int4_g64 W4A4 GEMM + epilogue for a few tokens (launcher contract of kernels/w4a4_gemm.py).
    ``config``: :class:`GemvConfig` (None: env ``LOWRANK_GEMM_GEMV_CONFIG``, else the default); ``pdl`` (None =
    :func:`kernels.pdl.pdl_enabled`)."""
    grid, args, cx, cfg = gemv_args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt,
                                    group_size, col_scale=col_scale, config=config, swar=swar, pdl=pdl, kernel=kernel,
                                    hints=hints, _dims=_dims)
    if cx.pop("KERNEL") == "gluon":
        launch(w4a4_gemv_gl_kernel, grid, *args, **cx, num_warps=cfg.num_warps, launch_pdl=cx["PDL"])
    else:
        launch(w4a4_gemv_kernel, grid, *args, **cx, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
               launch_pdl=cx["PDL"])
    return out


def aot_signature_gemv(config: GemvConfig | None = None, *, M=2, N=160, K=512, rank=16, group_size=64, bias=True,
                       col_scale=True, pdl=True, kernel: str = "triton", fmt: str = "int4_g64"):
    """(signature, constexprs, config) for ``kernels.aot.compile_sm90`` of :func:`w4a4_gemv_kernel` (SWAR on)."""
    import inspect
    from triton.runtime.jit import mangle_type
    from .gluon.w4a4_ws import make_operands_v2
    ops = make_operands_v2(fmt, M, N, K, rank, group_size, device="cpu", bias=bias, col_scale=col_scale)
    _, args, cx, cfg = gemv_args(**ops, config=config, swar=True, pdl=False, kernel=kernel)
    cx["PDL"] = bool(pdl)
    cx.pop("KERNEL")
    kern = w4a4_gemv_gl_kernel if kernel == "gluon" else w4a4_gemv_kernel
    names = [n for n in inspect.signature(kern.fn).parameters if n not in cx]
    sig = {n: (mangle_type(a) if not isinstance(a, int) else "i32") for n, a in zip(names, args)}
    return sig, cx, cfg


def _smoke() -> int:
    """One small checked launch per kernel and config (compute-sanitizer runs this:
    ``SANITIZE_FMTS=gemv scripts/sanitize_gluon.sh``)."""
    from .gluon.w4a4_ws import make_operands_v2, reference_v2
    fails = 0
    for fmt, kernel, cfg in (("int4_g64", "gluon", None), ("int4_g64", "gluon", WIDE_CONFIG),
                             ("int4_g64", "gluon", GemvConfig(16, 16, 2, 2, 4)), ("int4_g64", "triton", None),
                             ("int4_2l", "gluon", None), ("int4_2l", "triton", None)):
        for m in (1, 2):
            ops = make_operands_v2(fmt, m, 200, 448, 5, 64, device="cuda", bias=True, col_scale=True)
            y = launch_w4a4_gemv(**ops, kernel=kernel, config=cfg)
            torch.cuda.synchronize()
            ref = reference_v2(ops)
            err = float((y.double().cpu() - ref).abs().max() / ref.abs().max())
            ok = bool(torch.isfinite(y).all()) and err < 1e-2
            fails += not ok
            print(f"{'OK' if ok else 'FAIL'} gemv {fmt} {kernel} {cfg} M={m}: err {err:.2e}", flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(_smoke())
