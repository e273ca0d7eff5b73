"""W4A4 skinny GEMM (int4_g64, a handful of tokens, few weight rows): the GEMV's weight stream with the tensor cores
doing the token reuse (impl="skinny"; impl="auto" routes M in :data:`AUTO_SKINNY_M` with N < :data:`AUTO_SKINNY_MAX_N`
here).

    out[m, n] = epilogue( Σ_g xs[g, m] · ws[g, n] · Σ_{k ∈ g} q_x[m, k] · q_w[n, k] )     (int4_g64)

Why: the GEMV (kernels/w4a4_gemv.py) streams the weights at ~3.4 TB/s but re-runs its dp4a work for every token
(M = 4 costs twice M = 1); the decode kernel (gluon/w4a4_decode.py) reuses the weights across tokens on wgmma but
moves them through a TMA ring and a wait → ldmatrix → expand → wgmma → wait chain per CTA, ~2.2 TB/s. Here the
weights go straight from global memory into ``mma.sync`` registers, so the stream looks like the GEMV's:

- ``mma.sync.m16n8k32.s8``: 16 weight rows × 8 tokens × 32 K per instruction (weights = A, tokens = B). A 64-wide
  packing block of one row is 8 packed words (formats/int4.py: word j holds K 4j..4j+3 in its low nibbles and
  32+4j..32+4j+3 in its high ones). Every tensor of the K loop is a [BN, 8] tile in the mma accumulator layout, in
  which thread (g, q) of a warp owns elements (g, 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1): for the weights that is
  words 2q and 2q+1 of rows g and g+8 — one 8-byte load per row — and, unpacked (low nibbles, then high), exactly
  the A fragment of two k32 MMAs once the words are read as K positions: word 2q ↔ k 4q..4q+3, word 2q+1 ↔
  k 16+4q..16+4q+3. A dot product does not care which K position is called which, as long as the token side
  agrees: the token tile loads token (16p + g)'s words 2q, 2q+1 the same way, and its registers are the B
  fragments of token tiles 2p (elements 0, 1) and 2p+1 (2, 3). ``_MMA_ASM`` issues the two MMAs of a block with
  those register orders (``inline_asm_elementwise`` with ``pack=4`` hands it one thread's four elements);
- operands as 16·nibble: a two's-complement nibble in a byte's upper half is the signed byte 16·q, so the high
  nibbles are one AND and the low ones a shift and an AND (``_unpack16``, no sign fix-up); the MMA sums 256·Σ q_w·q_x
  exactly, |·| ≤ 2^20;
- no int → float conversion: the MMA's accumulator starts at MAGIC = 0x4B400000 (the float 1.5·2^23), so the int32
  result read as a float is 1.5·2^23 + 256·Σ exactly; ``_rescale`` takes the offset out with one fma against
  −1.5·2^23·xs (exact in fp32 for a 16-bit xs) and multiplies by ws: acc += ws[g, n] · xs[g, m] · 256·Σ, two FFMAs
  per element (G = 128: two blocks per group, each rescaled); the 1/256 in the epilogue;
- ``rt`` row tiles per warp (``SkinnyConfig.rt``) share the warp's token registers and their unpack, and give the
  warp rt× the weight bytes in flight per round (tile t = rows n0 + t·16·rw + …);
- K in chunks of ``kb`` blocks: chunk c + 1's weights, token words and scales are loaded (back to back, so a
  row's 32·kb bytes are requested together) before chunk c's arithmetic; the weights and their scales of the first
  chunk before ``griddepcontrol.wait`` (they do not come from act_quant);
- a program's warps may split K (``SkinnyConfig.ks``): tile row r is weight row r % (16·rw) of K part r // (16·rw),
  chunk c belongs to part c % ks, so the warps read adjacent chunks of the same rows at once; with few weight rows
  (N = 4096: 256 programs of one m16 tile) that is where the parallelism comes from. The parts meet once, in
  shared memory, after the loop;
- epilogue (blocked layout): × col_scale[n], + Σ_r lora_up[n, r]·s[m, r] in fp32 FMAs (s rounded to lora_up's
  dtype like the unfused reference), + bias[n], masked store of the transposed tile.

One program per (16·rw·rt rows, 16 tokens — 8 when M ≤ 8), tokens fastest (a second token block's read of the rows
hits L2). ``block_t`` = 32 / 64 (session 10, opt-in) gives a program two / four 16-token groups that share one load
and unpack of the weights; ``load16`` (same) reads 16-byte runs of a two-block pair per row (``_mma16_asm``). Both
were measured in session 11 and route nowhere: block_t was never faster, load16 took 17 % off the skinny GEMM at
N = 28672 but stayed behind the decode kernel there (NOTES.md, session 11). No atomics, fixed reduction order:
deterministic. The kernel needs the GPU (inline ``mma.sync``); the CPU suite compiles it for sm_90 and checks its
PTX and the asm's operand order (emulated), the GPU suite checks its numbers against the float64 reference.

Measured on the H200 (benchmarks/NOTES.md, sessions 8–9; ~69 SASS instructions per 16 rows × 64 K at M = 16 with
rt = 2, 147 before session 9): a win with few weight rows (K = N = 4096, M = 16: 13.8 µs vs the decode kernel's 22.7,
cuBLAS bf16 17.8; M = 32: 18.8 vs 34.7), a loss with many (N = 28672, M = 16: best config 42.4 µs vs 33.0 — L1-bound:
each 8-byte load touches 16 rows' cache lines). PDL is opt-in: behind act_quant an early-launched grid made the layer
~10 µs slower. Tried and removed: a cp.async ring in shared memory (Gluon puts a CTA barrier before every refill:
slower everywhere), e4m3 ``mma.sync`` on act_quant's e4m3 tokens (ptxas emulates it on sm_90 with F2FP + f16 HMMA).
"""

from __future__ import annotations


import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from .env import env_on, getenv, pinned_config
from .epilogue import rank_block
from .gluon.host import dummy
from .launch import launch
from .pdl import gl_gdc_launch_dependents, gl_gdc_wait, pdl_enabled
from .schedule import cdiv

__all__ = ["launch_w4a4_skinny", "w4a4_skinny_kernel", "skinny_args", "SkinnyConfig", "DEFAULT_CONFIG",
           "MANY_TOKENS_CONFIG", "WIDE_BATCH_CONFIG",
           "AUTO_SKINNY_M", "AUTO_SKINNY_MAX_N", "skinny_enabled", "skinny_config", "aot_signature_skinny"]

# impl="auto" routes int4_g64 with M in AUTO_SKINNY_M and N < AUTO_SKINNY_MAX_N here (w4a4_gemm._route). H200, same
# process, graph µs (probes/s9/final): K = N = 4096, M = 3 / 4 / 8 / 16 / 24 / 32, GEMM alone with the defaults below:
# 10.4 / 10.5 / 11.4 / 13.8 / 18.6 / 18.8 vs the GEMV's 13.9 / 16.8 / — (M ≤ 2 stays there: 8.0 / 11.0 vs 10.1 /
# 10.2), the decode kernel's 21.8 / 22.1 / 22.2 / 22.7 / 35.3 / 34.7, cuBLAS bf16 17.6 / 17.8 / 17.6 / 17.8 / 18.0 /
# 18.1; K = 14336, N = 4096, M = 4 / 16 / 32: 22.0 / 27.3 / 36.3 vs GEMV 34.1, decode 55.9 / 58.2 / 98.3, cuBLAS 37.9 /
# 38.2 / 38.9. N = 28672 keeps the decode kernel (M = 4 / 16: best skinny configs 33.8 / 42.4 vs 31.8 / 33.0) — the
# skinny kernel is L1-bound there (ncu, probes/s9/skinny_rt: L1/TEX 79 % busy, DRAM 23 %: every 8-byte load touches
# 16 rows' cache lines, and the scale loads are 2-byte gathers).
# M = 33–64 (probes/s10/skinny_midm, layer µs, N = 4096): v2 (the old route) 91 / 33.4 / 33.3 at K = 4096, M = 33 /
# 48 / 64, and 297 / 97 / 96 at K = 14336, against the skinny GEMM alone at WIDE_BATCH_CONFIG 21.6 / 21.7 / 21.9 and
# 52.7 / 53.3 / 53.7 (cuBLAS bf16 14.5 / 15.3 / 13.3 and 35.2 / 35.7 / 37.5: a loss to bf16 there either way).
AUTO_SKINNY_M = (3, 64)
AUTO_SKINNY_MAX_N = 12288

# Two k32 MMAs of one 64-block for one 8-token tile: A = the weights' low / high nibbles ($4..$7 / $8..$11, thread
# elements (g,2q), (g,2q+1), (g+8,2q), (g+8,2q+1) → fragment order a0 = (g, k 4q..), a1 = (g+8, k 4q..),
# a2 = (g, k 16+4q..), a3 = (g+8, k 16+4q..)), B = the tokens' low / high nibbles ($12..$15 / $16..$19: elements
# 0, 1 are token tile 0's b0, b1; 2, 3 tile 1's). Every operand byte is 16·nibble (:func:`_unpack16`), so the sum is
# 256·Σ q_w·q_x, and the accumulator starts at MAGIC = 0x4B400000, the bits of the float 1.5·2^23: with
# |256·Σ| ≤ 256·64·64 = 2^20 < 2^22 the int32 result read as a float is exactly 1.5·2^23 + 256·Σ — no I2F (a
# quarter-rate pipe), the offset leaves in the rescale's fma (:func:`_rescale`).
MAGIC_FLOAT = 12582912.0                   # the float whose bits are 0x4B400000
MAGIC_F = gl.constexpr(MAGIC_FLOAT)
_MMA_HEAD = """{
.reg .b32 c, d0, d1, d2, d3;
mov.b32 c, 0x4B400000;
"""
_MMA_TILE = ("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {{d0, d1, d2, d3}}, {{$4, $6, $5, $7}}, "
             "{{${x0}, ${x1}}}, {{c, c, c, c}};\n"
             "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {{$0, $1, $2, $3}}, {{$8, $10, $9, $11}}, "
             "{{${x2}, ${x3}}}, {{d0, d1, d2, d3}};\n}}")
_MMA_ASM_T0 = gl.constexpr(_MMA_HEAD + _MMA_TILE.format(x0=12, x1=13, x2=16, x3=17))
_MMA_ASM_T1 = gl.constexpr(_MMA_HEAD + _MMA_TILE.format(x0=14, x1=15, x2=18, x3=19))
_MMA_CONSTRAINTS = gl.constexpr("=r,=r,=r,=r," + ",".join(["r"] * 16))


@gluon.jit
def _mma_partial(wlo, whi, xlo, xhi, ASM: gl.constexpr, CONSTRAINTS: gl.constexpr):
    d = gl.inline_asm_elementwise(ASM, CONSTRAINTS, [wlo, whi, xlo, xhi], dtype=gl.int32, is_pure=True, pack=4)
    return d.to(gl.float32, bitcast=True)


@gluon.jit
def _block_partial(wlo, whi, xlo, xhi, TILE: gl.constexpr, L16: gl.constexpr = False):
    """[BN, 8] fp32: MAGIC_F + 256 · Σ over the 64-block of q_w[row] · q_x[token] for token tile TILE (0 or 1) of the
    16, as the bits of the int32 MMA result. L16: the same over one scale group of a two-block pair (int64 runs, the
    other group's token bytes zeroed in ``xlo`` / ``xhi``; ``_mma16_asm``)."""
    if L16:
        if TILE == 0:
            d = _mma_partial(wlo, whi, xlo, xhi, _MMA16_ASM_T0, _MMA16_CONSTRAINTS)
        else:
            d = _mma_partial(wlo, whi, xlo, xhi, _MMA16_ASM_T1, _MMA16_CONSTRAINTS)
    else:
        if TILE == 0:
            d = _mma_partial(wlo, whi, xlo, xhi, _MMA_ASM_T0, _MMA_CONSTRAINTS)
        else:
            d = _mma_partial(wlo, whi, xlo, xhi, _MMA_ASM_T1, _MMA_CONSTRAINTS)
    return d


@gluon.jit
def _unpack16(words):
    """Packed int32 words → (low nibbles, high nibbles) · 16 as four signed bytes each: a two's-complement nibble in
    a byte's upper half is the signed byte 16·q, so the high nibbles need one AND and the low ones a shift and an
    AND (the signed unpack to q itself takes three more ops per four)."""
    u = words.to(gl.uint32, bitcast=True)
    return ((u << 4) & 0xF0F0F0F0).to(gl.int32, bitcast=True), (u & 0xF0F0F0F0).to(gl.int32, bitcast=True)


# 16-byte loads (``load16``, opt-in, session 10; measured in session 11: N = 28672, M = 16 best config 41.4 vs 49.6 µs
# without it, the decode GEMM 29.3 — so not routed): the
# tiles hold int64 elements, so a thread's two elements of a row are 16 contiguous bytes — words 4q..4q+3 of a
# two-block pair (one LDG.128 per row instead of two 8-byte loads of 16 rows' lines each; session 9's ncu had the
# 8-byte K loop L1-bound at N = 28672). Word i of thread q's run is the A operand of MMA i: its low nibbles k 4q..,
# its high nibbles k 16+4q.. (the token side the same). One MMA then sums words i, 4+i (block 0) and 8+i, 12+i
# (block 1) — two scale groups — so each group gets its own four MMAs, the token operand zeroed on the other
# group's threads (q < 2 hold block 0): twice the MMAs, which are not the limit.
def _mma16_asm(tile: int) -> str:
    x_lo, x_hi = 12 + 2 * tile, 16 + 2 * tile          # token elements 2·tile, 2·tile + 1 (token g / g + 8)
    body = ["{", ".reg .b32 c, d0, d1, d2, d3, la<4>, lb<4>, ha<4>, hb<4>, xa<2>, xb<2>, ya<2>, yb<2>;",
            "mov.b32 c, 0x4B400000;"]
    for e in range(4):       # weight element e: row g (e < 2) or g + 8, words 2·(e % 2), 2·(e % 2) + 1 of the run
        body += [f"mov.b64 {{la{e}, lb{e}}}, ${4 + e};", f"mov.b64 {{ha{e}, hb{e}}}, ${8 + e};"]
    for e in range(2):
        body += [f"mov.b64 {{xa{e}, xb{e}}}, ${x_lo + e};", f"mov.b64 {{ya{e}, yb{e}}}, ${x_hi + e};"]
    outs = ["d0, d1, d2, d3"] * 3 + ["$0, $1, $2, $3"]
    for i in range(4):       # word i of the run: element i // 2 (row g) / 2 + i // 2 (row g + 8), half i % 2
        h, e = "ab"[i % 2], i // 2
        c = "c, c, c, c" if i == 0 else "d0, d1, d2, d3"
        body.append(f"mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {{{outs[i]}}}, "
                    f"{{l{h}{e}, l{h}{e + 2}, h{h}{e}, h{h}{e + 2}}}, {{x{h}{e}, y{h}{e}}}, {{{c}}};")
    body.append("}")
    return "\n".join(body)


_MMA16_ASM_T0 = gl.constexpr(_mma16_asm(0))
_MMA16_ASM_T1 = gl.constexpr(_mma16_asm(1))
_MMA16_CONSTRAINTS = gl.constexpr("=r,=r,=r,=r," + ",".join(["l"] * 16))
_NIBBLE_HI64 = gl.constexpr(-0x0F0F0F0F0F0F0F10)        # the int64 whose bytes are all 0xF0


@gluon.jit
def _unpack16_64(v):
    """_unpack16 on int64 elements (two words each)."""
    return (v << 4) & _NIBBLE_HI64, v & _NIBBLE_HI64


@gluon.jit
def _load_weights16(w_ptrs, ws_ptrs, ch, N, tile_words, KB: gl.constexpr, RT: gl.constexpr, ROWS: gl.constexpr):
    """Chunk ``ch`` of two-block pairs: per pair, per row tile, the [BN, 8] int64 run and both groups' scales."""
    out = ()
    for j in gl.static_range(KB):
        b = ch * KB + j
        tiles = ()
        for t in gl.static_range(RT):
            sp = ws_ptrs + (2 * b) * N + t * ROWS
            tiles = tiles + ((gl.load(w_ptrs + t * tile_words + b * 8), gl.load(sp), gl.load(sp + N)), )
        out = out + (tiles, )
    return out


@gluon.jit
def _load_tokens16(x_ptrs, xs_ptrs, ch, tok_oks, tok_ok_cols, M, group_words, KB: gl.constexpr,
                   TG: gl.constexpr):
    """Per pair, per 16-token group: the [BN, 8] int64 token run and the scales (group 0 tile a, tile b, group 1 tile
    a, tile b)."""
    out = ()
    for j in gl.static_range(KB):
        b = ch * KB + j
        groups = ()
        for u in gl.static_range(TG):
            x = gl.load(x_ptrs + u * group_words + b * 8, mask=tok_oks[u][:, None], other=0)
            sp = xs_ptrs + (2 * b) * M + 16 * u
            ma = tok_ok_cols[2 * u]
            mb = tok_ok_cols[2 * u + 1]
            sc = (gl.load(sp, mask=ma, other=0.0), gl.load(sp + 8, mask=mb, other=0.0),
                  gl.load(sp + M, mask=ma, other=0.0), gl.load(sp + M + 8, mask=mb, other=0.0))
            groups = groups + ((x, sc), )
        out = out + (groups, )
    return out


@gluon.jit
def _kloop16(acc, w_ptrs, ws_ptrs, x_ptrs, xs_ptrs, n_chunks, N, M, tile_words, group_words, tok_oks, tok_ok_cols,
             keep0, keep1, KB: gl.constexpr, RT: gl.constexpr, ROWS: gl.constexpr, TG: gl.constexpr,
             NT: gl.constexpr, NTG: gl.constexpr, PDL: gl.constexpr):
    """The K loop with 16-byte loads (KS = 1, whole row tiles and chunks): chunks of KB pairs, the next in flight."""
    cur_w = _load_weights16(w_ptrs, ws_ptrs, 0, N, tile_words, KB, RT, ROWS)
    if PDL:
        gl_gdc_wait()
    cur_x = _load_tokens16(x_ptrs, xs_ptrs, 0, tok_oks, tok_ok_cols, M, group_words, KB, TG)
    for i in range(0, n_chunks):
        nxt = gl.minimum(i + 1, n_chunks - 1)
        nxt_w = _load_weights16(w_ptrs, ws_ptrs, nxt, N, tile_words, KB, RT, ROWS)
        nxt_x = _load_tokens16(x_ptrs, xs_ptrs, nxt, tok_oks, tok_ok_cols, M, group_words, KB, TG)
        for j in gl.static_range(KB):
            toks = ()
            for u in gl.static_range(TG):
                x, sc = cur_x[j][u]
                xlo, xhi = _unpack16_64(x)
                tiles = ()
                for h in gl.static_range(NTG):
                    s0 = sc[h].to(gl.float32)[None, :]
                    s1 = sc[2 + h].to(gl.float32)[None, :]
                    tiles = tiles + ((s0, s0 * (-MAGIC_F), s1, s1 * (-MAGIC_F)), )
                toks = toks + ((xlo & keep0, xhi & keep0, xlo & keep1, xhi & keep1, tiles), )
            new = ()
            for t in gl.static_range(RT):
                w, ws0, ws1 = cur_w[j][t]
                wlo, whi = _unpack16_64(w)
                for u in gl.static_range(TG):
                    lo0, hi0, lo1, hi1, tiles = toks[u]
                    for h in gl.static_range(NTG):
                        s0, c0, s1, c1 = tiles[h]
                        a = _rescale(acc[t * NT + 2 * u + h], _block_partial(wlo, whi, lo0, hi0, h, True), ws0,
                                     s0, c0)
                        new = new + (_rescale(a, _block_partial(wlo, whi, lo1, hi1, h, True), ws1, s1, c1), )
            acc = new
        cur_w = nxt_w
        cur_x = nxt_x
    return acc


@gluon.jit
def _rowcol(off, KS: gl.constexpr):
    """A chunk's word offset as an addend of a [BN, 8] pointer tile: a scalar when every warp reads the same chunk
    (KS = 1), else one offset per tile row (its K part's chunk)."""
    if KS == 1:
        return off
    else:
        return off[:, None]


@gluon.jit
def _load_weights(w_ptrs, ws_ptrs, ch, n_blocks, row_ok, N, tile_words, WPG: gl.constexpr, KB: gl.constexpr,
                  KS: gl.constexpr, RT: gl.constexpr, ROWS: gl.constexpr, EVEN: gl.constexpr):
    """Chunk ``ch`` (a scalar, or per tile row when the warps split K): per block, per row tile t (``tile_words``
    apart, ``row_ok[t]``) the weight words [BN, 8] and weight scales [BN]. The loads go out back to back, so a row's
    32·KB bytes are requested together. EVEN: whole row tiles and chunks (the caller never asks past the end), so
    they load unmasked."""
    out = ()
    for j in gl.static_range(KB):
        b = ch * KB + j
        g = b * 8 // WPG
        tiles = ()
        for t in gl.static_range(RT):
            wp = w_ptrs + t * tile_words
            sp = ws_ptrs + g * N + t * ROWS
            if EVEN:
                tiles = tiles + ((gl.load(wp + _rowcol(b * 8, KS)), gl.load(sp)), )
            else:
                live = b < n_blocks
                ok = row_ok[t]
                w = gl.load(wp + _rowcol(b * 8, KS), mask=(ok & live)[:, None] if KS > 1 else (ok[:, None] & live),
                            other=0)
                tiles = tiles + ((w, gl.load(sp, mask=ok & live, other=0.0)), )
        out = out + (tiles, )
    return out


@gluon.jit
def _load_tokens(x_ptrs, xs_ptrs, ch, n_blocks, tok_oks, tok_ok_cols, M, group_words, WPG: gl.constexpr,
                 KB: gl.constexpr, KS: gl.constexpr, TG: gl.constexpr, EVEN: gl.constexpr):
    """The same chunk's per block, per 16-token group u (``group_words`` apart, rows ``tok_oks[u]``): the token
    words [BN, 8] and — KS = 1 — the token scales [8], [8] of its two 8-token tiles (``tok_ok_cols[2u]``,
    ``[2u + 1]``)."""
    out = ()
    for j in gl.static_range(KB):
        b = ch * KB + j
        g = b * 8 // WPG
        if EVEN:
            live = True
        else:
            live = b < n_blocks
        groups = ()
        for u in gl.static_range(TG):
            x = gl.load(x_ptrs + u * group_words + _rowcol(b * 8, KS), mask=(tok_oks[u] & live)[:, None], other=0)
            if KS == 1:
                sp = xs_ptrs + g * M + 16 * u
                # masked past the last block too: a block there has zero partials, but 0 · (a NaN read past
                # x_scale's end) is NaN
                sc = (gl.load(sp, mask=tok_ok_cols[2 * u] & live, other=0.0),
                      gl.load(sp + 8, mask=tok_ok_cols[2 * u + 1] & live, other=0.0))
            else:
                sc = (0, 0)
            groups = groups + ((x, sc), )
        out = out + (groups, )
    return out


@gluon.jit
def _load_xs_rows(xs_ptrs, ch, n_blocks, tok_ok_t, M, WPG: gl.constexpr, KB: gl.constexpr):
    """KS > 1: the chunks' token scales [BN, 8] of one 8-token tile, a group per tile row (its K part's); loaded for
    the round being computed, not a round ahead (L2-resident; a round ahead doubled the ring's registers)."""
    out = ()
    for j in gl.static_range(KB):
        b = ch * KB + j
        g = (b * 8 // WPG) * M
        out = out + (gl.load(xs_ptrs[None, :] + g[:, None], mask=(b < n_blocks)[:, None] & tok_ok_t[None, :],
                             other=0.0), )
    return out


@gluon.jit
def _rescale(acc, part, ws, xs, xc):
    """acc + ws·xs·256·Σ: ``part`` is MAGIC_F + 256·Σ (exact) and ``xc`` = −MAGIC_F·xs, itself exact in fp32 for a
    16-bit ``xs`` (3·xs has at most 13 significant bits), so the fma rounds once, as xs·256·Σ would. The 256 leaves
    in the epilogue (an exact power of two)."""
    return acc + ws.to(gl.float32)[:, None] * gl.fma(part, xs, xc)


@gluon.jit
def _reduce_parts(acc, red, ROWS: gl.constexpr, KS: gl.constexpr, LE: gl.constexpr):
    """Σ over the KS K parts (row slices of ``acc``) → [ROWS, 8] in LE, through shared memory."""
    gl.thread_barrier()              # the previous tile's reads of ``red`` are done
    red.store(acc)
    gl.thread_barrier()
    tot = red.slice(0, ROWS, dim=0).load(LE)
    for p in gl.static_range(1, KS):
        tot = tot + red.slice(p * ROWS, ROWS, dim=0).load(LE)
    return tot


@gluon.jit
def _finish(acc, tok0, n0, N, M, R, s_ptr, stride_sm, up_ptr, stride_un, bias_ptr, cs_ptr, y_ptr, stride_ym,
            LE: gl.constexpr, BLOCK_R: gl.constexpr, HAS_LOWRANK: gl.constexpr, HAS_COL_SCALE: gl.constexpr,
            HAS_BIAS: gl.constexpr, EPI_MMA: gl.constexpr = False):
    """y[tok0 + j, rows] = acc[:, j] · col_scale + Σ_r up[rows, r]·s[tok0 + j, r] + bias for an 8-token tile (s
    rounded to lora_up's dtype like an unfused s @ B.T). EPI_MMA: the rank term as 16-bit mma.sync (m16n8k16) on
    the tile, both operands loaded as 2-D tiles straight into their fragment layouts, instead of a loop over the
    rank with one scalar load pair per column (session 32, static sm_90 SASS: a quarter of a warp's instructions)."""
    rows = n0 + gl.arange(0, acc.shape[0], gl.SliceLayout(1, LE))
    row_ok = rows < N
    toks = tok0 + gl.arange(0, 8, gl.SliceLayout(0, LE))
    tok_ok = toks < M
    acc = acc * (1.0 / 256.0)          # the ·16 of both MMA operands (_unpack16)
    if HAS_COL_SCALE:
        acc = acc * gl.load(cs_ptr + rows, mask=row_ok, other=0.0).to(gl.float32)[:, None]
    if HAS_LOWRANK and EPI_MMA:
        NWE: gl.constexpr = gl.num_warps()
        ROWS: gl.constexpr = acc.shape[0]
        mma16: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NWE, 1], instr_shape=[16, 8])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma16, k_width=2)
        b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma16, k_width=2)
        ar = n0 + gl.arange(0, ROWS, gl.SliceLayout(1, a_l))
        ak = gl.arange(0, BLOCK_R, gl.SliceLayout(0, a_l))
        up = gl.load(up_ptr + ar[:, None] * stride_un + ak[None, :], mask=(ar < N)[:, None] & (ak < R)[None, :],
                     other=0.0)
        bk = gl.arange(0, BLOCK_R, gl.SliceLayout(1, b_l))
        bt = tok0 + gl.arange(0, 8, gl.SliceLayout(0, b_l))
        sv = gl.load(s_ptr + bt[None, :] * stride_sm + bk[:, None], mask=(bk < R)[:, None] & (bt < M)[None, :],
                     other=0.0)
        lr = mma_v2(up, sv.to(up_ptr.dtype.element_ty), gl.convert_layout(acc, mma16))
        acc = gl.convert_layout(lr, LE)
    elif HAS_LOWRANK:
        for r in gl.static_range(BLOCK_R):
            live = r < R
            up = gl.load(up_ptr + rows * stride_un + r, mask=row_ok & live, other=0.0).to(gl.float32)
            sv = gl.load(s_ptr + toks * stride_sm + r, mask=tok_ok & live, other=0.0)
            acc = acc + up[:, None] * sv.to(up_ptr.dtype.element_ty).to(gl.float32)[None, :]
    if HAS_BIAS:
        acc = acc + gl.load(bias_ptr + rows, mask=row_ok, other=0.0).to(gl.float32)[:, None]
    gl.store(y_ptr + toks[None, :] * stride_ym + rows[:, None], acc.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None] & tok_ok[None, :])


@gluon.jit(do_not_specialize=["M", "N", "K", "R"])
def w4a4_skinny_kernel(xq_ptr, xs_ptr, wq_ptr, ws_ptr, s_ptr, up_ptr, bias_ptr, cs_ptr, y_ptr,
                       M, N, K, R, stride_sm, stride_un, stride_ym,
                       G: gl.constexpr, BLOCK_T: gl.constexpr, RW: gl.constexpr, KB: gl.constexpr, RT: gl.constexpr,
                       EVEN: gl.constexpr, BLOCK_R: gl.constexpr, HAS_LOWRANK: gl.constexpr,
                       HAS_COL_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr, PDL: gl.constexpr,
                       L16: gl.constexpr = False, EPI_MMA: gl.constexpr = False):
    """xq int32 words [M, K/8], xs [K/G, M] (16-bit); wq int32 words [N, K/8], ws [K/G, N]; s fp32 [M, R],
    up [N, R]; y [M, N]. num_warps = RW · KS: RW m16 row slots per program, each read by KS warps that split K
    (chunk c goes to part c % KS, so a program's warps read adjacent chunks of the same rows at once); each warp
    holds RT row tiles that share its token registers (tile t = rows n0 + t·16·RW + …). Tile row r is weight row
    n0 + t·16·RW + r % (16·RW) of K part r // (16·RW), and token tok0 + 16·u + r % 16 of token group u.
    BLOCK_T ∈ {8, 16, 32, 64} tokens per program (⌈BLOCK_T / 16⌉ groups). EVEN: N a multiple of 16·RW·RT and the
    chunks a multiple of KS (no weight masks). L16: the 16-byte-load K loop (:func:`_kloop16`)."""
    WPG: gl.constexpr = G // 8
    NW: gl.constexpr = gl.num_warps()
    KS: gl.constexpr = NW // RW
    ROWS: gl.constexpr = 16 * RW
    BN: gl.constexpr = 16 * NW
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1], instr_shape=[16, 8])
    LROW: gl.constexpr = gl.SliceLayout(1, mma)
    LCOL: gl.constexpr = gl.SliceLayout(0, mma)
    LE: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [NW, 1], [1, 0])
    gl.static_assert(xs_ptr.dtype.element_ty.primitive_bitwidth == 16, "token scales must be 16-bit (see _rescale)")
    if PDL:
        gl_gdc_launch_dependents()
    pid = gl.program_id(0)
    n_tok_blocks = gl.cdiv(M, BLOCK_T)
    tok0 = (pid % n_tok_blocks) * BLOCK_T
    n0 = (pid // n_tok_blocks) * (ROWS * RT)
    if L16:
        # xq / wq as int64 elements (two words): 8 per two-block pair, the "block" of this path
        kw_total = gl.multiple_of(K // 16, 8)
    else:
        kw_total = gl.multiple_of(K // 8, 8)       # words per row: K % 64 == 0, so rows start 32-byte aligned
    n_blocks = kw_total // 8
    n_chunks = gl.cdiv(n_blocks, KB)
    r = gl.arange(0, BN, LROW)
    rows = n0 + r % ROWS
    if KS == 1:
        kpart = 0
    else:
        kpart = r // ROWS
    row_ok = ()
    for t in gl.static_range(RT):
        row_ok = row_ok + (rows + t * ROWS < N, )
    tile_words = kw_total.to(gl.int64) * ROWS
    col = gl.arange(0, 8, LCOL)
    w_ptrs = wq_ptr + (rows.to(gl.int64) * kw_total)[:, None] + col[None, :]
    ws_ptrs = ws_ptr + rows
    tok_r = tok0 + r % 16
    # TG 16-token groups per program (BLOCK_T = 32 / 64: the weights are unpacked once for all of them), NT 8-token
    # MMA tiles; accumulator of row tile t, token tile i: acc[t * NT + i]
    TG: gl.constexpr = (BLOCK_T + 15) // 16
    NT: gl.constexpr = BLOCK_T // 8
    NTG: gl.constexpr = 1 + (BLOCK_T > 8)       # 8-token tiles per group
    tok_oks = ()
    for u in gl.static_range(TG):
        tok_oks = tok_oks + ((tok_r + 16 * u < M) & (tok_r + 16 * u < tok0 + BLOCK_T), )
    x_ptrs = xq_ptr + (tok_r * kw_total)[:, None] + col[None, :]
    group_words = kw_total * 16
    tok_c = tok0 + col
    xs_ptrs = xs_ptr + tok_c
    tok_ok_cols = (tok_c < M, (tok_c + 8 < M) & (BLOCK_T > 8))
    for i in gl.static_range(2, NT):
        tok_ok_cols = tok_ok_cols + (tok_c + 8 * i < M, )
    acc = ()
    for t in gl.static_range(RT):
        for i in gl.static_range(NT):
            acc = acc + (gl.zeros([BN, 8], gl.float32, mma), )
    if L16:
        gl.static_assert(KS == 1 and EVEN, "16-byte loads: whole row tiles and chunks, K not split across warps")
        keep0 = gl.where(col < 4, -1, 0).to(gl.int64)[None, :]       # threads q < 2 hold block 0 of the pair
        keep1 = gl.where(col < 4, 0, -1).to(gl.int64)[None, :]
        acc = _kloop16(acc, w_ptrs, ws_ptrs, x_ptrs, xs_ptrs, n_chunks, N, M, tile_words, group_words, tok_oks,
                       tok_ok_cols, keep0, keep1, KB, RT, ROWS, TG, NT, NTG, PDL)
    else:
        # rounds of KS chunks (one per K part), the next round in flight while this one computes (EVEN: the last
        # round's "next" re-reads the last round, so nothing is read past the end)
        n_rounds = gl.cdiv(n_chunks, KS)
        # the weights and their scales do not come from act_quant: the first round's go out before
        # griddepcontrol.wait (PDL), the tokens' after it
        cur_w = _load_weights(w_ptrs, ws_ptrs, kpart, n_blocks, row_ok, N, tile_words, WPG, KB, KS, RT, ROWS, EVEN)
        if PDL:
            gl_gdc_wait()          # the token words, their scales and s come from act_quant
        cur_x = _load_tokens(x_ptrs, xs_ptrs, kpart, n_blocks, tok_oks, tok_ok_cols, M, group_words, WPG, KB, KS, TG,
                             EVEN)
        for i in range(0, n_rounds):
            ch = i * KS + kpart
            if EVEN:
                nxt_ch = gl.minimum(i + 1, n_rounds - 1) * KS + kpart
            else:
                nxt_ch = ch + KS
            nxt_w = _load_weights(w_ptrs, ws_ptrs, nxt_ch, n_blocks, row_ok, N, tile_words, WPG, KB, KS, RT, ROWS, EVEN)
            nxt_x = _load_tokens(x_ptrs, xs_ptrs, nxt_ch, n_blocks, tok_oks, tok_ok_cols, M, group_words, WPG, KB, KS,
                                 TG, EVEN)
            if KS > 1:
                xs_rows = ()
                for it in gl.static_range(NT):
                    xs_rows = xs_rows + (_load_xs_rows(xs_ptrs + 8 * it, ch, n_blocks, tok_ok_cols[it], M, WPG, KB), )
            for j in gl.static_range(KB):
                # the token side once per block, shared by the RT row tiles
                toks = ()
                for u in gl.static_range(TG):
                    x, sc = cur_x[j][u]
                    if KS > 1:
                        xa = xs_rows[2 * u][j]
                    else:
                        xa = sc[0][None, :]
                    xa = xa.to(gl.float32)
                    xlo, xhi = _unpack16(x)
                    tiles = ((xa, xa * (-MAGIC_F)), )
                    if BLOCK_T > 8:
                        if KS > 1:
                            xb = xs_rows[2 * u + 1][j]
                        else:
                            xb = sc[1][None, :]
                        xb = xb.to(gl.float32)
                        tiles = tiles + ((xb, xb * (-MAGIC_F)), )
                    toks = toks + ((xlo, xhi, tiles), )
                new = ()
                for t in gl.static_range(RT):
                    w, ws = cur_w[j][t]
                    wlo, whi = _unpack16(w)
                    for u in gl.static_range(TG):
                        xlo, xhi, tiles = toks[u]
                        for h in gl.static_range(NTG):
                            xv, xc = tiles[h]
                            new = new + (_rescale(acc[t * NT + 2 * u + h], _block_partial(wlo, whi, xlo, xhi, h), ws,
                                                  xv, xc), )
                acc = new
            cur_w = nxt_w
            cur_x = nxt_x
    red = gl.allocate_shared_memory(gl.float32, [BN, 8], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    for t in gl.static_range(RT):
        for it in gl.static_range(NT):
            _finish(_reduce_parts(acc[t * NT + it], red, ROWS, KS, LE), tok0 + 8 * it, n0 + t * ROWS, N, M, R, s_ptr,
                    stride_sm, up_ptr, stride_un, bias_ptr, cs_ptr, y_ptr, stride_ym, LE, BLOCK_R, HAS_LOWRANK,
                    HAS_COL_SCALE, HAS_BIAS, EPI_MMA)


class SkinnyConfig(tuple):
    """(rw, ks, kb[, rt]): rw m16 row slots per program, each read by ks warps that split K (num_warps = rw·ks), K in
    chunks of ``kb`` 64-blocks (the next round of chunks in flight while one computes), rt row tiles per warp sharing
    its token registers (16·rw·rt weight rows per program; default 1)."""

    def __new__(cls, rw: int, ks: int, kb: int, rt: int = 1):
        return super().__new__(cls, (rw, ks, kb, rt))

    rw = property(lambda s: s[0])
    ks = property(lambda s: s[1])
    kb = property(lambda s: s[2])
    rt = property(lambda s: s[3])
    num_warps = property(lambda s: s[0] * s[1])
    rows = property(lambda s: 16 * s[0] * s[3])


DEFAULT_CONFIG = SkinnyConfig(1, 4, 8)
# M > 16 (two or more 16-token programs per row block): two row tiles per warp share the token registers
MANY_TOKENS_CONFIG = SkinnyConfig(1, 4, 4, 2)
# M > 32: two row slots and half the K split. N = 4096, GEMM µs at M = 33 / 48 / 64 (probes/s10/skinny_midm), K = 4096:
# 21.6 / 21.7 / 21.9 against MANY_TOKENS_CONFIG's 26.5 / 24.9 / 28.8; K = 14336: 52.7 / 53.3 / 53.7 vs 55.8 / 57.2 /
# 59.2 ((1, 4, 4, 4): 51.8 / 53.1 / 54.5)
WIDE_BATCH_CONFIG = SkinnyConfig(2, 2, 4, 2)
CONFIG_ENV = "LOWRANK_GEMM_SKINNY_CONFIG"      # "rw,ks,kb[,rt]" (probes)
# Tokens per program: 8 up to M = 8, else 16. 32 / 64 (session 10) give a program TG = block_t / 16 token groups that
# share one unpack of the weights; never faster on the H200 (session 11: N = 4096, M = 48 / 64 at K = 4096 24.5 / 26.9
# vs 21.7 / 21.9 µs; 2–5× slower at N = 28672), so nothing routes there; LOWRANK_GEMM_SKINNY_BLOCK_T pins it.
BLOCK_TS = (8, 16, 32, 64)
BLOCK_T_ENV = "LOWRANK_GEMM_SKINNY_BLOCK_T"
LOAD16_ENV = "LOWRANK_GEMM_SKINNY_LOAD16"       # 1: the 16-byte-load K loop (opt-in, measured, not routed)
# the rank term as mma.sync in _finish (0: the per-rank loop). H200, session 34 (probe_decode_epi, same error against
# the reference): GEMM 12.6 → 11.3 µs (M=16, 4096²), 24.3 → 20.2 (M=64), 25.0 → 23.6 (M=16, K=14336), 9.4 → 9.2 (M=4)
EPI_MMA_ENV = "LOWRANK_GEMM_SKINNY_EPI_MMA"
EPI_MMA_DEFAULT = True


def _even(cfg: SkinnyConfig, n: int, k: int) -> bool:
    """Whole row tiles and rounds of chunks: the kernel's unmasked path (EVEN)."""
    n_blocks = k // 64
    return n % cfg.rows == 0 and n_blocks % cfg.kb == 0 and (n_blocks // cfg.kb) % cfg.ks == 0


def skinny_config(config: SkinnyConfig | None = None, m: int | None = None, n: int | None = None,
                  k: int | None = None) -> SkinnyConfig:
    """``config``, else env ``LOWRANK_GEMM_SKINNY_CONFIG``, else :data:`WIDE_BATCH_CONFIG` for M > 32,
    :data:`MANY_TOKENS_CONFIG` for M > 16, :data:`DEFAULT_CONFIG` below — with half the chunk when (N, K) would take
    the masked path (its extra registers spill at kb = 8)."""
    pinned = pinned_config(config, CONFIG_ENV, (3, 4), "rw,ks,kb[,rt]", SkinnyConfig)
    if pinned is not None:
        return pinned
    m = m or 1
    cfg = WIDE_BATCH_CONFIG if m > 32 else MANY_TOKENS_CONFIG if m > 16 else DEFAULT_CONFIG
    if n is not None and k is not None and not _even(cfg, n, k):
        cfg = SkinnyConfig(cfg.rw, cfg.ks, cfg.kb // 2, cfg.rt)
    return cfg


def skinny_enabled() -> bool:
    """``LOWRANK_GEMM_SKINNY=0`` routes those M back to the decode kernel (instant fallback)."""
    return env_on("LOWRANK_GEMM_SKINNY")


def _expect(cond, msg):
    if not cond:                              # msg: a string or a callable building it (w4a4_gemm._expect)
        raise ValueError(f"w4a4 skinny: {msg() if callable(msg) else msg}")


def skinny_args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt: str = "int4_g64",
                group_size: int = 64, *, col_scale=None, config: SkinnyConfig | None = None, pdl=None,
                block_t: int | None = None, load16: bool | None = None, _dims: tuple | None = None,
                epi_mma: bool | None = None):
    """Validate (the launcher contract, ``w4a4_gemm.check_gemm_args``), plan, and build one launch:
    (grid, args, constexprs, config). ``load16``: the 16-byte-load K loop (G = 64, K not split across warps, whole
    row tiles and chunks of pairs) — True: required (an error where it cannot run); None: env
    ``LOWRANK_GEMM_SKINNY_LOAD16`` (default off), and only where it fits. ``epi_mma`` (None: env
    ``LOWRANK_GEMM_SKINNY_EPI_MMA``, else :data:`EPI_MMA_DEFAULT`): the rank term as mma.sync."""
    from .w4a4_gemm import check_packed_launch
    asked = load16
    M, N, K, r = check_packed_launch("skinny", x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out,
                                     fmt, group_size, col_scale, 16 if asked else 8, dims=_dims)
    dev = x_q.device
    cfg = skinny_config(config, M, N, K)
    fits16 = (group_size == 64 and cfg.ks == 1 and N % cfg.rows == 0 and K % (128 * cfg.kb) == 0
              and x_q.data_ptr() % 16 == 0 and w_q.data_ptr() % 16 == 0)
    if asked:
        _expect(fits16, lambda: f"16-byte loads need group_size 64, ks = 1, N a multiple of the {cfg.rows} rows per program "
                        f"and K of 128·kb = {128 * cfg.kb}; got group_size={group_size}, {cfg}, N={N}, K={K}")
    # the env knob (probes) applies where the path fits and leaves every other launch on the 8-byte loop
    load16 = fits16 and (asked if asked is not None else env_on(LOAD16_ENV, default=False))
    _expect(cfg.num_warps in (1, 2, 4, 8) and cfg.kb in (1, 2, 4, 8) and cfg.rt in (1, 2, 4),
            lambda: f"rw·ks (the warps) must be 1, 2, 4 or 8, kb 1, 2, 4 or 8 and rt 1, 2 or 4, got {cfg}")
    block_t = block_t or int(getenv(BLOCK_T_ENV, "0").strip() or 0) or (8 if M <= 8 else 16)
    _expect(block_t in BLOCK_TS, lambda: f"block_t must be one of {BLOCK_TS}, got {block_t}")
    # PDL is opt-in here (LOWRANK_GEMM_SKINNY_PDL=1, for A/B probes): behind act_quant an early-launched grid made
    # the layer slower, K = N = 4096, M = 4 / 8 / 16: 25.5 / 28.3 / 19.3 µs with it, 15.5 / 16.2 / 18.5 without
    # (GEMM alone 13.5 / 14.2 / 16.7; probes/s9/skinny_check)
    pdl = (pdl_enabled(dev) and env_on("LOWRANK_GEMM_SKINNY_PDL", default=False)) if pdl is None else bool(pdl)
    f32 = dummy(dev, torch.float32, (1, ))
    br = rank_block(r) if r else 16
    if r:
        _expect(lowrank_act.stride(1) == 1 and lora_up.stride(1) == 1, "lowrank_act / lora_up need unit column stride")
    word = torch.int64 if load16 else torch.int32
    args = (x_q.view(word), x_scale, w_q.view(word), w_scale,
            lowrank_act if r else f32, lora_up if r else dummy(dev, torch.bfloat16, (1, )),
            bias if bias is not None else f32, col_scale if col_scale is not None else f32, out,
            M, N, K, r, lowrank_act.stride(0) if r else 0, lora_up.stride(0) if r else 0, out.stride(0))
    even = _even(cfg, N, K)
    cx = dict(G=group_size, BLOCK_T=block_t, RW=cfg.rw, KB=cfg.kb, RT=cfg.rt, EVEN=even, BLOCK_R=br,
              HAS_LOWRANK=bool(r), HAS_COL_SCALE=col_scale is not None, HAS_BIAS=bias is not None, PDL=pdl,
              EPI_MMA=bool(r) and (env_on(EPI_MMA_ENV, default=EPI_MMA_DEFAULT) if epi_mma is None else bool(epi_mma)))
    if load16:
        cx.update(L16=True, EVEN=True)
    grid = (cdiv(N, cfg.rows) * cdiv(M, block_t), )
    return grid, args, cx, cfg


def launch_w4a4_skinny(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt: str = "int4_g64",
                       group_size: int = 64, *, col_scale=None, config: SkinnyConfig | None = None, pdl=None,
                       block_t: int | None = None, load16: bool | None = None, _dims: tuple | None = None,
                       epi_mma: bool | None = None):
    """out [M, N] ← the int4_g64 W4A4 GEMM + epilogue for a few tokens (launcher contract of kernels/w4a4_gemm.py).
    ``config``: :class:`SkinnyConfig` (None: env ``LOWRANK_GEMM_SKINNY_CONFIG``, else the default); ``pdl``
    (None = :func:`kernels.pdl.pdl_enabled`)."""
    _expect(x_q.device.type == "cuda", lambda: f"runs on CUDA only (inline mma.sync), got {x_q.device}")
    grid, args, cx, cfg = skinny_args(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt,
                                      group_size, col_scale=col_scale, config=config, pdl=pdl, block_t=block_t,
                                      load16=load16, _dims=_dims, epi_mma=epi_mma)
    launch(w4a4_skinny_kernel, grid, *args, **cx, num_warps=cfg.num_warps, launch_pdl=cx["PDL"])
    return out


def aot_signature_skinny(config: SkinnyConfig | None = None, *, M=12, N=160, K=512, rank=16, group_size=64,
                         bias=True, col_scale=True, pdl=True, block_t=None, load16=False, epi_mma=None):
    """(signature, constexprs, config) for ``kernels.aot.compile_sm90`` of :func:`w4a4_skinny_kernel`."""
    import inspect
    from triton.runtime.jit import mangle_type
    from .gluon.w4a4_ws import make_operands_v2
    ops = make_operands_v2("int4_g64", M, N, K, rank, group_size, device="cpu", bias=bias, col_scale=col_scale)
    _, args, cx, cfg = skinny_args(**ops, config=config, pdl=False, block_t=block_t, load16=load16, epi_mma=epi_mma)
    cx["PDL"] = bool(pdl)
    names = [n for n in inspect.signature(w4a4_skinny_kernel.fn).parameters if n not in cx]
    sig = {n: (mangle_type(a) if not isinstance(a, int) else "i32") for n, a in zip(names, args)}
    return sig, cx, cfg


def _smoke() -> int:
    """Small checked launches (compute-sanitizer runs this: ``SANITIZE_FMTS=skinny scripts/sanitize_gluon.sh``)."""
    from .gluon.w4a4_ws import make_operands_v2, reference_v2
    fails = 0
    for cfg in (DEFAULT_CONFIG, SkinnyConfig(1, 1, 1), SkinnyConfig(2, 2, 8), SkinnyConfig(4, 1, 2),
                SkinnyConfig(2, 1, 2, 2)):
        for m in (3, 9, 16, 21):
            ops = make_operands_v2("int4_g64", m, 200, 448, 5, 64, device="cuda", bias=True, col_scale=True)
            ref = reference_v2(ops)
            y = launch_w4a4_skinny(**ops, config=cfg)
            torch.cuda.synchronize()
            err = float((y.double().cpu() - ref).abs().max() / ref.abs().max())
            ok = bool(torch.isfinite(y).all()) and err < 1e-2
            fails += not ok
            print(f"{'OK' if ok else 'FAIL'} skinny {cfg} M={m}: err {err:.2e}", flush=True)
    for cfg, bt, load16 in ((SkinnyConfig(1, 4, 2), 32, False), (SkinnyConfig(2, 2, 2), 64, False),
                            (SkinnyConfig(4, 1, 2, 2), None, True), (SkinnyConfig(2, 1, 1, 2), 32, True)):
        for m in (5, 21, 40):
            ops = make_operands_v2("int4_g64", m, 256, 1024, 5, 64, device="cuda", bias=True, col_scale=True)
            ref = reference_v2(ops)
            y = launch_w4a4_skinny(**ops, config=cfg, block_t=bt, load16=load16)
            torch.cuda.synchronize()
            err = float((y.double().cpu() - ref).abs().max() / ref.abs().max())
            ok = bool(torch.isfinite(y).all()) and err < 1e-2
            fails += not ok
            print(f"{'OK' if ok else 'FAIL'} skinny {cfg} block_t={bt} load16={load16} M={m}: err {err:.2e}",
                  flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(_smoke())
