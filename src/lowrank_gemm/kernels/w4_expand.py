"""Expand packed int4 weights once per call into a transient 8-bit [N, K] buffer (natural K order).

At compute-bound M (prefill, FLUX fc1) the W4A4 v1 main loop spends its time *between* MMAs: unpacking
nibbles (and, for int4_2l, multiplying by ``u``) for every output tile that reads the weight tile, i.e.
``cdiv(M, BLOCK_M)`` times per weight byte. Expanding once per call costs one streaming pass (fc1:
read 19 MB, write 38 MB ≈ 14 µs at copy bandwidth) and lets the GEMM read its B operand straight from
TMA into wgmma (variant ``"expand"`` of :mod:`.w4a4_gemm`). vLLM does the same for AWQ at large batch.

    expand_w4(w_q [N, K/2] uint8, w_mul [K/G, N] uint8 | None, group_size, fmt, out_dtype) → [N, K]

    int4_2l:  out[n, k] = q[n, k] · u[k // G, n]  as int8 (|q·u| ≤ 120: exact)
    int4_g64: out[n, k] = q[n, k]                 as int8, or float8_e4m3fn (every int4 is exact in e4m3)

    expand_act_f8(x_q [M, K/2] uint8, x_scale [K/G, M] 16-bit, group_size) → (x8 [M, K] e4m3, xab [K/G, 2, M] fp32)
        the activation side of the W4A4 fp8 paths (gluon/w4a4_ws.py, gluon/w4a4_decode.py): x8 = q exactly; per
        (group, row) a = 2⁹·xs and b = −8·R·xs with R = Σ_k∈g q — the rows that undo the offset encoding of the
        weights. ``act_quant(..., out="f8")`` writes the same bytes straight from x (no packed intermediate):
        both go through :func:`e4m3_codes` and :func:`act_f8_rows`.

Packing (formats.int4.pack_int4): per 64-block b, byte b·32 + j holds element b·64 + j (low nibble) and
b·64 + 32 + j (high nibble), so the two nibble planes of a block are the two contiguous 32-element
halves of the block in natural order: one 32-byte store each, no shuffles.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from ..formats.int4 import PACK_BLOCK
from .env import getenv
from .int4_unpack import SWAR_DEFAULT, unpack_hi, unpack_lo
from .launch import launch
from .pdl import gdc_launch_dependents, gdc_wait, pdl_enabled
from .schedule import cdiv

__all__ = ["expand_w4", "expand_w4_ref", "EXPAND_DTYPES", "expand_act_f8", "expand_act_f8_ref", "e4m3_operands",
           "F8_W_SHIFT", "e4m3_codes", "act_f8_rows", "F16_K_PERM", "f16_weight_operands", "f16_weight_operands_ref",
           "f16_act_operands", "f16_act_operands_ref", "f16_row_exponent", "f16_scaled_down", "f16_row_power",
           "f16_column", "xab_rows"]

EXPAND_DTYPES = (torch.int8, torch.float8_e4m3fn)
_HALF = PACK_BLOCK // 2


@triton.jit
def _w4_expand_kernel(
    wq_ptr,                 # (N, K/2) u8 packed int4
    wu_ptr, stride_wug,     # (K/G, N) u8 multipliers (TWO_LEVEL) / unused
    out_ptr,                # (N, K) int8 | fp8e4nv
    N, KH,                  # KH = K/2 (bytes per packed row)
    G: tl.constexpr, TWO_LEVEL: tl.constexpr, OUT_FP8: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,   # rows, packing blocks (64 elements) per program
    OFFSET: tl.constexpr = False,                   # e4m3 bit patterns of n' = q + 8 (the v2 fp8 weight operand)
    ws_ptr=None, ws_out_ptr=None,                   # (K/G, N) 16-bit group scales → fp32 copy (WS_F32)
    WS_F32: tl.constexpr = False,
):
    HALF: tl.constexpr = 32
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_b = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    offs_j = tl.arange(0, HALF)
    rows = offs_n.to(tl.int64)[:, None, None]
    cols = offs_b[None, :, None] * HALF + offs_j[None, None, :]                       # packed byte
    mask = (offs_n < N)[:, None, None] & (offs_b < KH // HALF)[None, :, None]
    p = tl.load(wq_ptr + rows * KH + cols, mask=mask, other=0).to(tl.int8, bitcast=True)  # [BN, BB, 32]
    if OFFSET:
        lo = ((p & 0x0F) ^ 0x08).to(tl.float8e4nv, bitcast=True)
        hi = (((p >> 4) & 0x0F) ^ 0x08).to(tl.float8e4nv, bitcast=True)
    else:
        lo = unpack_lo(p, SWAR_DEFAULT)
        hi = unpack_hi(p, SWAR_DEFAULT)
    if TWO_LEVEL:
        g = (offs_b * 64) // G
        u = tl.load(wu_ptr + g[None, :] * stride_wug + offs_n[:, None],
                    mask=(offs_n < N)[:, None] & (offs_b < KH // HALF)[None, :], other=0).to(tl.int8)
        lo = lo * u[:, :, None]
        hi = hi * u[:, :, None]
    if OUT_FP8 and not OFFSET:
        lo = lo.to(tl.float16).to(tl.float8e4nv)
        hi = hi.to(tl.float16).to(tl.float8e4nv)
    dst = out_ptr + rows * (2 * KH) + offs_b[None, :, None] * (2 * HALF) + offs_j[None, None, :]
    tl.store(dst, lo, mask=mask)
    tl.store(dst + HALF, hi, mask=mask)
    if WS_F32:
        # the group scales of this tile, exactly, as fp32 (what the v2 no-expander kernel's ring carries): the
        # program holding a group's first 64-block writes it, so every value is written once
        first = ((offs_b * 64) % G == 0) & (offs_b < KH // HALF)
        gs = (offs_b * 64) // G
        smask = (offs_n < N)[:, None] & first[None, :]
        sp = gs[None, :].to(tl.int64) * N + offs_n[:, None]
        tl.store(ws_out_ptr + sp, tl.load(ws_ptr + sp, mask=smask, other=0.0).to(tl.float32), mask=smask)


def expand_w4(w_q: torch.Tensor, w_mul: torch.Tensor | None, group_size: int, fmt: str,
              out_dtype: torch.dtype = torch.int8, out: torch.Tensor | None = None,
              block_n: int = 32, block_b: int = 8, offset: bool = False, scales: torch.Tensor | None = None):
    """Packed int4 weights → 8-bit [N, K] (module docstring). ``out`` (optional, [N, K] of ``out_dtype``)
    is written completely; without it a fresh buffer comes from torch's caching allocator (graph safe).
    ``offset`` (int4_g64, e4m3 only): the bytes are the offset nibbles n' = q + 8, whose e4m3 bit patterns mean
    n'·2⁻⁹ — the weight operand the v2 fp8 kernel otherwise expands in shared memory (gluon/w4a4_ws.py).
    ``scales`` (int4_g64, [K/G, N] 16-bit, contiguous): also converted to fp32 in the same launch (exact; the rows
    the no-expander kernel reads), and ``(out, scales_fp32)`` is returned instead of ``out``."""
    if w_q.dtype != torch.uint8 or w_q.dim() != 2:
        raise ValueError(f"expand_w4: w_q must be uint8 [N, K/2], got {w_q.dtype} {list(w_q.shape)}")
    n, k = w_q.shape[0], 2 * w_q.shape[1]
    if k % PACK_BLOCK or k % group_size:
        raise ValueError(f"expand_w4: K={k} must be a multiple of {PACK_BLOCK} and of group_size={group_size}")
    if out_dtype not in EXPAND_DTYPES:
        raise ValueError(f"expand_w4: out_dtype must be one of {EXPAND_DTYPES}, got {out_dtype}")
    two_level = fmt == "int4_2l"
    if two_level:
        if w_mul is None or w_mul.dtype != torch.uint8 or tuple(w_mul.shape) != (k // group_size, n):
            raise ValueError(f"expand_w4: int4_2l needs w_mul uint8 [K/G, N] = {[k // group_size, n]}, got "
                             f"{None if w_mul is None else (w_mul.dtype, list(w_mul.shape))}")
        if out_dtype != torch.int8:
            raise ValueError("expand_w4: int4_2l expands to int8 (q·u up to ±120 is not exact in e4m3)")
    elif fmt != "int4_g64":
        raise ValueError(f"expand_w4: fmt must be 'int4_g64' or 'int4_2l', got {fmt!r}")
    if offset and (two_level or out_dtype != torch.float8_e4m3fn):
        raise ValueError(f"expand_w4: offset nibbles are an int4_g64 e4m3 output, got fmt={fmt!r}, "
                         f"out_dtype={out_dtype}")
    if not w_q.is_contiguous() or (w_mul is not None and not w_mul.is_contiguous()):
        raise ValueError("expand_w4: w_q and w_mul must be contiguous")
    if scales is not None and (two_level or scales.dtype not in (torch.bfloat16, torch.float16)
                               or tuple(scales.shape) != (k // group_size, n) or not scales.is_contiguous()
                               or scales.device != w_q.device):
        raise ValueError(f"expand_w4: scales must be contiguous 16-bit [K/G, N] = {[k // group_size, n]} on "
                         f"{w_q.device} (int4_g64), got {scales.dtype} {list(scales.shape)} on {scales.device}")
    ws32 = None if scales is None else torch.empty(scales.shape, device=scales.device, dtype=torch.float32)
    if out is None:
        out = torch.empty((n, k), device=w_q.device, dtype=out_dtype)
    elif out.shape != (n, k) or out.dtype != out_dtype or not out.is_contiguous() or out.device != w_q.device:
        raise ValueError(f"expand_w4: out must be contiguous {out_dtype} [{n}, {k}] on {w_q.device}, got "
                         f"{out.dtype} {list(out.shape)} on {out.device}")
    if n == 0:
        return out if scales is None else (out, ws32)
    if not w_q.is_cuda and getenv("TRITON_INTERPRET", "0") != "1":
        # CPU without the interpreter (ahead-of-time compiles build their launch arguments this way)
        ref = expand_w4_ref(w_q, w_mul, group_size, fmt, offset=offset)
        out.copy_(ref.to(torch.uint8).view(out.dtype) if offset else ref.to(out_dtype))
        return out if scales is None else (out, ws32.copy_(scales))
    wu = w_mul if two_level else w_q
    grid = (cdiv(n, block_n), cdiv(k // PACK_BLOCK, block_b))
    launch(_w4_expand_kernel, grid, w_q, wu, wu.stride(0), out, n, k // 2, G=group_size, TWO_LEVEL=two_level,
           OUT_FP8=out_dtype == torch.float8_e4m3fn, BLOCK_N=block_n, BLOCK_B=block_b, OFFSET=offset,
           ws_ptr=scales, ws_out_ptr=ws32, WS_F32=scales is not None, num_warps=4)
    return out if scales is None else (out, ws32)


def expand_w4_ref(w_q: torch.Tensor, w_mul: torch.Tensor | None, group_size: int, fmt: str,
                  offset: bool = False) -> torch.Tensor:
    """Torch spec of :func:`expand_w4` as int16 [N, K] (exact values q or q·u; ``offset``: the bytes q + 8)."""
    from ..formats.int4 import unpack_int4
    q = unpack_int4(w_q).to(torch.int16)
    if offset:
        return q + F8_W_OFFSET
    if fmt == "int4_2l":
        q = q * w_mul.to(torch.int16).t().repeat_interleave(group_size, dim=1)
    return q


# The v2 fp8 path feeds weight nibbles as n' = q + 8 whose e4m3 bit patterns mean n'·2⁻⁹.
F8_W_SHIFT = 9
F8_W_OFFSET = 8
_F8_A = tl.constexpr(2.0 ** F8_W_SHIFT)
_F8_B = tl.constexpr(-float(F8_W_OFFSET))


@triton.jit
def e4m3_codes(q):
    """Integer codes q ∈ [−8, 7] (any integer dtype) → e4m3, exactly (through fp16, as every int4 path does)."""
    return q.to(tl.float16).to(tl.float8e4nv)


@triton.jit
def act_f8_rows(rsum, xs):
    """The xab rows of one (group, row): (a, b) = (2⁹·xs, −8·R·xs) for the group row sum R (integer) and the
    group scale xs (the 16-bit value, as fp32). Both products are exact (|R| ≤ 1024, 16-bit xs)."""
    return xs * _F8_A, _F8_B * rsum.to(tl.float32) * xs


# When each token-operand kernel lets the GEMM after it launch: "early" (its first instruction, the PDL rule of
# kernels/pdl.py), "after_wait" (once its own wait has seen act_quant finish) or "off" (launched without PDL). They
# sit mid-chain: act_quant → operand kernel → decode GEMM. H200, act_quant(packed) → the GEMM op (NOTES.md session 40):
# e4m3 at M = 8 / 16: early 26.0 / 26.7 µs, off 28.4 / 28.8; fp16 at M = 24 / 32: early 64.7 / 66.6 (after_wait the
# same), off 43.8 / 43.6, and off no slower at 17 and 48.
# "e4m3_rows": the W4A8 decode quantizer (act_e4m3, the layer's first kernel, before the decode GEMM's fp16 path).
# H100, W4A8 layer at N = 28672, K = 4096, off / early / after_wait µs (probes/s41j, bit-identical): M = 1 35.8 / 32.2
# / 32.8, M = 16 36.8 / 33.8 / 35.1, M = 64 43.7 / 41.8 / 41.8.
OPERAND_PDL_TRIGGER = {"e4m3": "early", "f16": "off", "e4m3_rows": "early"}
_OPERAND_PDL_TRIGGERS = ("early", "after_wait", "off")


def _operand_pdl(device: torch.device, operand: str) -> dict:
    """The PDL launch keywords of the ``operand`` kernel ("e4m3", "f16" or "e4m3_rows") under
    :data:`OPERAND_PDL_TRIGGER`."""
    trigger = OPERAND_PDL_TRIGGER[operand]
    if trigger not in _OPERAND_PDL_TRIGGERS:
        raise ValueError(f"OPERAND_PDL_TRIGGER[{operand!r}] must be one of {_OPERAND_PDL_TRIGGERS}, got {trigger!r}")
    pdl = trigger != "off" and pdl_enabled(device)
    return dict(PDL=pdl, PDL_LATE=trigger == "after_wait", launch_pdl=pdl)


@triton.jit
def _operand_pdl_entry(PDL: tl.constexpr, PDL_LATE: tl.constexpr):
    """An operand kernel's PDL entry: wait for act_quant before reading its output; let the GEMM launch before or
    after that wait (:data:`OPERAND_PDL_TRIGGER`)."""
    if PDL:
        if not PDL_LATE:
            gdc_launch_dependents()
        gdc_wait()
        if PDL_LATE:
            gdc_launch_dependents()


@triton.jit
def _act_f8_kernel(xq_ptr, xs_ptr, x8_ptr, xab_ptr, M, KH,
                   G: tl.constexpr, BLOCK_M: tl.constexpr, PDL: tl.constexpr = False,
                   PDL_LATE: tl.constexpr = False):
    """One program: BLOCK_M rows × one scale group. x8 = q as e4m3; xab[g, 0, m] = 2⁹·xs, xab[g, 1, m] = −8·R·xs.
    PDL: :func:`_operand_pdl_entry` (x_q / x_scale are read after its wait)."""
    _operand_pdl_entry(PDL, PDL_LATE)
    HALF: tl.constexpr = 32
    NB: tl.constexpr = G // 64
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    g = tl.program_id(1)
    rows = offs_m.to(tl.int64)[:, None, None]
    offs_b = g * NB + tl.arange(0, NB)
    offs_j = tl.arange(0, HALF)
    cols = offs_b[None, :, None] * HALF + offs_j[None, None, :]
    mask = (offs_m < M)[:, None, None] & (cols < KH)
    p = tl.load(xq_ptr + rows * KH + cols, mask=mask, other=0).to(tl.int8, bitcast=True)   # [BM, NB, 32]
    lo = (p << 4) >> 4      # arithmetic shifts sign-extend the two's-complement nibbles
    hi = p >> 4
    rsum = tl.sum(tl.sum(lo.to(tl.int32) + hi.to(tl.int32), axis=2), axis=1)                # R [BM]
    dst = x8_ptr + rows * (2 * KH) + offs_b[None, :, None] * (2 * HALF) + offs_j[None, None, :]
    tl.store(dst, e4m3_codes(lo), mask=mask)
    tl.store(dst + HALF, e4m3_codes(hi), mask=mask)
    mm = offs_m < M
    xs = tl.load(xs_ptr + g * M + offs_m, mask=mm, other=0.0).to(tl.float32)
    row_a, row_b = act_f8_rows(rsum, xs)
    tl.store(xab_ptr + (2 * g) * M + offs_m, row_a, mask=mm)
    tl.store(xab_ptr + (2 * g + 1) * M + offs_m, row_b, mask=mm)


def expand_act_f8(x_q: torch.Tensor, x_scale: torch.Tensor, group_size: int, block_m: int = 32):
    """Packed int4 activations (+ their group scales) → the operands of the W4A4 fp8 paths (module doc).
    Fresh buffers from torch's caching allocator (graph safe); the xab rows of M are 16-byte aligned when
    M % 4 == 0 (the TMA path's condition, gluon.w4a4_ws.scale_tma_ok). Launched with PDL when
    :func:`pdl.pdl_enabled` (``LOWRANK_GEMM_PDL=1``), its trigger as :data:`OPERAND_PDL_TRIGGER` says."""
    if x_q.dtype != torch.uint8 or x_q.dim() != 2 or not x_q.is_contiguous():
        raise ValueError(f"expand_act_f8: x_q must be contiguous uint8 [M, K/2], got {x_q.dtype} {list(x_q.shape)}")
    m, k = x_q.shape[0], 2 * x_q.shape[1]
    if group_size % PACK_BLOCK or k % group_size:
        raise ValueError(f"expand_act_f8: group_size={group_size} must be a multiple of {PACK_BLOCK} dividing K={k}")
    if tuple(x_scale.shape) != (k // group_size, m) or not x_scale.is_contiguous():
        raise ValueError(f"expand_act_f8: x_scale must be contiguous [K/G, M] = {[k // group_size, m]}, got "
                         f"{list(x_scale.shape)}")
    if not x_q.is_cuda and getenv("TRITON_INTERPRET", "0") != "1":
        # CPU without the interpreter (ahead-of-time compiles build their launch arguments this way)
        q, xab = expand_act_f8_ref(x_q, x_scale, group_size)
        return q.to(torch.float8_e4m3fn), xab
    x8 = torch.empty((m, k), device=x_q.device, dtype=torch.float8_e4m3fn)
    xab = torch.empty((k // group_size, 2, m), device=x_q.device, dtype=torch.float32)
    if m:
        grid = (cdiv(m, block_m), k // group_size)
        launch(_act_f8_kernel, grid, x_q, x_scale, x8, xab, m, k // 2, G=group_size, BLOCK_M=block_m,
               num_warps=4, **_operand_pdl(x_q.device, "e4m3"))
    return x8, xab


def e4m3_operands(q: torch.Tensor, scales: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer activation codes q int8 [M, K] (any values exact in e4m3: |q| ≤ 16) and their 16-bit group scales
    [K/G, M] → the e4m3 GEMM operands (x8 float8_e4m3fn [M, K], xab fp32 [K/G, 2, M]) in torch ops on q's device:
    the layout and bits of :func:`expand_act_f8` (xab = (2⁹·s, −8·R·s), both products exact for |R| ≤ 1024). The
    unsigned-activation layers use it (codes 0…15, which packed int4 cannot hold)."""
    m, k = q.shape
    r = q.reshape(m, k // group_size, group_size).sum(-1, dtype=torch.int32).t().float()      # [K/G, M]
    return q.to(torch.float8_e4m3fn), xab_rows(r, scales.float())


def xab_rows(r: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Group row sums R and group scales s (float32 [K/G, M]) → xab float32 [K/G, 2, M] = (2⁹·s, −8·R·s) in the
    order :func:`act_f8_rows` rounds them (torch ops: the kernels' spec)."""
    a = s * torch.full_like(s, 2.0 ** F8_W_SHIFT)
    b = (r * torch.full_like(r, -float(F8_W_OFFSET))) * s
    return torch.stack([a, b], dim=1).contiguous()


def expand_act_f8_ref(x_q: torch.Tensor, x_scale: torch.Tensor, group_size: int):
    """Torch spec of :func:`expand_act_f8`: (q as float32 [M, K], xab float32 [K/G, 2, M])."""
    from ..formats.int4 import unpack_int4
    q = unpack_int4(x_q.cpu())
    return q.to(torch.float32), e4m3_operands(q, x_scale.cpu(), group_size)[1]

# ---------------------------------------------------------------------------------------------------------------
# The exact fp16 operands of the int4_g64 decode kernel's F16 path (gluon/w4a4_decode.py, ``f16=True``).
#
# A group-64 product Σ_g (a_s[m,g]·w_s[n,g])·Σ_{k∈g} q_x·q_w needs its per-group rescale because the codes carry
# no scale. Folded into 16-bit operands it needs none: x = q_x·a_s and w = q_w·w_s are exact in fp16 when the
# 16-bit scale has ≤ 8 significant bits (bf16: 8 + 3 bits for |q| ≤ 8 → 11 = fp16's precision) and the value is a
# normal fp16 — so one fp16 MMA accumulates the whole K in fp32 with no per-group step. The range is made safe by
# a power of two per token row (t[m]) and per weight column (c[n]): every value of a row / column is scaled so its
# largest |scale|·8 lands in [2¹⁴, 2¹⁵), and t ⊗ c is applied once in the epilogue (exact: powers of two). Only
# groups 2²⁶× below their row's / column's largest fall into fp16's subnormals (a relative error there that is
# invisible next to the row's / column's other groups). fp16 scales (11 bits) round q·s to fp16 (≤ 2⁻¹¹
# relative per element).
#
# The token operand is stored with K permuted inside every 16 columns (F16_K_PERM): the kernel's weight fragments
# are expanded from the packed bytes in the 8-bit wgmma register layout (four consecutive K bytes per register,
# so one 32-bit shared-memory load per four bytes), which holds, per thread, the K positions that the 16-bit
# register layout assigns to a different K order; permuting the tokens the same way makes the contraction
# identical without moving a single weight value between threads.

F16_RANGE_EXP = 11      # largest |scale| of a row / column scaled into [2¹¹, 2¹²): |q·s| < 2¹⁵ < 65504


def _f16_k_perm() -> torch.Tensor:
    """F16_K_PERM[ℓ] = the natural K position stored at column ℓ of every 16-column chunk: ℓ = 8j + 2q + i holds
    K 4q + 2j + i (q: the thread's lane in its quad, i, j: the two halves of an fp16 pair / fragment)."""
    ell = torch.arange(16)
    return 4 * ((ell >> 1) & 3) + 2 * (ell >> 3) + (ell & 1)


F16_K_PERM = _f16_k_perm()


def _pow2_exponent(amax: torch.Tensor) -> torch.Tensor:
    """e with amax·2⁻ᵉ ∈ [2^F16_RANGE_EXP, 2^(F16_RANGE_EXP+1)) (0 where amax is 0 or not finite), int32."""
    _, e = torch.frexp(amax)                  # amax = f·2^e, f ∈ [0.5, 1)
    e = e - (F16_RANGE_EXP + 1)
    return torch.where((amax > 0) & torch.isfinite(amax), e, torch.zeros_like(e)).to(torch.int32)


def _live_scale_max(q: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per row of q int8 [R, K]: the largest |scale| [K/G, R] over its groups with a nonzero code (0 if none). A
    group of zero codes adds nothing whatever its scale (an all-zero group's scale is 1 by the quantizer's rule), so
    it must not set the row's power of two: a row of tiny values would otherwise be scaled into fp16's subnormals."""
    r, k = q.shape
    live = (q.reshape(r, k // group_size, group_size) != 0).any(-1).t()          # [K/G, R]
    return torch.where(live, scales.float().abs(), torch.zeros((), device=scales.device)).amax(dim=0)


def f16_weight_operands_ref(w_q: torch.Tensor, w_scale: torch.Tensor,
                            group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed weights uint8 [N, K/2] and their scales [K/G, N] 16-bit → (w16 float16 [K/G, N] = w_scale·2⁻ᶜ, c_mul
    float32 [N] = 2ᶜ), c from the column's live groups (:func:`_live_scale_max`); torch ops on w_scale's device (no
    sync: graph-capturable)."""
    from ..formats.int4 import unpack_int4
    s = w_scale.float()
    e = _pow2_exponent(_live_scale_max(unpack_int4(w_q), w_scale, group_size))
    return torch.ldexp(s, -e[None, :].float()).to(torch.float16), torch.ldexp(torch.ones_like(s[0]), e.float())


def f16_weight_operands(w_q: torch.Tensor, w_scale: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`f16_weight_operands_ref`, built once per weight (address + version of both tensors, lora_gemm's weight
    cache): the layer's weights do not change between calls."""
    from .lora_gemm import _WEIGHT_CACHE
    return _WEIGHT_CACHE.get("w4a4_f16_w", (w_q, w_scale), (group_size, ),
                             lambda: f16_weight_operands_ref(w_q, w_scale, group_size))


_F16_EXP = tl.constexpr(F16_RANGE_EXP)


@triton.jit
def _pow2(e):
    """2^e as fp32 for integer e ∈ [−126, 127], from its bits."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def f16_row_exponent(amax):
    """:func:`_pow2_exponent` on fp32 bits (int32, elementwise): p = frexp's e − (F16_RANGE_EXP + 1) of amax, 0 where
    amax is 0 or not finite; a subnormal amax is read ×2⁶⁴."""
    e_n = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF                              # biased exponent
    e_s = ((amax * 18446744073709551616.0).to(tl.int32, bitcast=True) >> 23) & 0xFF   # (subnormal amax: × 2⁶⁴)
    p = tl.where(e_n == 0, e_s - 64, e_n) - (127 + _F16_EXP)    # frexp's e − (F16_RANGE_EXP + 1) = biased − 126 − …
    return tl.where((amax > 0) & (e_n < 255), p, 0)


@triton.jit
def f16_scaled_down(v, p):
    """v·2⁻ᵖ, exact for normal results: 2⁻ᵖ as two normal powers of two (p alone may leave fp32's range)."""
    a = -p // 2
    return v * _pow2(a) * _pow2(-p - a)


@triton.jit
def f16_row_power(p):
    """2ᵖ as fp32 (two normal powers of two): the row's t."""
    p1 = p // 2
    return _pow2(p1) * _pow2(p - p1)


@triton.jit
def f16_column(k):
    """The stored column of natural K position k: (k & ~15) | ℓ(k & 15) with ℓ(4q + 2j + i) = 8j + 2q + i
    (the inverse of :data:`F16_K_PERM`)."""
    return (k & ~15) | (((k >> 1) & 1) << 3) | (((k >> 2) & 3) << 1) | (k & 1)


@triton.jit
def _act_f16_kernel(xq_ptr, xs_ptr, x16_ptr, t_ptr, M, KH, NG,
                    G: tl.constexpr, NG_P2: tl.constexpr, PDL: tl.constexpr = False,
                    PDL_LATE: tl.constexpr = False):
    """One program per token row of :func:`f16_act_operands`: the row's packed codes [NG, G/2] and scales [NG] in
    registers; p from the largest |scale| over the live groups (a nonzero code, :func:`f16_row_exponent`); q·s·2⁻ᵖ
    formed exactly in fp32 and stored as fp16 at the permuted column of every 16; t = 2ᵖ. PDL as
    :func:`_act_f8_kernel`."""
    _operand_pdl_entry(PDL, PDL_LATE)
    HB: tl.constexpr = G // 2                     # bytes per group: the group's 64-blocks' 32 bytes each
    m = tl.program_id(0)
    gi = tl.arange(0, NG_P2)
    bi = tl.arange(0, HB)
    g_ok = gi < NG
    pk = tl.load(xq_ptr + m.to(tl.int64) * KH + gi[:, None] * HB + bi[None, :], mask=g_ok[:, None],
                 other=0).to(tl.int8, bitcast=True)                                    # [NG, G/2]
    sc = tl.load(xs_ptr + gi * M + m, mask=g_ok, other=0.0).to(tl.float32)
    live = tl.max((pk != 0).to(tl.int32), axis=1) > 0
    p = f16_row_exponent(tl.max(tl.where(live, tl.abs(sc), 0.0), axis=0))
    xs = f16_scaled_down(sc, p)
    lo = ((pk << 4) >> 4).to(tl.float32) * xs[:, None]
    hi = (pk >> 4).to(tl.float32) * xs[:, None]
    # natural K of the low plane: G·g + 64·(j // 32) + j % 32 for byte j of the group
    k_lo = gi[:, None] * G + (bi[None, :] // 32) * 64 + bi[None, :] % 32
    row = x16_ptr + m.to(tl.int64) * (2 * KH)
    tl.store(row + f16_column(k_lo), lo.to(tl.float16), mask=g_ok[:, None])
    tl.store(row + f16_column(k_lo + 32), hi.to(tl.float16), mask=g_ok[:, None])
    tl.store(t_ptr + m, f16_row_power(p))


def f16_act_operands(x_q: torch.Tensor, x_scale: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed int4 activations uint8 [M, K/2] + their group scales [K/G, M] → (x16 float16 [M, K], K permuted by
    :data:`F16_K_PERM` in every 16 columns, = q·x_scale·2⁻ᵖ; t float32 [M] = 2ᵖ). One kernel on CUDA and under
    the interpreter (:func:`_act_f16_kernel`, PDL per :data:`OPERAND_PDL_TRIGGER`); :func:`f16_act_operands_ref` on the
    plain CPU."""
    if x_q.dtype != torch.uint8 or x_q.dim() != 2 or not x_q.is_contiguous():
        raise ValueError(f"f16_act_operands: x_q must be contiguous uint8 [M, K/2], got {x_q.dtype} "
                         f"{list(x_q.shape)}")
    m, k = x_q.shape[0], 2 * x_q.shape[1]
    if group_size % PACK_BLOCK or k % group_size:
        raise ValueError(f"f16_act_operands: group_size={group_size} must be a multiple of {PACK_BLOCK} dividing "
                         f"K={k}")
    if tuple(x_scale.shape) != (k // group_size, m) or not x_scale.is_contiguous():
        raise ValueError(f"f16_act_operands: x_scale must be contiguous [K/G, M] = {[k // group_size, m]}, got "
                         f"{list(x_scale.shape)}")
    if not x_q.is_cuda and getenv("TRITON_INTERPRET", "0") != "1":
        return f16_act_operands_ref(x_q, x_scale, group_size)
    x16 = torch.empty((m, k), device=x_q.device, dtype=torch.float16)
    t = torch.empty((m, ), device=x_q.device, dtype=torch.float32)
    if m:
        ng = k // group_size
        launch(_act_f16_kernel, (m, ), x_q, x_scale, x16, t, m, k // 2, ng, G=group_size,
               NG_P2=triton.next_power_of_2(ng), num_warps=4, **_operand_pdl(x_q.device, "f16"))
    return x16, t


def f16_act_operands_ref(x_q: torch.Tensor, x_scale: torch.Tensor,
                         group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch spec of :func:`f16_act_operands` (the same bits), on x_q's device."""
    from ..formats.int4 import unpack_int4
    m, k = x_q.shape[0], 2 * x_q.shape[1]
    q = unpack_int4(x_q).float()
    s = x_scale.float()                                        # [K/G, M]
    p = _pow2_exponent(_live_scale_max(q, x_scale, group_size))                      # [M]
    s = torch.ldexp(s, -p[None, :].float())
    x = (q.reshape(m, k // group_size, group_size) * s.t()[:, :, None]).reshape(m, k)
    perm = F16_K_PERM.to(x.device)
    x = x.reshape(m, k // 16, 16)[:, :, perm].reshape(m, k)
    return x.to(torch.float16).contiguous(), torch.ldexp(torch.ones_like(s[0]), p.float())
