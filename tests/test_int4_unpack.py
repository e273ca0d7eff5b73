"""SWAR int4 expansion (kernels/int4_unpack.py): the byte arithmetic, the plain path, the sm_90 PTX, and
on the GPU the inline-PTX path against the plain one."""

import numpy as np
import pytest
import torch

from lowrank_gemm.kernels import int4_unpack as iu

WORD = np.uint64(0xFFFFFFFF)


def _sext(n):
    return np.where(n >= 8, n - 16, n).astype(np.int64)


def _bytes(words):
    w = words.astype(np.uint64)
    return np.stack([((w >> np.uint64(8 * i)) & np.uint64(0xFF)) for i in range(4)], -1).astype(np.int64)


def _lo_mul_emul(p, u):
    """The _LO_MUL_ASM / _HI_MUL_ASM sequence on uint32 words (numpy, modulo 2^32)."""
    n = ((p & 0x0F0F0F0F) ^ 0x08080808).astype(np.uint64)
    n = (n * u) & WORD
    c = (np.uint64(0x80808080) - (u * np.uint64(0x08080808))) & WORD
    return (((n + c) & WORD) ^ np.uint64(0x80808080)) & WORD


def test_byte_arithmetic_exhaustive():
    """Every byte value in every position, every u ∈ [1, 15]: the SWAR formulas equal sign extension."""
    rng = np.random.default_rng(0)
    vals = np.arange(256, dtype=np.uint64)
    words = np.concatenate([vals * np.uint64(0x01010101),                       # one byte value everywhere
                            rng.integers(0, 2**32, 4096, dtype=np.uint64)])     # mixed bytes
    b = _bytes(words)
    lo_ref, hi_ref = _sext(b & 0xF), _sext(b >> 4)
    lo = _bytes((((words & np.uint64(0x0F0F0F0F)) ^ np.uint64(0x08080808)) + np.uint64(0x78787878)) ^ np.uint64(0x80808080))
    hi = _bytes(((((words >> np.uint64(4)) & np.uint64(0x0F0F0F0F)) ^ np.uint64(0x08080808)) + np.uint64(0x78787878))
                ^ np.uint64(0x80808080))
    as_int8 = lambda x: np.where(x >= 128, x - 256, x)  # noqa: E731
    np.testing.assert_array_equal(as_int8(lo), lo_ref)
    np.testing.assert_array_equal(as_int8(hi), hi_ref)
    for u in range(1, 16):
        uu = np.uint64(u)
        np.testing.assert_array_equal(as_int8(_bytes(_lo_mul_emul(words, uu))), lo_ref * u)
        np.testing.assert_array_equal(as_int8(_bytes(_lo_mul_emul(words >> np.uint64(4), uu))), hi_ref * u)


def _run(p, u, mul, swar, device):
    R, C = p.shape
    out = torch.full((R, 2 * C), -128, dtype=torch.int8, device=device)   # poisoned: -128 is never produced
    grid = ((R + 15) // 16, (C + 31) // 32)
    iu.expand_rows_kernel[grid](p, u, out, R, C, MUL=mul, SWAR=swar, BLOCK_R=16, BLOCK_C=32)
    return out


def _want(p, u, mul):
    q = p.to(torch.int16)
    lo = torch.where((q & 0xF) >= 8, (q & 0xF) - 16, q & 0xF)
    hi = torch.where((q >> 4) >= 8, (q >> 4) - 16, q >> 4)
    if mul:
        lo, hi = lo * u.to(torch.int16)[:, None], hi * u.to(torch.int16)[:, None]
    return torch.cat([lo, hi], 1).to(torch.int8)


@pytest.mark.parametrize("mul", [False, True])
def test_plain_path_interpreter(mul):
    g = torch.Generator().manual_seed(1)
    p = torch.randint(0, 256, (21, 37), dtype=torch.uint8, generator=g)    # ragged vs the 16×32 blocks
    u = torch.randint(1, 16, (21,), dtype=torch.uint8, generator=g)
    torch.testing.assert_close(_run(p, u, mul, False, "cpu"), _want(p, u, mul), rtol=0, atol=0)


@pytest.mark.parametrize("mul", [False, True])
def test_swar_ptx(mul):
    from lowrank_gemm.kernels.aot import compile_sm90
    sig = {"p_ptr": "*u8", "u_ptr": "*u8", "out_ptr": "*i8", "R": "i32", "C": "i32"}
    info = compile_sm90("lowrank_gemm.kernels.int4_unpack", "expand_rows_kernel", sig,
                        {"MUL": mul, "SWAR": True, "BLOCK_R": 16, "BLOCK_C": 32}, num_warps=4)
    assert info.has("lop3.b32", "0x78787878")
    assert "shr.s16" not in info.ptx, "no per-element shifts left"


@pytest.mark.gpu
@pytest.mark.parametrize("mul", [False, True])
def test_swar_matches_plain_gpu(mul):
    g = torch.Generator().manual_seed(2)
    p = torch.randint(0, 256, (300, 200), dtype=torch.uint8, generator=g).cuda()
    u = torch.randint(1, 16, (300,), dtype=torch.uint8, generator=g).cuda()
    want = _want(p.cpu(), u.cpu(), mul)
    torch.testing.assert_close(_run(p, u, mul, True, "cuda").cpu(), want, rtol=0, atol=0)
    torch.testing.assert_close(_run(p, u, mul, False, "cuda").cpu(), want, rtol=0, atol=0)


@pytest.mark.parametrize("fmt,variant", [("int4_g64", "standard"), ("int4_2l", "swap_ab")])
def test_v1_main_loops_use_swar(fmt, variant):
    """The v1 W4A4 loops unpack through these helpers: the compiled (non-interpreted) kernel has the SWAR
    sequence and none of the per-element 16-bit shifts Triton emitted before."""
    from lowrank_gemm.kernels.w4a4_gemm import aot_compile, plan_w4a4_full
    m = 4608 if variant == "standard" else 16
    plan = plan_w4a4_full(m, 4096, 4096, 32, fmt, 64, device="cpu")
    assert plan.variant == variant
    ptx = aot_compile(plan.config, fmt, 64, variant=variant).ptx
    assert "0x78787878" in ptx and "shr.s16" not in ptx
