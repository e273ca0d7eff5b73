"""act_quant kernel (interpreter on CPU): bit-identical to the torch quantizers of x/λ, S vs float64."""

import pytest
import torch

from lowrank_gemm.formats.int4 import pack_int4, quantize_act_int4
from lowrank_gemm.formats.int4_twolevel import quantize_act_2l
from lowrank_gemm.kernels.act_quant import act_quant


def _inputs(m, k, r, dtype=torch.float16):
    x = (torch.randn(m, k) * torch.exp(torch.randn(k) * 0.5)).to(dtype)
    smooth = (torch.rand(k) + 0.5).to(torch.bfloat16)
    down = torch.randn(r, k).to(torch.float16)
    return x, smooth, down


def _check_lowrank(s, x, smooth, down):
    ref = (x.double() / smooth.double()) @ down.double().T
    assert s.shape == ref.shape and s.dtype == torch.float32
    if ref.numel():
        assert ((s.double() - ref).norm() / ref.norm()).item() < 1e-5  # 3×TF32 ≈ fp32


@pytest.mark.parametrize("m,k,g,r", [(37, 192, 64, 16), (5, 256, 128, 23), (33, 128, 64, 0), (20, 256, 64, 64)])
def test_int4_g64_bit_identical(m, k, g, r):
    x, smooth, down = _inputs(m, k, r)
    x_q, x_scale, s = act_quant(x, smooth, down, g, "int4_g64")
    q_ref, sc_ref = quantize_act_int4(x.float() / smooth.float(), g)
    assert x_q.dtype == torch.uint8 and x_q.shape == (m, k // 2)
    assert torch.equal(x_q, pack_int4(q_ref))
    assert x_scale.dtype == torch.bfloat16 and torch.equal(x_scale, sc_ref)
    _check_lowrank(s, x, smooth, down)


def test_int4_g64_fp16_scales_bf16_input():
    x, smooth, down = _inputs(19, 128, 32, torch.bfloat16)
    x_q, x_scale, s = act_quant(x, smooth, down, 64, "int4_g64", torch.float16)
    q_ref, sc_ref = quantize_act_int4(x.float() / smooth.float(), 64, torch.float16)
    assert torch.equal(x_q, pack_int4(q_ref)) and torch.equal(x_scale, sc_ref)
    _check_lowrank(s, x, smooth, down)


@pytest.mark.parametrize("m,k,g,r", [(37, 192, 64, 32), (6, 256, 128, 23), (17, 128, 64, 0)])
def test_int4_2l_bit_identical(m, k, g, r):
    x, smooth, down = _inputs(m, k, r)
    x_q, t, s = act_quant(x, smooth, down, g, "int4_2l")
    e_ref, t_ref = quantize_act_2l(x.float() / smooth.float(), g)
    assert x_q.dtype == torch.int8 and torch.equal(x_q, e_ref)
    assert t.dtype == torch.float32 and torch.equal(t, t_ref)
    _check_lowrank(s, x, smooth, down)


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
def test_nan_inf_and_zero_groups(fmt):
    """NaN in a group → scale NaN, ±Inf → scale +Inf, q = 0 there (the torch quantizers' contract)."""
    x, smooth, down = _inputs(20, 128, 16)
    x[1, 5] = float("nan")
    x[2, 100] = float("inf")
    x[3, 64:] = 0
    x_q, x_scale, s = act_quant(x, smooth, down, 64, fmt)
    xs = x.float() / smooth.float()
    if fmt == "int4_g64":
        q_ref, sc_ref = quantize_act_int4(xs, 64)
        assert torch.equal(x_q, pack_int4(q_ref))
        assert torch.equal(x_scale.float().nan_to_num(7.0), sc_ref.float().nan_to_num(7.0))
        assert torch.isnan(x_scale[0, 1]) and torch.isinf(x_scale[1, 2]) and x_scale[1, 3] == 1
    else:
        e_ref, t_ref = quantize_act_2l(xs, 64)
        assert torch.equal(x_q, e_ref) and torch.equal(x_scale.nan_to_num(7.0), t_ref.nan_to_num(7.0))
        assert torch.isnan(x_scale[1]) and torch.isinf(x_scale[2])
    assert torch.isnan(s[1]).all() and torch.isfinite(s[4:]).all()


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("split,bm", [(1, 16), (3, 16), (64, 32)])
def test_k_split_matches_and_is_deterministic(fmt, split, bm):
    """K split over programs (decode path): same bits as the torch quantizer for any split; S partials
    summed in fixed order, so two calls agree bit for bit."""
    x, smooth, down = _inputs(5, 320, 24)
    x_q, x_scale, s = act_quant(x, smooth, down, 64, fmt, split=split, block_m=bm)
    xs = x.float() / smooth.float()
    if fmt == "int4_g64":
        q_ref, sc_ref = quantize_act_int4(xs, 64)
        assert torch.equal(x_q, pack_int4(q_ref)) and torch.equal(x_scale, sc_ref)
    else:
        e_ref, t_ref = quantize_act_2l(xs, 64)
        assert torch.equal(x_q, e_ref) and torch.equal(x_scale, t_ref)
    _check_lowrank(s, x, smooth, down)
    assert torch.equal(s, act_quant(x, smooth, down, 64, fmt, split=split, block_m=bm)[2])


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("g,bk,split,bm", [(64, 256, 1, 32), (64, 128, 2, 16), (128, 256, 1, 16)])
def test_wide_steps_bit_identical(fmt, g, bk, split, bm):
    """Large-M plan: several groups per step (block_k = 2–4 groups) must give the same bits."""
    x, smooth, down = _inputs(37, 512, 20)
    x[4, 70] = float("nan")
    x_q, x_scale, s = act_quant(x, smooth, down, g, fmt, split=split, block_m=bm, block_k=bk)
    xs = x.float() / smooth.float()
    if fmt == "int4_g64":
        q_ref, sc_ref = quantize_act_int4(xs, g)
        assert torch.equal(x_q, pack_int4(q_ref))
        assert torch.equal(x_scale.float().nan_to_num(7.0), sc_ref.float().nan_to_num(7.0))
    else:
        e_ref, t_ref = quantize_act_2l(xs, g)
        assert torch.equal(x_q, e_ref) and torch.equal(x_scale.nan_to_num(7.0), t_ref.nan_to_num(7.0))
    keep = torch.ones(37, dtype=torch.bool)
    keep[4] = False
    assert torch.isnan(s[4]).all()
    _check_lowrank(s[keep], x[keep], smooth, down)


def test_plan_large_m_uses_measured_tiles():
    # 64 rows × one group per step won the H200 probe at FLUX fc1 (wider steps were slower)
    from lowrank_gemm.kernels.act_quant import plan_act_quant
    p = plan_act_quant(4608, 3072, 64)
    assert (p.block_m, p.block_k, p.num_warps) == (64, 64, 4) and p.split * p.steps_per_slice >= 12
    assert plan_act_quant(4608, 3072, 64, block_k=128).block_k == 128
    assert plan_act_quant(1, 4096, 64).block_k == 64
    assert plan_act_quant(4608, 320, 64).block_k == 64  # 320 = 5 groups: only G divides it
