"""The W4A8 layer's activation side (``act_bits=8``): per-token e4m3 codes of x/λ, their scales and the low-rank S.

    (q, t) = formats.fp8.quantize_act_e4m3(x / λ)       bit for bit
    S = (x / λ) · lora_downᵀ                           ≈ fp32 (split-TF32 pieces, as act_quant)

Two passes over x, the ones act_quant's int4_2l format already has (a row scale needs the whole row first):
- pass 1 is act_quant's int4_2l v3 stats kernel unchanged: per (row block, K slice) the exact row maxima of x/λ and
  the S partials (then summed in slice order: deterministic, no atomics);
- pass 2 (:func:`_act_e4m3_quant_kernel`) re-reads its slice: t = RN(amax / 448) per row, x/λ and xs/t through
  act_quant's Markstein fast division (exact where it matters for an e4m3 code, see the kernel), the codes stored;
  a slice whose rows left the fast range (an Inf row, t outside [2⁻⁶⁰, 2⁶⁰], λ outside [2⁻³⁰, 2³⁰]) is redone with
  IEEE divisions: slower, same bits.

``out="f16"`` (decode sizes, M ≤ 64): the same codes as the fp16 token operand of the decode kernel's fp16 path
(gluon/w4a4_decode.py; each e4m3 value is exact in fp16, stored at the permuted column of every 16 —
w4_expand.F16_K_PERM) with t as its per-token scale, so that kernel runs the W4A8 product unchanged: one program per
(row, rank chunk) (:func:`_e4m3_rows_kernel`, IEEE divisions) — the codes, t and S in one launch, S
in fp32 from the row's xs.

``out="xab"`` (M ≤ 16): the same launch writes the codes as e4m3 at their natural columns and, instead of t, the
per-group rows of the decode kernel's e4m3 path, xab [K/G, 2, M] = (2⁹·t, −8·R·t) with R the group's sum of code
values — the W4A4 e4m3 operands (w4_expand.expand_act_f8) with the token scale as every group's scale, so that path
runs the W4A8 product unchanged: Σ_g ws·(2⁹t·P' − 8Rt) = t·Σ_g ws·Σ q·q_w for P' = 2⁻⁹·Σ q·(q_w + 8). Group 64
only: then R is exact in fp32 in any order (every partial sum is a multiple of 2⁻⁹ below 64·448 < 2¹⁵: 24 bits), so
the rows are bit-identical to :func:`e4m3_xab_ref`.

CPU without the interpreter: the torch spec (formats/fp8.py) and S in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..formats.fp8 import E4M3, quantize_act_e4m3
from .act_quant import (_FAST_HI, _FAST_LO, _act_2l_stats_v3_kernel, _div_fast, _fed_plan, _interpreting,
                        _launch_row_stats, _max_nan, _prep, _smooth_fast, _smoothed, _sum_partials, plan_act_quant)
from .epilogue import rank_block
from .launch import launch
from .row_quant import _FP8_GRID, _round_fp8
from .schedule import cdiv, next_pow2
from .w4_expand import F16_K_PERM, _operand_pdl, _operand_pdl_entry, act_f8_rows, f16_column, xab_rows

__all__ = ["act_quant_e4m3", "OUTS", "F16_ROW_BLOCK", "XAB_GROUP", "e4m3_xab_ref", "e4m3_f16_operand_ref"]

OUTS = ("e4m3", "f16", "xab")
XAB_GROUP = 64            # out="xab": the only group size whose row sums are exact in fp32 (module doc)
F16_ROW_BLOCK = 8192      # a row up to this long stays in registers (one read of x); longer rows walk it twice
F16_RANK_CHUNK = 4        # ranks of S per program (a row's S spread over r/4 programs)

_E4M3_MAX = tl.constexpr(448.0)
_XAB_GROUP = tl.constexpr(XAB_GROUP)


@triton.jit
def _e4m3_row_scale(ap_ptr, stride_aps, offs_m, row_ok, SPLIT, SPLIT_P2: tl.constexpr):
    """t [BM] = RN(amax / 448) from the pass-1 partials (NaN-propagating max; a NaN or all-zero row gets 1, an Inf
    row Inf — formats/fp8.py)."""
    offs_s = tl.arange(0, SPLIT_P2)
    part = tl.load(ap_ptr + offs_s[:, None] * stride_aps + offs_m[None, :],
                   mask=(offs_s[:, None] < SPLIT) & row_ok[None, :], other=0.0)
    return _e4m3_scale(tl.reduce(part, 0, _max_nan))


@triton.jit
def _act_e4m3_quant_kernel(
    x_ptr, stride_xm, smooth_ptr, rl_ptr, q_ptr, stride_qm, t_ptr, ap_ptr, stride_aps, M, K, SPLIT, STEPS_PER_SLICE,
    G: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT_P2: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
    EMU_FMA: tl.constexpr, EMU_CVT: tl.constexpr,
):
    """Pass 2 per (row block, K slice). The fast path divides by Markstein's correction (act_quant._div_fast), exact
    when operands, quotient and remainder are normal. With t in [2⁻⁶⁰, 2⁶⁰] every quotient that can round to a
    non-zero e4m3 code (|xs/t| ≥ 2⁻¹⁰) has a normal xs and remainder, and smaller ones round to ±0 either way, so
    the codes are the IEEE ones; rows outside that range and λ outside [2⁻³⁰, 2³⁰] (the prep's NaN 1/λ, seen as a NaN
    xs of a non-NaN x) send the slice to the exact redo."""
    pid_k = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.max_contiguous(tl.multiple_of(tl.arange(0, G), G), G)
    row_ok = offs_m < M
    t = _e4m3_row_scale(ap_ptr, stride_aps, offs_m, row_ok, SPLIT, SPLIT_P2)
    rt = tl.math.div_rn(1.0, t)
    n_bad = (row_ok & ~((t >= _FAST_LO) & (t <= _FAST_HI))).to(tl.int32)
    k_begin = pid_k * STEPS_PER_SLICE * G
    k_end = tl.minimum(k_begin + STEPS_PER_SLICE * G, K)
    dt = q_ptr.dtype.element_ty
    for k0 in range(k_begin, k_end, G):
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :], mask=row_ok[:, None],
                    other=0.0).to(tl.float32)
        _, xs = _smooth_fast(x, smooth_ptr + k0 + offs_k, rl_ptr + k0 + offs_k, EMU_FMA)
        n_bad += tl.sum(((xs != xs) & (x == x)).to(tl.int32), axis=1)
        q, _ = _round_fp8(_div_fast(xs, t[:, None], rt[:, None], EMU_FMA), dt, MANT, EMIN, EMU_CVT)
        tl.store(q_ptr + offs_m[:, None] * stride_qm + (k0 + offs_k)[None, :], q, mask=row_ok[:, None])
    if pid_k == 0:
        tl.store(t_ptr + offs_m, t, mask=row_ok)
    if tl.max(n_bad, axis=0) > 0:
        tl.debug_barrier()
        for k0 in range(k_begin, k_end, G):
            xs = _smoothed(x_ptr, stride_xm, smooth_ptr, offs_m, k0 + offs_k, M)
            q, _ = _round_fp8(tl.math.div_rn(xs, t[:, None]), dt, MANT, EMIN, EMU_CVT)
            tl.store(q_ptr + offs_m[:, None] * stride_qm + (k0 + offs_k)[None, :], q, mask=row_ok[:, None])


@triton.jit
def _e4m3_rows_kernel(x_ptr, stride_xm, smooth_ptr, q_ptr, t_ptr, a_ptr, stride_ar, s_ptr, stride_sm, M, K, R,
                      BLOCK_K: tl.constexpr, RC: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
                      EMU_CVT: tl.constexpr, ONE_PASS: tl.constexpr, HAS_LOWRANK: tl.constexpr,
                      XAB: tl.constexpr = False, PDL: tl.constexpr = False, PDL_LATE: tl.constexpr = False):
    """Program (token row m, rank chunk c): xs = RN(x/λ) of the row (IEEE divisions), S[m, c·RC …] = xs · A[c·RC …]ᵀ
    in fp32 (HAS_LOWRANK); chunk 0 also writes the codes of RN(xs / t), t = RN(amax |xs| / 448): as fp16 at the
    permuted column of every 16 and t itself, or (XAB) as e4m3 at their columns and the xab rows of their groups of
    64 into t_ptr (:func:`_store_codes`). ONE_PASS: the row in registers; else two walks over it (chunk 0's second
    walk writes the codes). PDL as the token-operand kernels (w4_expand.OPERAND_PDL_TRIGGER["e4m3_rows"])."""
    _operand_pdl_entry(PDL, PDL_LATE)
    m = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    offs = tl.arange(0, BLOCK_K)
    offs_r = c * RC + tl.arange(0, RC)
    r_ok = offs_r < R
    if ONE_PASS:
        ok = offs < K
        xs = _xs_chunk(x_ptr, stride_xm, smooth_ptr, m, offs, ok)
        if HAS_LOWRANK:
            tl.store(s_ptr + m * stride_sm + offs_r, _s_chunk(a_ptr, stride_ar, offs_r, r_ok, offs, ok, xs), mask=r_ok)
        if c == 0:
            t = _e4m3_scale(tl.reduce(tl.abs(xs), 0, _max_nan))
            _store_codes(q_ptr, t_ptr, m, M, K, 0, offs, ok, xs, t, BLOCK_K, MANT, EMIN, EMU_CVT, XAB)
    else:
        s = tl.zeros([RC], tl.float32)
        amax = tl.zeros([BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ok = k0 + offs < K
            xs = _xs_chunk(x_ptr, stride_xm, smooth_ptr, m, k0 + offs, ok)
            amax = _max_nan(amax, tl.abs(xs))
            if HAS_LOWRANK:
                s += _s_chunk(a_ptr, stride_ar, offs_r, r_ok, k0 + offs, ok, xs)
        if HAS_LOWRANK:
            tl.store(s_ptr + m * stride_sm + offs_r, s, mask=r_ok)
        if c == 0:
            t = _e4m3_scale(tl.reduce(amax, 0, _max_nan))
            for k0 in range(0, K, BLOCK_K):
                ok = k0 + offs < K
                xs = _xs_chunk(x_ptr, stride_xm, smooth_ptr, m, k0 + offs, ok)
                _store_codes(q_ptr, t_ptr, m, M, K, k0, offs, ok, xs, t, BLOCK_K, MANT, EMIN, EMU_CVT, XAB)


@triton.jit
def _xs_chunk(x_ptr, stride_xm, smooth_ptr, m, offs, ok):
    return tl.math.div_rn(tl.load(x_ptr + m * stride_xm + offs, mask=ok, other=0.0).to(tl.float32),
                          tl.load(smooth_ptr + offs, mask=ok, other=1.0).to(tl.float32))


@triton.jit
def _s_chunk(a_ptr, stride_ar, offs_r, r_ok, offs, ok, xs):
    a = tl.load(a_ptr + offs_r[:, None] * stride_ar + offs[None, :], mask=r_ok[:, None] & ok[None, :],
                other=0.0).to(tl.float32)
    return tl.sum(a * xs[None, :], axis=1)


@triton.jit
def _e4m3_scale(amax):
    return tl.where(amax > 0, tl.math.div_rn(amax, _E4M3_MAX), 1.0)


@triton.jit
def _store_codes(q_ptr, t_ptr, m, M, K, k0, offs, ok, xs, t, BLOCK_K: tl.constexpr, MANT: tl.constexpr,
                 EMIN: tl.constexpr, EMU_CVT: tl.constexpr, XAB: tl.constexpr):
    """The codes of xs[k0 + offs] on t: fp16 at the permuted columns (+ t at k0 = 0), or (XAB) e4m3 at their columns
    + the xab rows (2⁹·t, −8·R·t) of their groups of 64 (k0 and BLOCK_K are multiples of 64; masked columns hold
    code 0)."""
    q, v = _round_fp8(tl.math.div_rn(xs, t), tl.float8e4nv, MANT, EMIN, EMU_CVT)
    if XAB:
        tl.store(q_ptr + m * K + k0 + offs, q, mask=ok)
        NG: tl.constexpr = BLOCK_K // _XAB_GROUP
        rsum = tl.sum(tl.reshape(v, [NG, _XAB_GROUP]), axis=1)           # exact (module doc)
        row_a, row_b = act_f8_rows(rsum, t)
        offs_g = k0 // _XAB_GROUP + tl.arange(0, NG)
        g_ok = offs_g < K // _XAB_GROUP
        tl.store(t_ptr + (2 * offs_g) * M + m, row_a, mask=g_ok)
        tl.store(t_ptr + (2 * offs_g + 1) * M + m, row_b, mask=g_ok)
    else:
        tl.store(q_ptr + m * K + f16_column(k0 + offs), v.to(tl.float16), mask=ok)
        if k0 == 0:
            tl.store(t_ptr + m, t)


def e4m3_xab_ref(q: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The spec of ``out="xab"``'s rows: e4m3 codes [M, K] and their token scales t [M] → xab float32 [K/64, 2, M] =
    (2⁹·t, −8·R·t), R the sum of each group of 64 code values (exact: module doc)."""
    m, k = q.shape
    r = q.float().reshape(m, k // XAB_GROUP, XAB_GROUP).sum(-1).t()            # [K/64, M]
    return xab_rows(r, t.float()[None, :].expand_as(r))


def e4m3_f16_operand_ref(q: torch.Tensor) -> torch.Tensor:
    """The spec of ``out="f16"``'s codes: e4m3 [M, K] → their fp16 values, K permuted by F16_K_PERM in every 16."""
    m, k = q.shape
    return q.to(torch.float16).reshape(m, k // 16, 16)[:, :, F16_K_PERM.to(q.device)].reshape(m, k).contiguous()


def act_quant_e4m3(x2: torch.Tensor, smooth: torch.Tensor, lora_down: torch.Tensor, group_size: int = 64,
                   out: str = "e4m3") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """x2 [M, K] (bf16/fp16, contiguous rows), smooth [K], lora_down [r, K] → (q float8_e4m3fn [M, K], t float32
    [M], S float32 [M, r] or None when r = 0); ``out="f16"``: q as the fp16 token operand (module doc) instead;
    ``out="xab"`` (group_size 64): (q, xab float32 [K/64, 2, M], S), the decode kernel's e4m3 operands.
    ``group_size`` otherwise only sets the kernels' K step (a multiple of 64 that divides K). Inputs are assumed
    validated by the op (``w4a4_gemm.check_linear_args``)."""
    if out not in OUTS:
        raise ValueError(f"act_quant_e4m3: out must be one of {OUTS}, got {out!r}")
    if out == "xab" and group_size != XAB_GROUP:
        raise ValueError(f"act_quant_e4m3: out='xab' needs group_size={XAB_GROUP} (exact group sums), got {group_size}")
    m, k = x2.shape
    r = lora_down.shape[0]
    dev = x2.device
    if not (x2.is_cuda or _interpreting()) or m == 0:
        xs = x2.float() / smooth.float()
        q, t = quantize_act_e4m3(xs)
        s = xs @ lora_down.float().t() if r else None
        if out == "xab":
            return q, e4m3_xab_ref(q, t), s
        return (e4m3_f16_operand_ref(q) if out == "f16" else q), t, s
    if out in ("f16", "xab"):
        xab = out == "xab"
        q = torch.empty((m, k), device=dev, dtype=E4M3 if xab else torch.float16)
        t = torch.empty((k // XAB_GROUP, 2, m) if xab else (m,), device=dev, dtype=torch.float32)
        s = torch.empty((m, r), device=dev, dtype=torch.float32)
        mant, emin = _FP8_GRID[E4M3]
        one = k <= F16_ROW_BLOCK
        a = lora_down if r else x2
        launch(_e4m3_rows_kernel, (m, cdiv(r, F16_RANK_CHUNK) if r else 1), x2, x2.stride(0), smooth, q, t,
               a, a.stride(0), s, s.stride(0), m, k, r, BLOCK_K=next_pow2(k) if one else 2048, RC=F16_RANK_CHUNK,
               MANT=mant, EMIN=emin, EMU_CVT=_interpreting(), ONE_PASS=one, HAS_LOWRANK=r > 0, XAB=xab, num_warps=8,
               **_operand_pdl(dev, "e4m3_rows"))
        return q, t, (s if r else None)
    plan, feed = _fed_plan(plan_act_quant(m, k, group_size, dev, variant="v3", fmt="int4_2l", rank=r), x2, r,
                           "int4_2l", group_size)
    bm, _, nsplit, sps, warps, _ = plan[:6]
    br = rank_block(r)
    grid = (cdiv(m, bm), nsplit)
    lowrank_act = torch.empty((m, r), device=dev, dtype=torch.float32)
    sp = lowrank_act if (nsplit == 1 or r == 0) else torch.empty((nsplit, m, r), device=dev, dtype=torch.float32)
    spst = sp.stride(0) if sp.dim() == 3 else 0
    rl, pieces, shift = _prep(x2, smooth, lora_down, r, br, unscaled=feed != "split")
    emu = _interpreting()
    amax_part = torch.empty((nsplit, m), device=dev, dtype=torch.float32)
    _launch_row_stats(_act_2l_stats_v3_kernel, grid, x2, smooth, rl, pieces, sp, spst, r, amax_part, sps, bm,
                      group_size, br, shift, emu, feed, warps)
    q = torch.empty((m, k), device=dev, dtype=E4M3)
    t = torch.empty((m,), device=dev, dtype=torch.float32)
    mant, emin = _FP8_GRID[E4M3]
    launch(_act_e4m3_quant_kernel, grid, x2, x2.stride(0), smooth, rl, q, q.stride(0), t, amax_part,
           amax_part.stride(0), m, k, nsplit, sps, G=group_size, BLOCK_M=bm, SPLIT_P2=next_pow2(nsplit), MANT=mant,
           EMIN=emin, EMU_FMA=emu, EMU_CVT=emu, num_warps=warps)
    _sum_partials(sp, lowrank_act, nsplit, br)
    return q, t, (lowrank_act if r else None)
