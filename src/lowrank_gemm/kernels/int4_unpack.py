"""int4 → int8 expansion in registers, four bytes per instruction (SWAR), shared by every W4A4 main loop.

Written with Triton's element-wise int8 ops, one packed nibble costs ~6 instructions (the sm_90 PTX of
the v1 two-level loop: 56 ``prmt``, 32 each of ``cvt.u16.u32`` / ``shr.s16`` / ``mul.lo.s16`` /
``cvt.u32.u16`` and 16 ``shl.b16`` per thread and K step — ~200 of the loop's 327 instructions). The
8-bit tensor cores then wait on the integer pipes. These helpers do the same work on whole 32-bit
registers holding four packed bytes (``tl.inline_asm_elementwise(pack=4)``), with no carry ever crossing
a byte boundary:

    sign-extend a nibble n (two's complement, 0..15) to a byte:  ((n ^ 8) + 120) ^ 128
        (n ^ 8) ∈ [0, 15] is n + 8 in offset binary; + 120 stays ≤ 135 < 256 (no carry into the next
        byte); flipping bit 7 turns the unsigned byte v into the int8 value v − 128 = q.
    the two-level product q·u (u ∈ [1, 15], one per weight row and group):
        ((q + 8)·u + 128 − 8u) ^ 128         (q + 8)·u ≤ 225 and the sum stays in [8, 233]: one IMUL
        of the whole register by u forms four byte products without carries.

So: 3 instructions per 4 low nibbles, 4 per 4 high nibbles, 5–6 per 4 two-level products.

The product form (LO_MUL_ASM / HI_MUL_ASM) multiplies the register by the u of its FIRST byte, so it is
only correct when the four bytes an asm instance gets share a row. Triton packs consecutive elements of a
thread's registers, and which elements those are depends on the layout the compiler picks: on the H200 a
[16, 32] tile got a layout where they did not (wrong products). So the Triton helpers here do the nibble
extraction in SWAR and the multiply element-wise (correct in any layout); only the Gluon expander, whose
layout is explicit (16 consecutive K bytes of one row per thread), uses the one-IMUL product form
(bit-identical to the plain path on the H200, scripts/bisect_gluon.py time rung).
The interpreter cannot run inline PTX, so ``SWAR=False`` keeps the plain element-wise path (CPU tests).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

__all__ = ["unpack_lo", "unpack_hi", "unpack_lo_mul", "unpack_hi_mul", "LO_ASM", "HI_ASM", "LO_MUL_ASM", "HI_MUL_ASM",
           "LO_OFFSET_ASM", "HI_OFFSET_ASM", "SWAR_DEFAULT"]

# Compiled kernels take the SWAR path; the interpreter (no inline PTX) the plain one. Read at import: the
# CPU tests set TRITON_INTERPRET before importing, the sm_90 AOT compiles run in a child without it.
SWAR_DEFAULT = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")

LO_ASM = tl.constexpr("""{
.reg .b32 t;
lop3.b32 t, $1, 0x0F0F0F0F, 0x08080808, 0x6a;
add.u32 t, t, 0x78787878;
xor.b32 $0, t, 0x80808080;
}""")

HI_ASM = tl.constexpr("""{
.reg .b32 t;
shr.u32 t, $1, 4;
lop3.b32 t, t, 0x0F0F0F0F, 0x08080808, 0x6a;
add.u32 t, t, 0x78787878;
xor.b32 $0, t, 0x80808080;
}""")

# Offset binary n' = q + 8 per byte (the first step of the sign extension above): the W4A4 fp8 path feeds these
# bytes to an e4m3 wgmma as n'·2⁻⁹ and corrects the +8 per group (gluon/w4a4_ws.py, module doc).
LO_OFFSET_ASM = tl.constexpr("lop3.b32 $0, $1, 0x0F0F0F0F, 0x08080808, 0x6a;")

HI_OFFSET_ASM = tl.constexpr("""{
.reg .b32 t;
shr.u32 t, $1, 4;
lop3.b32 $0, t, 0x0F0F0F0F, 0x08080808, 0x6a;
}""")

# (q + 8)·u + (0x80 − 8u) per byte, then bit 7 flipped; u from byte 0 of $2
LO_MUL_ASM = tl.constexpr("""{
.reg .b32 n, u, c;
and.b32 u, $2, 0xFF;
lop3.b32 n, $1, 0x0F0F0F0F, 0x08080808, 0x6a;
mul.lo.u32 n, n, u;
mul.lo.u32 c, u, 0x08080808;
sub.u32 c, 0x80808080, c;
add.u32 n, n, c;
xor.b32 $0, n, 0x80808080;
}""")

HI_MUL_ASM = tl.constexpr("""{
.reg .b32 n, u, c;
and.b32 u, $2, 0xFF;
shr.u32 n, $1, 4;
lop3.b32 n, n, 0x0F0F0F0F, 0x08080808, 0x6a;
mul.lo.u32 n, n, u;
mul.lo.u32 c, u, 0x08080808;
sub.u32 c, 0x80808080, c;
add.u32 n, n, c;
xor.b32 $0, n, 0x80808080;
}""")


@triton.jit
def unpack_lo(p, SWAR: tl.constexpr):
    """Packed bytes ``p`` (int8) → their sign-extended low nibbles (int8, same shape)."""
    if SWAR:
        return tl.inline_asm_elementwise(LO_ASM, "=r,r", [p], dtype=tl.int8, is_pure=True, pack=4)
    else:
        return (p << 4) >> 4   # arithmetic shift on int8 sign-extends


@triton.jit
def unpack_hi(p, SWAR: tl.constexpr):
    """Packed bytes ``p`` (int8) → their sign-extended high nibbles (int8, same shape)."""
    if SWAR:
        return tl.inline_asm_elementwise(HI_ASM, "=r,r", [p], dtype=tl.int8, is_pure=True, pack=4)
    else:
        return p >> 4


@triton.jit
def unpack_lo_mul(p, u, SWAR: tl.constexpr):
    """Low nibbles of ``p`` [R, C] times the per-row multipliers ``u`` [R] (int8, 1..15) → int8 [R, C]."""
    return unpack_lo(p, SWAR) * u[:, None]


@triton.jit
def unpack_hi_mul(p, u, SWAR: tl.constexpr):
    """High nibbles of ``p`` [R, C] times the per-row multipliers ``u`` [R] → int8 [R, C]."""
    return unpack_hi(p, SWAR) * u[:, None]


@triton.jit
def expand_rows_kernel(p_ptr, u_ptr, out_ptr, R, C, MUL: tl.constexpr, SWAR: tl.constexpr,
                       BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Test subject for the helpers above: packed ``p`` uint8 [R, C] (+ ``u`` uint8 [R] when MUL) →
    ``out`` int8 [R, 2C] = (low-nibble values | high-nibble values) per row, each half optionally × u."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    p = tl.load(p_ptr + rows[:, None] * C + cols[None, :], mask=mask, other=0).to(tl.int8, bitcast=True)
    if MUL:
        u = tl.load(u_ptr + rows, mask=rows < R, other=1).to(tl.int8)
        lo = unpack_lo_mul(p, u, SWAR)
        hi = unpack_hi_mul(p, u, SWAR)
    else:
        lo = unpack_lo(p, SWAR)
        hi = unpack_hi(p, SWAR)
    base = out_ptr + rows[:, None] * (2 * C) + cols[None, :]
    tl.store(base, lo, mask=mask)
    tl.store(base + C, hi, mask=mask)
