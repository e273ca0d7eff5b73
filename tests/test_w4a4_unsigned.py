"""Unsigned int4 activations after a constant shift (``act_shift``: Nunchaku's fc2 scheme for GELU outputs).

CPU: the quantizer's rules (range, zero / NaN / Inf groups, values under the floor), the e4m3 operands it feeds,
the module against the float64 spec, the bias fold the kernels add, the layer op through its e4m3 route (the GPU
launchers replaced by float64 stand-ins of their e4m3 math), the checkpoint field, TP shards, the Nunchaku import
option and bad input. GPU (``-m gpu``): the layer on the decode and v2 kernels at real sizes against the spec.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lowrank_gemm.formats.int4 import (act_shift_vector, dequantize_int4, pack_int4, quantize_act_int4,
                                       quantize_act_uint4, quantize_weight_int4, unpack_int4)
from lowrank_gemm.kernels.act_quant import act_quant_shifted
from lowrank_gemm.kernels.w4_expand import e4m3_operands, expand_act_f8_ref
from lowrank_gemm.nn.svdq import SVDQLinear
from lowrank_gemm.quant.config import SVDQuantConfig
from lowrank_gemm.reference import svdq_linear_ref

SHIFT = 0.171875


def _gelu_input(m, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return nn.functional.gelu(torch.randn(m, k, generator=g) * 2)


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


# ------------------------------------------------------------------------------------------- the quantizer

def test_uint4_codes_cover_zero_to_fifteen_and_dequantize_within_half_a_step():
    lam = torch.rand(256) + 0.5
    xs = _gelu_input(24, 256) / lam                # GELU outputs ≥ −0.17: every u = (x + 0.171875)/λ is ≥ 0
    sh = act_shift_vector(SHIFT, lam)
    q, s = quantize_act_uint4(xs, sh, 64)
    assert q.dtype == torch.int8 and int(q.min()) == 0 and int(q.max()) == 15 and s.shape == (4, 24)
    u = xs + sh
    back = dequantize_int4(q, s, 64)
    step = s.float().t().repeat_interleave(64, dim=1)
    assert bool(((back - u).abs() <= step / 2 * 1.0001).all())
    assert bool((q.reshape(24, 4, 64).amax(-1) == 15).all())       # every group reaches its top code
    # the rounded scale is the 16-bit value of max(u) / 15
    top = u.reshape(24, 4, 64).amax(-1).t()
    assert torch.equal(s, (top / torch.full_like(top, 15.0)).to(torch.bfloat16))


def test_uint4_special_groups():
    k = 128
    xs = torch.rand(4, k)
    sh = torch.full((k,), 0.25)
    xs[0, :64] = -0.25                   # u = 0 exactly: zero group → scale 1, codes 0
    xs[1, 5] = float("nan")              # NaN group → scale NaN, codes 0
    xs[2, 70] = float("-inf")            # ±Inf group → scale +Inf, codes 0
    xs[3, :] = -1.0                      # below the floor everywhere: clamps to 0 with scale 1
    q, s = quantize_act_uint4(xs, sh, 64)
    assert s[0, 0] == 1 and bool((q[0, :64] == 0).all())
    assert torch.isnan(s[0, 1].float()) and bool((q[1, :64] == 0).all())
    assert torch.isinf(s[1, 2].float()) and s[1, 2] > 0 and bool((q[2, 64:] == 0).all())
    assert s[0, 3] == 1 and s[1, 3] == 1 and bool((q[3] == 0).all())
    assert torch.isnan(dequantize_int4(q, s, 64)[1, :64]).all()


def test_uint4_bad_input():
    with pytest.raises(ValueError, match="shift must be float32"):
        quantize_act_uint4(torch.rand(2, 64), torch.zeros(64, dtype=torch.float64), 64)
    with pytest.raises(ValueError, match="shift must be float32"):
        quantize_act_uint4(torch.rand(2, 64), torch.zeros(32), 64)
    with pytest.raises(ValueError, match="multiple of group_size"):
        quantize_act_uint4(torch.rand(2, 96), torch.zeros(96), 64)


def test_e4m3_operands_match_the_packed_expansion():
    """Signed codes: the torch operands equal ``expand_act_f8``'s spec bit for bit; unsigned codes: the same rows
    from their own sums (R up to 64·15)."""
    q, s = quantize_act_int4(torch.randn(9, 256), 64)
    x8, xab = e4m3_operands(q, s, 64)
    ref_q, ref_xab = expand_act_f8_ref(pack_int4(q), s, 64)
    assert torch.equal(x8.float(), ref_q) and torch.equal(xab, ref_xab)
    qu = torch.randint(0, 16, (9, 256), dtype=torch.int8)
    qu[0] = 15
    x8, xab = e4m3_operands(qu, s, 64)
    assert torch.equal(x8.float(), qu.float())
    r = qu.float().reshape(9, 4, 64).sum(-1).t()
    assert torch.equal(xab[:, 1, :], -8 * r * s.float()) and xab[0, 1, 0] == -8 * 960 * s[0, 0].float()


def test_act_quant_shifted_is_the_spec():
    x = _gelu_input(7, 192).to(torch.bfloat16)
    lam = (torch.rand(192) + 0.5).to(torch.bfloat16)
    down = (torch.randn(16, 192) * 0.1).to(torch.bfloat16)
    sh = act_shift_vector(SHIFT, lam)
    x8, xab, s = act_quant_shifted(x, lam, down, sh, 64)
    q, sc = quantize_act_uint4(x.float() / lam.float(), sh, 64)
    assert torch.equal(x8.float(), q.float()) and torch.equal(xab[:, 0, :], sc.float() * 512)
    assert _rel(s, (x.double() / lam.double()) @ down.double().t()) < 1e-6


def _shifted(variant, x, lam, down, sh, scale_dtype):
    from lowrank_gemm.kernels.act_quant import act_quant
    return act_quant(x, lam, down, 64, "int4_g64", scale_dtype, out="f8", variant=variant, act_shift=sh)


@pytest.mark.parametrize("variant", ["fused", "v3"])
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16])
def test_act_quant_shifted_kernel_matches_the_torch_path(scale_dtype, variant, monkeypatch):
    """act_quant's fused and v3 kernels with the shift (interpreter) against the torch path on ragged rows and
    special groups (a zero group, NaN, ±Inf, values under the floor, one far below it): codes and xab bit for bit,
    S to fp32."""
    import lowrank_gemm.kernels.act_quant as aq
    m, k = 19, 256
    x = _gelu_input(m, k, seed=3).to(torch.float16)
    x[0, :64] = 0
    x[1, 70] = float("nan")
    x[2, 130] = float("inf")
    x[3, 200] = float("-inf")
    x[4, 64:128] = -3.0
    x[5, 10] = -6.0e4
    lam = (torch.rand(k) + 0.5).to(torch.float16)
    down = (torch.randn(8, k) * 0.1).to(torch.float16)
    sh = act_shift_vector(SHIFT, lam)
    got = _shifted(variant, x, lam, down, sh, scale_dtype)
    monkeypatch.setattr(aq, "_interpreting", lambda: False)
    want = act_quant_shifted(x, lam, down, sh, 64, scale_dtype)
    assert torch.equal(got[0].float(), want[0].float())
    assert torch.equal(got[1].nan_to_num(7.0), want[1].nan_to_num(7.0))
    fin = torch.isfinite(want[2])
    assert torch.equal(fin, torch.isfinite(got[2])) and fin[6:].all()
    assert torch.allclose(got[2][fin], want[2][fin], rtol=1e-5, atol=1e-5)
    assert torch.isnan(got[1][1, 0, 1]) and torch.isinf(got[1][2, 0, 2])


@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16])
def test_act_quant_shifted_fast_path_rounds_like_the_spec(scale_dtype, monkeypatch):
    """No special values, so v3 never redoes a slice: its fast path alone (one FMA-corrected division, magic-number
    rounding, the two clamps) against the torch path, including exact ties u/scale = j + ½ (rounded to even) and
    values far under the floor (codes 0)."""
    import lowrank_gemm.kernels.act_quant as aq
    m, k = 40, 192
    x = _gelu_input(m, k, seed=5).to(torch.float16)
    lam = (torch.rand(k) + 0.5).to(torch.float16)
    lam[:64] = 1.0
    # row 0, group 0 with λ = 1: u = x + 0.171875; top 1.875 → scale 0.125 exactly, u = (j + ½)·0.125 → ties
    ties = (torch.arange(64) % 15 + 0.5) * 0.125
    ties[0] = 1.875
    x[0, :64] = (ties - SHIFT).to(torch.float16)
    x[7, 64:] = torch.where(torch.arange(k - 64) % 3 == 0, -900.0, 1.0)
    down = (torch.randn(8, k) * 0.1).to(torch.float16)
    sh = act_shift_vector(SHIFT, lam)
    got = _shifted("v3", x, lam, down, sh, scale_dtype)
    monkeypatch.setattr(aq, "_interpreting", lambda: False)
    want = act_quant_shifted(x, lam, down, sh, 64, scale_dtype)
    assert torch.equal(got[0].float(), want[0].float()) and torch.equal(got[1], want[1])
    q0 = want[0][0, :64].float()
    assert torch.equal(q0, torch.round(ties / 0.125)) and (q0[1:] % 2 == 0).all()   # half to even
    assert torch.allclose(got[2], want[2], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------- the module

@pytest.fixture(scope="module")
def layers():
    torch.manual_seed(0)
    lin = nn.Linear(256, 96)
    x = _gelu_input(64, 256, seed=1)
    signed = SVDQLinear.from_linear(lin, SVDQuantConfig(rank=16, refit_iters=2), x)
    unsigned = SVDQLinear.from_linear(lin, SVDQuantConfig(rank=16, refit_iters=2, act_shift=SHIFT), x)
    return lin, x, signed, unsigned


def test_module_matches_the_spec_and_beats_signed_on_gelu_inputs(layers):
    lin, x, signed, unsigned = layers
    assert unsigned.act_shift == SHIFT and "act_shift" in repr(unsigned) and "act_shift" not in repr(signed)
    y = unsigned(x)
    ref = svdq_linear_ref(x, unsigned.qweight, unsigned.wscales, unsigned.smooth, unsigned.lora_down,
                          unsigned.lora_up, unsigned.bias, 64, act_shift=unsigned.act_shift_vec())
    assert _rel(y, ref) < 1e-6
    true = lin(x).detach()
    assert _rel(y, true) < 0.9 * _rel(signed(x), true)        # session 36, MiniLM fc2: −29 % layer error


def test_kernel_bias_folds_the_shift_and_follows_the_buffers(layers):
    _, _, signed, unsigned = layers
    assert signed.kernel_bias() is signed.bias
    kb = unsigned.kernel_bias()
    w = dequantize_int4(unpack_int4(unsigned.qweight), unsigned.wscales, 64).double()
    expect = unsigned.bias.double() - w @ unsigned.act_shift_vec().double()
    assert kb.dtype == torch.float32 and torch.allclose(kb.double(), expect, rtol=0, atol=1e-6)
    assert unsigned.kernel_bias() is kb                          # cached
    mod = SVDQLinear(128, 8, 0, 64, bias=False, act_shift=SHIFT)
    mod.qweight = pack_int4(torch.randint(-8, 8, (8, 128), dtype=torch.int8))
    first = mod.kernel_bias().clone()
    mod.smooth.mul_(2)                                           # in place: a new version, a new fold
    assert not torch.equal(mod.kernel_bias(), first)


def test_module_bad_input():
    with pytest.raises(ValueError, match="act_shift must be a finite value"):
        SVDQLinear(128, 8, 0, 64, act_shift=-1.0)
    with pytest.raises(ValueError, match="act_shift must be a finite value"):
        SVDQLinear(128, 8, 0, 64, act_bits=16, act_shift=SHIFT)
    with pytest.raises(ValueError, match="act_shift"):
        SVDQuantConfig(act_shift=float("nan"))
    with pytest.raises(ValueError, match="needs act_bits=4"):
        SVDQuantConfig(act_bits=16, act_shift=SHIFT)


# ------------------------------------------------------------------------------ the layer op, e4m3 route

def _f64_e4m3_gemm(x_q, x_scale, w_q, w_scale, lowrank_act, lora_up, bias, out, group_size):
    """What the decode / v2 e4m3 paths compute, in float64: Σ_g ws·(a·P' + b) with P' = 2⁻⁹·Σ q_x·(q_w + 8)."""
    q = x_q.double()
    qw = unpack_int4(w_q).double()
    m, k = q.shape
    acc = torch.zeros(m, qw.shape[0], dtype=torch.float64)
    for g in range(k // group_size):
        ks = slice(g * group_size, (g + 1) * group_size)
        p = q[:, ks] @ (qw[:, ks] + 8).t() / 512
        acc += (p * x_scale[g, 0].double()[:, None] + x_scale[g, 1].double()[:, None]) * w_scale[g].double()[None]
    if lowrank_act is not None:
        acc += lowrank_act.double() @ lora_up.double().t()
    if bias is not None:
        acc += bias.double()
    out.copy_(acc)


@pytest.mark.parametrize("m,route", [(5, "decode"), (40, "v2")])
def test_layer_op_runs_the_e4m3_route(m, route, monkeypatch):
    """``w4a4_linear(act_shift=...)`` hands the decode or v2 launcher (here float64 stand-ins of the e4m3 math) the
    unsigned codes with f8 forced on, and gives the spec's output once ``bias`` holds the fold."""
    import lowrank_gemm.kernels.w4a4_gemm as g
    from lowrank_gemm.kernels.gluon import w4a4_decode, w4a4_ws
    seen = []

    def stand_in(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt, group_size, config=None,
                 _dims=None, f8=None):
        seen.append((route, x_q.dtype, f8))
        _f64_e4m3_gemm(x_q, x_scale, w_q, w_scale, lowrank_act, lora_up, bias, out, group_size)
        return out

    monkeypatch.setattr(g, "_decode_route", lambda impl, m_, n, fmt, device: route == "decode")
    monkeypatch.setattr(g, "_route", lambda *a, **k: route)
    monkeypatch.setattr(w4a4_decode, "launch_w4a4_decode", stand_in)
    monkeypatch.setattr(w4a4_ws, "launch_w4a4_v2", stand_in)
    k, n, r = 256, 48, 16
    x = _gelu_input(m, k).to(torch.bfloat16)
    lam = (torch.rand(k) + 0.5).to(torch.bfloat16)
    qw, sw = quantize_weight_int4(torch.randn(n, k) * 0.05, 64)
    p = dict(qweight=pack_int4(qw), wscales=sw, smooth=lam, lora_down=(torch.randn(r, k) * 0.1).to(torch.bfloat16),
             lora_up=(torch.randn(n, r) * 0.1).to(torch.bfloat16))
    bias = torch.randn(n)
    sh = act_shift_vector(SHIFT, lam)
    fold = bias.double() - dequantize_int4(qw, sw, 64).double() @ sh.double()
    y = g.w4a4_linear(x, **p, bias=fold.float(), act_shift=sh, out_dtype=torch.float32)
    assert seen == [(route, torch.float8_e4m3fn, True)]
    ref = svdq_linear_ref(x, **p, bias=bias, act_shift=sh)
    assert _rel(y, ref) < 1e-5


def test_layer_op_bad_input():
    import lowrank_gemm.kernels.w4a4_gemm as g
    k, n = 128, 16
    qw, sw = quantize_weight_int4(torch.randn(n, k), 64)
    p = dict(qweight=pack_int4(qw), wscales=sw, smooth=torch.ones(k), lora_down=torch.zeros(0, k),
             lora_up=torch.zeros(n, 0))
    x = torch.randn(3, k).half()
    with pytest.raises(ValueError, match="act_shift must be float32"):
        g.w4a4_linear(x, **p, act_shift=torch.zeros(k, dtype=torch.float16))
    with pytest.raises(ValueError, match="act_shift must be float32"):
        g.w4a4_linear(x, **p, act_shift=torch.zeros(k - 64))
    with pytest.raises(ValueError, match="runs the int4_g64 format"):
        g.w4a4_linear(x, **p, fmt="int4_2l", wmul=torch.ones(2, n, dtype=torch.uint8), act_shift=torch.zeros(k))
    with pytest.raises(ValueError, match="e4m3"):                # the CPU has no e4m3 route: a clear refusal
        g.w4a4_linear(x, **p, act_shift=torch.zeros(k))


def test_svdq_forward_cuda_passes_the_fold(layers, monkeypatch):
    import lowrank_gemm.kernels.w4a4_gemm as g
    _, x, _, unsigned = layers
    got = {}
    monkeypatch.setattr(g, "w4a4_linear", lambda *a, **k: got.update(args=a, kw=k) or torch.zeros(1))
    g.svdq_forward_cuda(unsigned, x.to(torch.bfloat16))
    assert got["args"][6] is unsigned.kernel_bias() and got["kw"]["act_shift"] is unsigned.act_shift_vec()


# ------------------------------------------------------------------------------------- around the module

def test_tensor_parallel_shards_keep_the_shift(layers):
    from lowrank_gemm.nn.parallel import shard_columns, shard_rows
    _, x, _, unsigned = layers
    y = unsigned(x)
    cols = [shard_columns(unsigned, i, 2) for i in range(2)]
    assert all(c.act_shift == SHIFT for c in cols)
    assert torch.allclose(torch.cat([c(x) for c in cols], dim=-1), y, atol=1e-6)
    rows = [shard_rows(unsigned, i, 2) for i in range(2)]
    parts = sum(layer(x[:, i * 128:(i + 1) * 128]) for i, (layer, _) in enumerate(rows))
    assert all(layer.act_shift == SHIFT for layer, _ in rows)
    assert _rel(parts + rows[0][1], y) < 1e-5


def test_nunchaku_import_unsigned_option():
    from test_nunchaku import _file_tensors, _operands    # the Nunchaku-layout fixtures of that suite
    from lowrank_gemm.integrations.nunchaku import GELU_SHIFT, svdq_linear_from_nunchaku
    tensors = _file_tensors(*_operands())
    plain = svdq_linear_from_nunchaku(tensors, input_shift=GELU_SHIFT)
    shifted = svdq_linear_from_nunchaku(tensors, input_shift=GELU_SHIFT, unsigned=True)
    assert plain.act_shift == 0 and shifted.act_shift == GELU_SHIFT
    assert torch.equal(plain.bias, shifted.bias) and torch.equal(plain.qweight, shifted.qweight)
    x = _gelu_input(8, shifted.in_features)
    assert _rel(shifted(x), plain(x)) < 0.2                      # the same layer, another activation quantizer


# ------------------------------------------------------------------------------------------------------ GPU

def _gpu_layer(m, n, k):
    from lowrank_gemm.bench.w4a4 import unsigned_layer_case
    p, bias, sh, fold, draw = unsigned_layer_case(n, k, device="cuda", shift=SHIFT)
    return draw(m), p, bias, sh, fold


@pytest.mark.gpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("m,n,k", [(1, 28672, 4096), (16, 28672, 4096), (64, 3072, 3072), (300, 3072, 3072),
                                   (4608, 3072, 3072)])
def test_gpu_unsigned_layer_vs_spec(m, n, k):
    """The decode (small M) and v2 (large M; M = 300 without TMA'd scale rows is M % 8 = 4) kernels on the unsigned
    codes 0…15 against the float64 spec; bit-identical repeats; graph replay equals eager."""
    x, p, bias, sh, fold = _gpu_layer(m, n, k)
    y = g_linear(x, p, fold, sh)
    ref = svdq_linear_ref(x, **p, bias=bias, act_shift=sh)
    assert _rel(y, ref) <= 1e-3
    assert torch.equal(g_linear(x, p, fold, sh), y)
    from lowrank_gemm.bench.common import capture_graph
    static_x = x.clone()
    _, graph, out = capture_graph(lambda: g_linear(static_x, p, fold, sh))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, y)


@pytest.mark.gpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("m,k", [(1, 4096), (16, 4096), (300, 3072), (4608, 12288)])
def test_gpu_unsigned_quantizer_is_the_spec(m, k):
    """act_quant's v3 kernel with the shift on the GPU (the fast path with hardware FMAs, the exact redo on the
    special rows): codes and xab bit for bit against ``quantize_act_uint4`` + ``e4m3_operands`` run by torch on the
    same device; S to 1e-5 of float64; bit-identical repeats."""
    g = torch.Generator(device="cuda").manual_seed(m + k)
    x = nn.functional.gelu(torch.randn(m, k, device="cuda", generator=g) * 2).to(torch.bfloat16)
    if m > 8:
        x[1, 70] = float("nan")
        x[2, 130] = float("-inf")
        x[3, 64:128] = -3.0
        x[4, :64] = 0
        x[5, 10] = -6.0e4
    lam = (torch.rand(k, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
    down = (torch.randn(32, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
    sh = act_shift_vector(SHIFT, lam)
    x8, xab, s = act_quant_shifted(x, lam, down, sh, 64)
    want_q, want_xab = e4m3_operands(*quantize_act_uint4(x.float() / lam.float(), sh, 64), 64)
    assert torch.equal(x8.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(xab.nan_to_num(7.0), want_xab.nan_to_num(7.0))
    rows = torch.isfinite(x.float()).all(1)
    s64 = (x.double() / lam.double()) @ down.double().t()
    assert _rel(s[rows], s64[rows]) < 1e-5
    again = act_quant_shifted(x, lam, down, sh, 64)
    assert torch.equal(again[0].view(torch.uint8), x8.view(torch.uint8)) and torch.equal(again[2].nan_to_num(7.0),
                                                                                          s.nan_to_num(7.0))


def g_linear(x, p, fold, sh):
    from lowrank_gemm.kernels.w4a4_gemm import w4a4_linear
    return w4a4_linear(x, **p, bias=fold, act_shift=sh, out_dtype=torch.float32)


@pytest.mark.gpu
@pytest.mark.timeout(180)
def test_gpu_unsigned_module_and_compile():
    """SVDQLinear(act_shift) on CUDA takes the kernels and matches its own reference path; torch.compile(fullgraph)
    traces it (the shift vector and the bias fold come from the module's refreshed state)."""
    torch.manual_seed(0)
    lin = nn.Linear(3072, 3072).cuda()
    x = _gelu_input(256, 3072).cuda()
    layer = SVDQLinear.from_linear(lin, SVDQuantConfig(rank=32, refit_iters=2, act_shift=SHIFT), x)
    xb = x.bfloat16()
    assert layer._use_kernels(xb)
    y = layer(xb)
    assert _rel(y, layer.forward_reference(xb)) <= 1e-2
    compiled = torch.compile(lambda t: layer(t), fullgraph=True)
    assert torch.equal(compiled(xb), y)


def test_module_compiles_on_the_cpu(layers):
    """torch.compile(fullgraph) over the reference path: the refreshed shift state is read, not recomputed."""
    _, x, _, unsigned = layers
    y = unsigned(x)
    compiled = torch.compile(lambda t: unsigned(t), fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), y)


def test_bench_case_helper_on_the_cpu():
    """``bench.w4a4.unsigned_layer_case`` (the GPU tests' and probe_unsigned's operands): its fold is the spec's."""
    from lowrank_gemm.bench.w4a4 import unsigned_layer_case
    p, bias, sh, fold, draw = unsigned_layer_case(48, 128, 8, device="cpu", shift=SHIFT)
    x = draw(5)
    assert x.shape == (5, 128) and x.dtype == torch.bfloat16 and float(x.min()) >= -0.17
    w = dequantize_int4(unpack_int4(p["qweight"]), p["wscales"], 64).double()
    assert torch.allclose(fold.double(), bias.double() - w @ sh.double(), atol=1e-6)


def test_unsigned_quantizer_compiles_for_sm90():
    """sm_90 (ahead of time): act_quant's v3 kernel with UNSIGNED (the production tile, S feed "one", launched with
    the one-feed register cap) keeps its one S accumulator on wgmma, stores e4m3 codes, divides with div.rn only in
    the redo, and ptxas fits it in the cap without spills: 4 CTAs per SM, as the one-wave split assumes."""
    from lowrank_gemm.kernels.act_quant import _ONE_FEED_CTAS, _ONE_FEED_MAXNREG
    from _sm90 import ptxas_stats
    from lowrank_gemm.kernels.aot import compile_sm90
    sig = dict(x_ptr="*bf16", stride_xm="i32", smooth_ptr="*bf16", rl_ptr="*fp32", q_ptr="*fp8e4nv", stride_qm="i32",
               sc_ptr="*fp32", stride_sg="i32", p_ptr="*bf16", stride_pp="i32", sp_ptr="*fp32", stride_sps="i32",
               stride_spm="i32", M="i32", K="i32", R="i32", STEPS_PER_SLICE="i32", shift_ptr="*fp32")
    info = compile_sm90("lowrank_gemm.kernels.act_quant", "_act_quant_g_v3_kernel", sig,
                        dict(G=64, BLOCK_M=64, BLOCK_R=32, HAS_LOWRANK=True, SCALE_BF16=True, SHIFT=0, EMU_FMA=False,
                             F8=True, ONE_ACC=True, UNSIGNED=True),
                        aligned=("x_ptr", "stride_xm", "smooth_ptr", "rl_ptr", "p_ptr", "stride_pp", "sp_ptr",
                                 "stride_spm", "q_ptr", "stride_qm", "sc_ptr", "shift_ptr"),
                        num_warps=4, num_stages=2, maxnreg=_ONE_FEED_MAXNREG)
    assert info.has("wgmma") and info.has("div.rn.f32") and "e4m3" in info.ptx
    assert _ONE_FEED_MAXNREG * 128 * _ONE_FEED_CTAS["int4_g64"] <= 65536
    stats = ptxas_stats(info.ptx)
    if stats is not None:
        assert stats[1] == 0, f"spills {stats[1]} bytes"
        assert stats[0] <= _ONE_FEED_MAXNREG, f"{stats[0]} registers"


def test_unsigned_fused_quantizer_compiles_for_sm90():
    """sm_90: the fused (small-M) kernel with UNSIGNED, rank-split S and PDL as the decode layers launch it: e4m3
    codes, div.rn, no spills."""
    from _sm90 import ptxas_stats
    from test_act_quant import _fused_signature
    from lowrank_gemm.kernels.aot import compile_sm90
    sig = dict(_fused_signature(q="*fp8e4nv", sc="*fp32", cnt="*i32"), shift_ptr="*fp32")
    ce = dict(TWO_LEVEL=False, G=64, BLOCK_M=16, BLOCK_K=64, BLOCK_R=32, SPLIT_P2=1, SUM_ROWS=1, QM=16, QK=256,
              CH=4096, SCALE_BF16=True, S_RANK=True, SR=1, RB=1, CK=4096, NCH=1, F8=True, PDL=True, UNSIGNED=True)
    info = compile_sm90("lowrank_gemm.kernels.act_quant", "_act_quant_fused_kernel", sig, ce,
                        aligned=("x_ptr", "stride_xm", "smooth_ptr", "q_ptr", "stride_qm", "a_ptr", "stride_ar"),
                        num_warps=4)
    assert info.has("div.rn.f32", "griddepcontrol") and "e4m3" in info.ptx
    stats = ptxas_stats(info.ptx)
    if stats is not None:
        assert stats[1] == 0, f"spills {stats[1]} bytes"


def test_act_quant_shift_needs_the_e4m3_output_and_a_kernel_that_has_it(monkeypatch):
    """act_shift with packed output or the v1 / v2 kernels is refused by name; a plan that picks v2 (env) runs v3."""
    import lowrank_gemm.kernels.act_quant as aq
    x = _gelu_input(70, 128).to(torch.float16)
    lam = (torch.rand(128) + 0.5).to(torch.float16)
    down = torch.zeros(0, 128, dtype=torch.float16)
    sh = act_shift_vector(SHIFT, lam)
    with pytest.raises(ValueError, match="act_shift.*out='f8'.*out='packed'"):
        aq.act_quant(x, lam, down, 64, act_shift=sh)
    with pytest.raises(ValueError, match="variant='v1'"):
        aq.act_quant(x, lam, down, 64, out="f8", variant="v1", act_shift=sh)
    with pytest.raises(ValueError, match=r"act_shift must be float32 \[K=128\].*torch.bfloat16 \[128\]"):
        aq.act_quant(x, lam, down, 64, out="f8", act_shift=sh.to(torch.bfloat16))
    with pytest.raises(ValueError, match=r"float32 \[K=128\].*\[64\]"):
        aq.act_quant(x, lam, down, 64, out="f8", act_shift=sh[:64])
    monkeypatch.setattr(aq, "_ENV_LARGE", "v2")
    assert aq.plan_act_quant(70, 128, 64).variant == "v2"
    seen = []
    real = aq._act_quant_v2
    monkeypatch.setattr(aq, "_act_quant_v2", lambda *a: seen.append(a[15]) or real(*a))
    aq.act_quant(x, lam, down, 64, out="f8", act_shift=sh)
    assert seen == [True]                                          # _act_quant_v2(..., v3=True, ...)
