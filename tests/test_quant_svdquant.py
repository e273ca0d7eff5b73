"""SVDQuant algorithm, SVDQLinear / W8A8Linear modules, configs and quantize_()."""


import pytest
import torch
from torch import nn

from lowrank_gemm.formats import dequantize_int4, quantize_act_int4, unpack_int4
from lowrank_gemm.nn.svdq import SVDQLinear, W8A8Linear, svdq_stored_bytes
from lowrank_gemm.quant import SVDQuantConfig, W8A8Config, config_from_dict, quantize_, scheme_config

K, N, M = 256, 192, 512


def _outlier_layer(seed=0):
    """A layer whose input has a few huge channels and whose weight has a strong low-rank part."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    x[:, [3, 50, 200]] *= 40
    w = torch.randn(N, K, generator=g) * 0.02 + (torch.randn(N, 8, generator=g) @ torch.randn(8, K, generator=g)) * 0.05
    w[:, 17] *= 20
    linear = nn.Linear(K, N)
    with torch.no_grad():
        linear.weight.copy_(w)
    return linear, x


def _rel_err(module, linear, x):
    with torch.no_grad():
        y = linear(x)
        return float((module(x) - y).norm() / y.norm())


@pytest.fixture(scope="module")
def layer():
    return _outlier_layer()


def _quantized(layer, **kw):
    linear, x = layer
    return SVDQLinear.from_linear(linear, SVDQuantConfig(**kw), x)


def test_error_falls_as_rank_grows(layer):
    errs = [_rel_err(_quantized(layer, rank=r, refit_iters=4), *layer) for r in (0, 8, 32, 64)]
    assert all(a > b for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < 0.5 * errs[0]


@pytest.mark.parametrize("rank", [0, 16])
def test_smoothing_never_worse_than_none_on_calibration(layer, rank):
    none = _rel_err(_quantized(layer, rank=rank, smooth=False, refit=False), *layer)
    smooth = _quantized(layer, rank=rank, refit=False)
    assert _rel_err(smooth, *layer) <= none * (1 + 1e-5)
    assert smooth.calib_error == pytest.approx(_rel_err(smooth, *layer), rel=1e-4)  # the module reproduces the search


def test_refit_never_worse_than_no_refit(layer):
    plain = _rel_err(_quantized(layer, rank=16, refit=False), *layer)
    refit = _rel_err(_quantized(layer, rank=16, refit_iters=6), *layer)
    assert refit <= plain * (1 + 1e-5)


def test_forward_matches_the_spec_in_float64(layer):
    """y = (deq(qa)·deq(qw)ᵀ) + (xs·downᵀ)·upᵀ + bias with xs = x / smooth, computed here independently."""
    mod = _quantized(layer, rank=16, refit_iters=2)
    x = layer[1][:33].double()
    xs = x / mod.smooth.double()
    qa, sa = quantize_act_int4(xs, 64)
    w = dequantize_int4(unpack_int4(mod.qweight), mod.wscales, 64).double()
    ref = dequantize_int4(qa, sa, 64).double() @ w.t() + (xs @ mod.lora_down.double().t()) @ mod.lora_up.double().t()
    ref = ref + mod.bias.double()
    assert torch.allclose(mod(x), ref, rtol=1e-10, atol=1e-10)
    y32 = mod(x.float())
    assert y32.dtype == torch.float32 and ((y32.double() - ref).norm() / ref.norm()) < 1e-5


def _plain_layer():
    g = torch.Generator().manual_seed(5)
    linear = nn.Linear(K, N)
    return linear, torch.randn(M, K, generator=g)


def test_forward_keeps_leading_dims_and_w4a16():
    linear, x = _plain_layer()
    mod = SVDQLinear.from_linear(linear, scheme_config("w4a16"), x)
    assert mod.act_bits == 16 and mod.rank == 0
    assert mod(x.reshape(4, -1, K)).shape == (4, M // 4, N)
    assert _rel_err(mod, linear, x) < 0.12  # 4-bit g64 weights alone


def test_append_lora_adds_the_branch(layer):
    linear, x = layer
    mod = _quantized(layer, rank=8, refit=False)
    before = mod(x)
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(4, K, generator=g) * 0.05, torch.randn(N, 4, generator=g) * 0.05
    mod.append_lora(a, b, scale=0.5)
    assert mod.rank == 12 and mod.lora_down.shape == (12, K) and mod.lora_up.shape == (N, 12)
    delta = 0.5 * (x @ a.t()) @ b.t()
    assert ((mod(x) - before - delta).norm() / delta.norm()) < 2e-2  # 16-bit factors
    with pytest.raises(ValueError, match="append_lora"):
        mod.append_lora(a[:, :10], b)


def test_stored_size_4096_rank32_under_30_percent_of_bf16():
    assert svdq_stored_bytes(4096, 4096, 32, 64) <= 0.30 * 4096 * 4096 * 2


def test_stored_bytes_matches_formula(layer):
    mod = _quantized(layer, rank=16, smooth=False, refit=False)
    assert mod.stored_bytes() == svdq_stored_bytes(N, K, 16, 64)
    mod128 = _quantized(layer, rank=0, smooth=False, group_size=128)
    assert mod128.stored_bytes() == svdq_stored_bytes(N, K, 0, 128)


def test_rank_too_large_rejected(layer):
    linear, x = layer
    with pytest.raises(ValueError, match="rank 200 exceeds"):
        SVDQLinear.from_linear(linear, SVDQuantConfig(rank=200), x)
    with pytest.raises(ValueError, match="rank 200 exceeds"):
        quantize_(nn.Sequential(linear), SVDQuantConfig(rank=200), [x], progress=False)


def test_nan_calibration_rejected_naming_the_layer():
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    x = torch.randn(8, 64)
    x[2, 5] = float("nan")
    with pytest.raises(ValueError, match="layer '0'.*NaN"):
        quantize_(model, SVDQuantConfig(rank=4), [x], progress=False)
    assert all(type(m) is nn.Linear for m in model)  # nothing converted


def test_unsupported_dtype_rejected():
    with pytest.raises(TypeError, match="dtype"):
        SVDQLinear.from_linear(nn.Linear(64, 8).double(), SVDQuantConfig(rank=0, smooth=False))


def test_k_not_multiple_of_group_is_skipped_with_warning():
    model = nn.Sequential(nn.Linear(128, 96), nn.Linear(96, 64), nn.Linear(64, 32))
    x = torch.randn(16, 128)
    with pytest.warns(UserWarning, match="skipping '1'"):
        summary = quantize_(model, SVDQuantConfig(rank=4), [x], progress=False)
    assert summary.converted == ["0", "2"] and list(summary.skipped) == ["1"]
    assert type(model[1]) is nn.Linear and isinstance(model[0], SVDQLinear)
    with pytest.warns(UserWarning, match="group_size=128"):
        summary = quantize_(nn.Sequential(nn.Linear(192, 8)), SVDQuantConfig(rank=0, smooth=False, group_size=128),
                            progress=False)
    assert list(summary.skipped) == ["0"]


def test_include_exclude_and_filter_fn():
    def make():
        return nn.ModuleDict({"attn": nn.ModuleDict({"q": nn.Linear(64, 64), "k": nn.Linear(64, 64)}),
                              "mlp": nn.Linear(64, 64)})

    cfg = SVDQuantConfig(rank=0, smooth=False, include=("attn.*",), exclude=("re:.*\\.k$",))
    assert quantize_(make(), cfg, progress=False).converted == ["attn.q"]
    summary = quantize_(make(), SVDQuantConfig(rank=0, smooth=False), progress=False,
                        filter_fn=lambda m, name: name != "mlp")
    assert summary.converted == ["attn.q", "attn.k"]


def test_smoothing_without_calibration_is_an_error():
    with pytest.raises(ValueError, match="calib_data"):
        quantize_(nn.Sequential(nn.Linear(64, 64)), SVDQuantConfig(rank=4), progress=False)


def test_w8a8_linear():
    linear, x = _plain_layer()
    model = nn.Sequential(linear)
    summary = quantize_(model, scheme_config("w8a8"), progress=False)
    assert isinstance(model[0], W8A8Linear) and summary.converted == ["0"]
    assert _rel_err(model[0], linear, x) < 0.02
    assert model[0].stored_bytes() == N * K + 2 * N


def test_config_round_trip_and_validation():
    cfg = SVDQuantConfig(rank=16, group_size=128, include=("a.*",), alpha_grid=(0.5,))
    assert config_from_dict(cfg.to_dict()) == cfg
    assert config_from_dict(W8A8Config().to_dict()) == W8A8Config()
    with pytest.raises(Exception):
        cfg.rank = 3  # frozen
    for bad in (dict(group_size=32), dict(rank=-1), dict(act_bits=6), dict(alpha_grid=(1.5,)),
                dict(scale_dtype="float32"), dict(version=99), dict(include="a.*")):
        with pytest.raises(ValueError):
            SVDQuantConfig(**bad)
    with pytest.raises(ValueError, match="unknown"):
        config_from_dict({"type": "SVDQuantConfig", "bogus": 1})
    assert scheme_config("w4a4_rtn") == SVDQuantConfig(rank=0, smooth=False, refit=False)


def test_forward_matches_lead_reference(layer):
    reference = pytest.importorskip("lowrank_gemm.reference")
    mod = _quantized(layer, rank=16, refit_iters=2)
    x = layer[1][:40].double()
    ref = reference.svdq_linear_ref(x, mod.qweight, mod.wscales, mod.smooth, mod.lora_down, mod.lora_up,
                                    mod.bias, mod.group_size)
    assert torch.allclose(mod(x), ref, rtol=1e-10, atol=1e-10)


# ---- the two-level weight format (weight_format="int4_2l") ----------------------------------------------------------

def test_two_level_layer_matches_the_spec_in_float64(layer):
    """An int4_2l layer stores fp32 row scales [N] and uint8 multipliers [K/G, N]; its reference forward equals
    ``reference.svdq_linear_ref(fmt="int4_2l")``, and that is the two-level spec computed here independently."""
    from lowrank_gemm import reference
    from lowrank_gemm.formats.int4_twolevel import dequantize_act_2l, dequantize_weight_2l, quantize_act_2l
    mod = _quantized(layer, rank=16, refit_iters=2, weight_format="int4_2l")
    assert mod.weight_format == "int4_2l" and "weight_format=int4_2l" in repr(mod)
    assert mod.wscales.dtype == torch.float32 and mod.wscales.shape == (N, )
    assert mod.wmul.dtype == torch.uint8 and mod.wmul.shape == (K // 64, N) and 1 <= mod.wmul.min() <= mod.wmul.max() <= 15
    x = layer[1][:37].double()
    xs = x / mod.smooth.double()
    w = dequantize_weight_2l(mod.qweight, mod.wmul, mod.wscales, 64).double()
    spec = (dequantize_act_2l(*quantize_act_2l(xs, 64)).double() @ w.t()
            + (xs @ mod.lora_down.double().t()) @ mod.lora_up.double().t() + mod.bias.double())
    ref = reference.svdq_linear_ref(x, mod.qweight, mod.wscales, mod.smooth, mod.lora_down, mod.lora_up, mod.bias,
                                    64, fmt="int4_2l", wmul=mod.wmul)
    assert torch.allclose(ref, spec, rtol=1e-12, atol=1e-12)
    assert torch.allclose(mod(x), ref, rtol=1e-10, atol=1e-10)
    assert mod.calib_error == pytest.approx(_rel_err(mod, *layer), rel=1e-4)   # the search scored this format
    assert mod.stored_bytes() == N * K // 2 + N * 4 + (K // 64) * N + K * 2 + 16 * (N + K) * 2
    assert mod.stored_bytes() == svdq_stored_bytes(N, K, 16, 64, weight_format="int4_2l")


def test_two_level_search_and_refit_score_their_own_format(layer):
    """The search runs the two-level quantizers: refit and smoothing never lose on calibration, as for int4_g64,
    and the layer is within reach of the standard format (the two-level scales cost some accuracy)."""
    plain = _rel_err(_quantized(layer, rank=16, smooth=False, refit=False, weight_format="int4_2l"), *layer)
    refit = _rel_err(_quantized(layer, rank=16, refit_iters=6, weight_format="int4_2l"), *layer)
    g64 = _rel_err(_quantized(layer, rank=16, refit_iters=6), *layer)
    assert refit <= plain * (1 + 1e-5)
    assert refit < 2 * g64, (refit, g64)


def test_two_level_bad_combinations_are_refused(layer):
    linear, x = layer
    for bad in (dict(group_size=128), dict(act_bits=8), dict(act_shift=0.171875), dict(group_size=0)):
        with pytest.raises(ValueError, match="int4_2l"):
            SVDQuantConfig(weight_format="int4_2l", **bad)
    with pytest.raises(ValueError, match="weight_format must be one of"):
        SVDQuantConfig(weight_format="int4_g128")
    with pytest.raises(ValueError, match="int4_2l layer takes"):
        SVDQLinear(K, N, 8, 64, act_bits=8, weight_format="int4_2l")
    mod = _quantized(layer, rank=8, refit=False, weight_format="int4_2l")
    mod.act_bits = 8                       # settable on a built layer, but not for this format
    with pytest.raises(ValueError, match="two-level format"):
        mod(x[:4])
    mod.act_bits = 16                      # W4A16 on two-level weights: the reference path
    assert mod(x[:4]).shape == (4, N)
    from lowrank_gemm import reference
    with pytest.raises(ValueError, match="wmul"):
        reference.svdq_linear_ref(x[:4], mod.qweight, mod.wscales, mod.smooth, mod.lora_down, mod.lora_up,
                                  fmt="int4_2l")
    assert config_from_dict(SVDQuantConfig(weight_format="int4_2l").to_dict()).weight_format == "int4_2l"
    from lowrank_gemm.integrations.nunchaku import split_rows
    with pytest.raises(ValueError, match="int4_g64 layers"):
        split_rows(mod, [N // 2, N // 2])
