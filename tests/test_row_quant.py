"""The one-launch per-row fp8 quantizer (``kernels.row_quant.fp8_rows``) against its PyTorch spec, bit for bit:
random rows in every input dtype, ragged K on both the one-pass (row in registers) and the two-pass path, all-zero,
NaN and ±Inf rows, strided input, both fp8 formats; clear errors for what it does not take. GPU: the same at real
sizes (the W8A8 path's activations and an fp8 weight)."""

import pytest
import torch

from lowrank_gemm.kernels import row_quant as RQ
from lowrank_gemm.kernels.row_quant import fp8_rows, fp8_rows_torch


def _same(got, want):
    (q, s), (q0, s0) = got, want
    assert q.dtype == q0.dtype and q.shape == q0.shape and s.dtype == torch.float32 and s.shape == s0.shape
    assert torch.equal(s.view(torch.int32), s0.view(torch.int32))
    assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("K", [1, 37, 64, 1000])
def test_matches_spec_one_pass(dtype, K):
    x = (torch.randn(5, K) * torch.logspace(-3, 3, 5)[:, None]).to(dtype)
    _same(fp8_rows(x), fp8_rows_torch(x))


@pytest.mark.parametrize("fmt", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_matches_spec_two_pass(fmt, monkeypatch):
    monkeypatch.setattr(RQ, "_ONE_PASS_K", 512)          # the looped path without a 9000-wide row per program
    x = torch.randn(3, 4500).half() * 7
    x[1, 4499] = 300.0                                   # the row max in the last, partial block
    _same(fp8_rows(x, fmt), fp8_rows_torch(x, fmt))


def test_special_rows():
    x = torch.randn(5, 96).half()
    x[1] = 0
    x[2, 7] = float("nan")
    x[3, 50] = float("inf")
    x[4, 0] = -float("inf")
    q, s = fp8_rows(x)
    q0, s0 = fp8_rows_torch(x)
    assert torch.equal(s.view(torch.int32), s0.view(torch.int32)) and s[1] == 1 and s[2] == 1
    # rows 0 and 1 bit-identical; the NaN and Inf rows' products are NaN on both sides
    assert torch.equal(q[:2].view(torch.uint8), q0[:2].view(torch.uint8))
    for qq, ss in ((q, s), (q0, s0)):
        prod = (qq.float() * ss[:, None]) @ torch.ones(96)
        assert prod[2:].isnan().all() and not prod[:2].isnan().any()


def test_strided_input_and_range():
    base = torch.randn(6, 200).bfloat16()
    x = base[::2, 10:150]                                # row stride 400, not contiguous rows
    q, s = fp8_rows(x)
    _same((q, s), fp8_rows_torch(x))
    assert float(q.float().abs().amax(dim=1).min()) == 448.0   # every row reaches the format's max


def test_empty():
    for shape in ((0, 64), (3, 0)):
        q, s = fp8_rows(torch.randn(shape).half())
        assert q.shape == shape and s.shape == (shape[0],)


def test_bad_input():
    with pytest.raises(ValueError, match="2-D"):
        fp8_rows(torch.randn(2, 3, 4).half())
    with pytest.raises(ValueError, match="float8_e4m3fn or float8_e5m2"):
        fp8_rows(torch.randn(2, 4).half(), torch.float16)
    with pytest.raises(ValueError, match="reads float16"):
        fp8_rows(torch.randint(0, 5, (2, 4)))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 4096), (64, 4096), (4096, 4096), (333, 14336), (28672, 4096), (7, 20000)])
@pytest.mark.parametrize("fmt", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_gpu_matches_spec(shape, fmt):
    x = torch.randn(*shape, device="cuda").bfloat16() * 3
    x[0, -1] = 1000.0
    _same(fp8_rows(x, fmt), fp8_rows_torch(x, fmt))
    q, s = fp8_rows(x, fmt)
    q2, s2 = fp8_rows(x, fmt)
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)


@pytest.mark.parametrize("one_pass", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_two_terms_match_spec(one_pass, dtype, monkeypatch):
    """terms=2: the residual's codes on the row's own scale as rows M … 2M − 1, bit for bit; hi + lo hold x to ~2⁻⁸
    of its row max (one term: 2⁻⁴); the residual is at most half a step of the first term (≤ 16 of 448)."""
    if not one_pass:
        monkeypatch.setattr(RQ, "_ONE_PASS_K", 256)
    x = (torch.randn(4, 700) * torch.logspace(-2, 2, 4)[:, None]).to(dtype)
    x[2, 5] = 0
    q, s = fp8_rows(x, terms=2)
    assert q.shape == (8, 700) and s.shape == (4,)
    _same((q, s), fp8_rows_torch(x, terms=2))
    assert torch.equal(s, fp8_rows(x)[1]) and float(q[4:].float().abs().max()) <= 16
    approx = (q[:4].double() + q[4:].double()) * s[:, None].double()
    one = q[:4].double() * s[:, None].double()
    rowmax = x.double().abs().amax(dim=1, keepdim=True)
    assert float(((approx - x.double()).abs() / rowmax).max()) < 2 ** -8
    assert float(((one - x.double()).abs() / rowmax).max()) > 2 ** -7      # the second term is what does it
    with pytest.raises(ValueError, match="terms must be 1 or 2"):
        fp8_rows(x, terms=3)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 4096), (64, 4096), (333, 14336), (7, 20000)])
def test_gpu_two_terms_match_spec(shape):
    x = torch.randn(*shape, device="cuda").bfloat16() * 3
    _same(fp8_rows(x, terms=2), fp8_rows_torch(x, terms=2))
