"""Int4/int8 formats: packing layout, exact round trips, quantization numerics, NaN/Inf rule, errors."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowrank_gemm.formats import (
    PACK_BLOCK,
    dequantize_int4,
    dequantize_rows_int8,
    pack_int4,
    quantize_act_int4,
    quantize_rows_int8,
    quantize_weight_int4,
    unpack_int4,
)


def _rand_q(shape, seed=0):
    return torch.randint(-8, 8, shape, dtype=torch.int8, generator=torch.Generator().manual_seed(seed))


def test_pack_layout_matches_the_kernel_contract():
    q = _rand_q((3, 2 * PACK_BLOCK))
    p = pack_int4(q)
    assert p.dtype == torch.uint8 and p.shape == (3, PACK_BLOCK)
    for b in range(2):
        for j in range(PACK_BLOCK // 2):
            byte = int(p[1, b * 32 + j])
            lo, hi = int(q[1, b * 64 + j]), int(q[1, b * 64 + 32 + j])
            assert byte & 0xF == lo & 0xF and byte >> 4 == hi & 0xF


@pytest.mark.parametrize("value", range(-8, 8))
def test_each_nibble_is_isolated(value):
    # "dirty" neighbours: every other element is -1 (all bits set), one element carries `value`
    for pos in (0, 31, 32, 63):
        q = torch.full((1, PACK_BLOCK), -1, dtype=torch.int8)
        q[0, pos] = value
        assert torch.equal(unpack_int4(pack_int4(q)), q)


@settings(max_examples=40, deadline=None)
@given(lead=st.lists(st.integers(0, 5), min_size=0, max_size=3), blocks=st.integers(0, 4), seed=st.integers(0, 99))
def test_pack_round_trip_any_shape(lead, blocks, seed):
    q = _rand_q((*lead, blocks * PACK_BLOCK), seed)
    p = pack_int4(q)
    assert p.shape == (*lead, blocks * PACK_BLOCK // 2)
    assert torch.equal(unpack_int4(p), q)


def test_unpack_pack_round_trip_all_bytes():
    p = torch.arange(256, dtype=torch.uint8).reshape(8, 32)
    assert torch.equal(pack_int4(unpack_int4(p)), p)


@pytest.mark.parametrize("bad, match", [
    (torch.zeros(2, 64, dtype=torch.int32), "int8"),
    (torch.zeros(2, 48, dtype=torch.int8), "multiple of 64"),
    (torch.full((1, 64), 8, dtype=torch.int8), r"\[-8, 7\]"),
    (torch.full((1, 64), -9, dtype=torch.int8), r"\[-8, 7\]"),
])
def test_pack_rejects(bad, match):
    with pytest.raises(ValueError, match=match):
        pack_int4(bad)


def test_unpack_rejects_wrong_dtype_and_width():
    with pytest.raises(ValueError, match="uint8"):
        unpack_int4(torch.zeros(2, 32, dtype=torch.int8))
    with pytest.raises(ValueError, match="multiple of 32"):
        unpack_int4(torch.zeros(2, 20, dtype=torch.uint8))


@pytest.mark.parametrize("group", [64, 128, 256])  # 256 = K: per-channel
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16])
def test_weight_quant_contract(group, scale_dtype):
    w = torch.randn(37, 256, generator=torch.Generator().manual_seed(1)) * 3
    q, s = quantize_weight_int4(w, group, scale_dtype)
    assert q.dtype == torch.int8 and q.shape == w.shape and s.shape == (256 // group, 37) and s.dtype == scale_dtype
    assert int(q.min()) >= -8 and int(q.max()) <= 7
    deq = dequantize_int4(q, s, group)
    # dequant is exactly q · scale16 (scale rounded before quantizing)
    expect = q.float().reshape(37, -1, group) * s.float().t().unsqueeze(-1)
    assert torch.equal(deq, expect.reshape(37, 256))
    # round to nearest: at most half a step off (clamping at +7 adds at most the scale rounding error)
    step = s.float().t().repeat_interleave(group, dim=1)
    assert ((deq - w).abs() <= 0.5 * step + w.abs() * 2**-7).all()


def test_zero_group_gets_unit_scale():
    w = torch.randn(4, 128)
    w[1, :64] = 0
    q, s = quantize_weight_int4(w, 64)
    assert s[0, 1] == 1 and (q[1, :64] == 0).all() and torch.isfinite(s.float()).all()


def test_activation_scales_are_per_token_group_major():
    x = torch.randn(5, 192)
    q, s = quantize_act_int4(x, 64)
    assert s.shape == (3, 5)
    assert torch.allclose(s[1, 2].float(), x[2, 64:128].abs().max() / 7, rtol=2**-8)


def test_nan_and_inf_rule():
    x = torch.randn(3, 128)
    x[0, 5] = float("nan")
    x[1, 70] = float("inf")
    x[2, 3] = float("-inf")
    q, s = quantize_act_int4(x, 64)
    assert torch.isnan(s[0, 0].float()) and torch.isposinf(s[1, 1].float()) and torch.isposinf(s[0, 2].float())
    assert (q[0, :64] == 0).all() and (q[1, 64:] == 0).all() and (q[2, :64] == 0).all()
    deq = dequantize_int4(q, s, 64)
    assert torch.isnan(deq[0, :64]).all() and torch.isnan(deq[1, 64:]).all()
    assert torch.isfinite(deq[0, 64:]).all() and torch.isfinite(deq[1, :64]).all()  # other groups untouched


def test_zero_size():
    q, s = quantize_act_int4(torch.randn(0, 128), 64)
    assert q.shape == (0, 128) and s.shape == (2, 0)
    assert dequantize_int4(q, s, 64).shape == (0, 128)
    assert pack_int4(q).shape == (0, 64)


def test_quant_rejects_bad_inputs():
    with pytest.raises(ValueError, match="multiple of group_size"):
        quantize_weight_int4(torch.randn(4, 96), 64)
    with pytest.raises(ValueError, match="float"):
        quantize_weight_int4(torch.ones(4, 64, dtype=torch.int32), 64)
    with pytest.raises(ValueError, match="scale_dtype"):
        quantize_weight_int4(torch.randn(4, 64), 64, torch.float32)
    with pytest.raises(ValueError, match="2-D"):
        quantize_act_int4(torch.randn(2, 3, 64), 64)


def test_int8_rows_round_trip():
    w = torch.randn(16, 100)
    q, s = quantize_rows_int8(w)
    assert q.dtype == torch.int8 and s.shape == (16,)
    deq = dequantize_rows_int8(q, s)
    assert ((deq - w).abs() <= 0.5 * s.float()[:, None] + w.abs() * 2**-7).all()
