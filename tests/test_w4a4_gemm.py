"""W4A4 GEMM v1 + ops (interpreter on CPU) vs reference.py in float64; AOT sm_90 PTX and SMEM ledger.

fp16 low-rank factors on CPU: the interpreter's bf16 tl.dot is wrong (DESIGN.md §6); GPU tests use bf16.
"""

import re

import pytest
import torch

from lowrank_gemm.formats.int4 import pack_int4, quantize_act_int4, quantize_weight_int4
from lowrank_gemm.formats.int4_twolevel import pack_weight_2l, quantize_act_2l
from lowrank_gemm.kernels.act_quant import act_quant
from lowrank_gemm.kernels.w4a4_gemm import (W4A4Plan, aot_compile, can_implement, launch_w4a4_v1, plan_w4a4,
                                            plan_w4a4_full, predicted_shared, svdq_forward_cuda, swap_config,
                                            w4a4_epilogue_ledger, w4a4_gemm, w4a4_ledger, w4a4_linear)
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.reference import svdq_linear_ref, w4a4_gemm_ref

TOL = 1e-5  # fp32 output vs float64 on identical quantized operands: only fp32 accumulation order differs


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _operands(m, n, k, r, g, fmt, lowrank_dtype=torch.float16):
    x = torch.randn(m, k) * torch.exp(torch.randn(k) * 0.5)
    w = torch.randn(n, k)
    if fmt == "int4_g64":
        qa, sa = quantize_act_int4(x, g)
        qw, sw = quantize_weight_int4(w, g)
        ops = dict(x_q=pack_int4(qa), x_scale=sa, w_q=pack_int4(qw), w_scale=sw, w_mul=None)
    else:
        e, t = quantize_act_2l(x, g)
        q, u, s = pack_weight_2l(w, g)
        ops = dict(x_q=e, x_scale=t, w_q=q, w_scale=s, w_mul=u)
    lowrank = (torch.randn(m, r) * 4, (torch.randn(n, r) * 0.1).to(lowrank_dtype)) if r else (None, None)
    return ops, lowrank, torch.randn(n)


def _run_poisoned(ops, lowrank, bias, m, n, g, fmt, out_dtype=torch.float32, config=None, **kw):
    out = torch.full((m, n), float("nan"), dtype=out_dtype)
    launch_w4a4_v1(ops["x_q"], ops["x_scale"], ops["w_q"], ops["w_scale"], ops["w_mul"], *lowrank, bias, out, fmt,
                   g, config, **kw)
    return out


def _ref(ops, lowrank, bias, g, fmt):
    return w4a4_gemm_ref(ops["x_q"], ops["x_scale"], ops["w_q"], ops["w_scale"], *lowrank, bias,
                         w_mul=ops["w_mul"], group_size=g, fmt=fmt)


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("m,n,k,g,r", [
    (37, 45, 192, 64, 16), (70, 33, 256, 128, 32), (9, 80, 128, 64, 0), (21, 50, 128, 64, 64), (3, 29, 256, 64, 23),
])
def test_gemm_vs_reference(fmt, m, n, k, g, r):
    ops, lowrank, bias = _operands(m, n, k, r, g, fmt)
    y = _run_poisoned(ops, lowrank, bias, m, n, g, fmt)
    assert torch.isfinite(y).all()
    assert _rel(y, _ref(ops, lowrank, bias, g, fmt)) < TOL


def test_gemm_persistent_stride_and_fp8_variant():
    """More tiles than programs (the interpreter's grid is 4), small tiles; e4m3 MMA gives the same result."""
    m, n, k, g, r = 70, 100, 128, 64, 16
    ops, lowrank, bias = _operands(m, n, k, r, g, "int4_g64")
    cfg = KernelConfig(block_m=16, block_n=16, block_k=64, block_r=16, group_m=2, num_warps=4, num_stages=2)
    ref = _ref(ops, lowrank, bias, g, "int4_g64")
    assert _rel(_run_poisoned(ops, lowrank, bias, m, n, g, "int4_g64", config=cfg), ref) < TOL
    assert _rel(_run_poisoned(ops, lowrank, bias, m, n, g, "int4_g64", config=cfg, mma_fp8=True), ref) < TOL


def test_gemm_op_fp16_out_and_no_bias():
    m, n, k, g, r = 17, 40, 128, 64, 16
    ops, lowrank, _ = _operands(m, n, k, r, g, "int4_2l")
    y = w4a4_gemm(ops["x_q"], ops["x_scale"], ops["w_q"], ops["w_scale"], *lowrank, w_mul=ops["w_mul"],
                  fmt="int4_2l", out_dtype=torch.float16)
    ref = _ref(ops, lowrank, None, g, "int4_2l")
    assert y.dtype == torch.float16 and y.shape == (m, n)
    assert _rel(y, ref) < 1e-3  # fp16 output rounding


def _layer(m, n, k, r, g, fmt):
    x = (torch.randn(m, k) * torch.exp(torch.randn(k) * 0.5)).half()
    smooth = (torch.rand(k) + 0.5).to(torch.bfloat16)
    w = torch.randn(n, k) * 0.05
    down, up = (torch.randn(r, k) * 0.1).half(), (torch.randn(n, r) * 0.1).half()
    bias = torch.randn(n)
    if fmt == "int4_g64":
        qw, sw = quantize_weight_int4(w, g)
        return x, dict(qweight=pack_int4(qw), wscales=sw, smooth=smooth, lora_down=down, lora_up=up, bias=bias)
    q, u, s = pack_weight_2l(w, g)
    return x, dict(qweight=q, wscales=s, wmul=u, smooth=smooth, lora_down=down, lora_up=up, bias=bias)


@pytest.mark.parametrize("g,r", [(64, 32), (128, 0)])
def test_linear_vs_svdq_reference(g, r):
    m, n, k = 3 * 11, 45, 256
    x, p = _layer(m, n, k, r, g, "int4_g64")
    x3 = x.reshape(3, 11, k)
    y = w4a4_linear(x3, group_size=g, out_dtype=torch.float32, **p)
    assert y.shape == (3, 11, n) and y.dtype == torch.float32
    ref = svdq_linear_ref(x3, group_size=g, **p)
    # act_quant is bit-identical to the spec's quantizer; the residual is S rounded to fp16 in the epilogue
    assert _rel(y, ref) < 1e-3
    assert w4a4_linear(x3, group_size=g, **p).dtype == torch.float16


def test_linear_int4_2l_same_quantized_operands():
    m, n, k, g, r = 20, 33, 192, 64, 23
    x, p = _layer(m, n, k, r, g, "int4_2l")
    y = w4a4_linear(x, group_size=g, fmt="int4_2l", out_dtype=torch.float32, **p)
    e, t, s = act_quant(x, p["smooth"], p["lora_down"], g, "int4_2l")
    ref = w4a4_gemm_ref(e, t, p["qweight"], p["wscales"], s, p["lora_up"], p["bias"], w_mul=p["wmul"],
                        group_size=g, fmt="int4_2l")
    assert _rel(y, ref) < TOL


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
def test_nan_inf_rows_become_nan(fmt):
    m, n, k, g, r = 12, 20, 128, 64, 16
    x, p = _layer(m, n, k, r, g, fmt)
    x[2, 7] = float("nan")
    x[5, 100] = float("inf")
    y = w4a4_linear(x, group_size=g, fmt=fmt, out_dtype=torch.float32, **p)
    assert torch.isnan(y[2]).all() and torch.isnan(y[5]).all()
    keep = [i for i in range(m) if i not in (2, 5)]
    assert torch.isfinite(y[keep]).all()


def test_svdq_forward_hookup():
    try:
        import lowrank_gemm.quant  # noqa: F401  (nn.svdq and quant import each other; quant first works)
        from lowrank_gemm.nn.svdq import SVDQLinear
    except ImportError as err:  # nn/svdq.py is another engineer's work in progress
        pytest.skip(f"nn.svdq not importable: {err}")
    m, n, k, r, g = 10, 24, 128, 16, 64
    layer = SVDQLinear(k, n, r, g, bias=True, lowrank_dtype=torch.float16)
    w = torch.randn(n, k) * 0.05
    qw, sw = quantize_weight_int4(w, g)
    layer.qweight, layer.wscales = pack_int4(qw), sw
    layer.smooth = (torch.rand(k) + 0.5).to(torch.bfloat16)
    layer.lora_down, layer.lora_up = (torch.randn(r, k) * 0.1).half(), (torch.randn(n, r) * 0.1).half()
    layer.bias = torch.randn(n)
    x = torch.randn(2, 5, k).half()
    y = svdq_forward_cuda(layer, x)
    ref = layer.forward_reference(x)
    assert y.shape == ref.shape and y.dtype == ref.dtype
    assert _rel(y, ref) < 2e-3  # both end in fp16


def test_bad_inputs():
    m, n, k, g = 8, 16, 128, 64
    x, p = _layer(m, n, k, 16, g, "int4_g64")
    x192, p192 = _layer(m, n, 192, 16, 64, "int4_g64")
    with pytest.raises(ValueError, match="K=192 must be a multiple of 64 and of group_size=128"):
        w4a4_linear(x192, **{**p192, "wscales": p192["wscales"][:1].contiguous()}, group_size=128)
    with pytest.raises(ValueError, match="qweight must be uint8"):
        w4a4_linear(x, **{**p, "qweight": p["qweight"][:, :32].contiguous()})
    with pytest.raises(ValueError, match="wscales must be"):
        w4a4_linear(x, **{**p, "wscales": p["wscales"][:1].contiguous()})
    with pytest.raises(ValueError, match="x must be bf16/fp16"):
        w4a4_linear(x.float(), **p)
    with pytest.raises(ValueError, match="fmt must be one of"):
        w4a4_linear(x, **p, fmt="int3")
    with pytest.raises(ValueError, match="impl must be"):
        w4a4_linear(x, **p, impl="v9")
    with pytest.raises(ValueError, match="lora_up must be"):
        w4a4_linear(x, **{**p, "lora_up": p["lora_up"][:, :3].contiguous()})
    ops, lowrank, _ = _operands(m, n, k, 16, g, "int4_2l")
    with pytest.raises(ValueError, match="w_mul must be uint8"):
        w4a4_gemm(ops["x_q"], ops["x_scale"], ops["w_q"], ops["w_scale"], *lowrank, fmt="int4_2l")
    with pytest.raises(ValueError, match="int4_2l activations must be int8"):
        w4a4_gemm(ops["x_q"].view(torch.uint8), ops["x_scale"], ops["w_q"], ops["w_scale"], w_mul=ops["w_mul"],
                  fmt="int4_2l")
    with pytest.raises(ValueError, match="lowrank_act must be float32"):
        w4a4_gemm(ops["x_q"], ops["x_scale"], ops["w_q"], ops["w_scale"], lowrank[0].half(), lowrank[1],
                  w_mul=ops["w_mul"], fmt="int4_2l")


def test_fake_impl_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    x, p = _layer(6, 24, 128, 16, 64, "int4_g64")
    x = x.reshape(2, 3, 128)
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(x)
        fp = {k: (mode.from_tensor(v) if isinstance(v, torch.Tensor) else v) for k, v in p.items()}
        y = w4a4_linear(fx, **fp)
    assert y.shape == (2, 3, 24) and y.dtype == torch.float16


# ---- planner, ledger, AOT sm_90 ------------------------------------------------------------------

@pytest.mark.parametrize("m", [1, 64, 200, 4608])
@pytest.mark.parametrize("fmt,g", [("int4_g64", 64), ("int4_g64", 128), ("int4_2l", 64)])
def test_planner_fits_ledger(m, fmt, g):
    cfg = plan_w4a4(m, 12288, 3072, 32, fmt, g)
    assert can_implement(cfg, fmt, g) and cfg.num_stages >= 2 and cfg.persistent
    assert not can_implement(cfg.replace(num_stages=200), fmt, g)
    table = w4a4_ledger(cfg, fmt, g).table()
    assert "main A" in table and "main B" in table and "B unpacked" in table
    assert "lora_up" in w4a4_epilogue_ledger(cfg).table()


@pytest.mark.parametrize("fmt,g,m,mma_fp8", [("int4_g64", 64, 4608, False), ("int4_2l", 64, 4608, False),
                                             ("int4_g64", 128, 64, False), ("int4_2l", 64, 16, False),
                                             ("int4_g64", 64, 4608, True)])
def test_aot_sm90_wgmma_tma_and_ledger(fmt, g, m, mma_fp8):
    cfg = plan_w4a4(m, 12288, 3072, 32, fmt, g).replace(num_stages=3)
    info = aot_compile(cfg, fmt, g, mma_fp8=mma_fp8)
    mma = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k\d+\.(\w+\.\w+\.\w+)", info.ptx))
    assert ("f32.e4m3.e4m3" if mma_fp8 else "s32.s8.s8") in mma, mma
    assert "f32.bf16.bf16" in mma  # the low-rank up-projection
    assert "cp.async.bulk.tensor" in info.ptx
    assert info.shared == predicted_shared(cfg, fmt, g), (info.shared, w4a4_ledger(cfg, fmt, g).table())


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("variant,prefetch", [("swap_ab", True), ("standard", False), ("standard", True)])
def test_variants_vs_reference(fmt, variant, prefetch):
    """Every plan the probe can pin computes the same GEMM (ragged M, N; more tiles than programs)."""
    m, n, k, g, r = 19, 150, 192, 64, 16
    ops, lowrank, bias = _operands(m, n, k, r, g, fmt)
    cfg = (swap_config(m, r, fmt, g, block_n=64) if variant == "swap_ab" else
           KernelConfig(block_m=64, block_n=32, block_k=64, block_r=16, group_m=2, num_warps=4, num_stages=2))
    plan = W4A4Plan(variant, cfg, prefetch=prefetch)
    assert can_implement(cfg, fmt, g, variant) and W4A4Plan.from_dict(plan.to_dict()) == plan
    y = _run_poisoned(ops, lowrank, bias, m, n, g, fmt, plan=plan)
    assert _rel(y, _ref(ops, lowrank, bias, g, fmt)) < TOL


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("k,block_k", [(256, 256), (256, 128), (192, 128)])
def test_swap_wide_k_step_vs_reference(fmt, k, block_k):
    """SWAP-AB with several groups per loop iteration (KSUB > 1); K not a multiple of block_k falls back
    to one group per iteration."""
    m, n, g, r = 5, 80, 64, 16
    ops, lowrank, bias = _operands(m, n, k, r, g, fmt)
    cfg = swap_config(m, r, fmt, g, block_n=64, block_k=block_k, max_stages=3)
    assert cfg.block_k == block_k and can_implement(cfg, fmt, g, "swap_ab")
    y = _run_poisoned(ops, lowrank, bias, m, n, g, fmt, plan=W4A4Plan("swap_ab", cfg))
    assert _rel(y, _ref(ops, lowrank, bias, g, fmt)) < TOL


def test_planner_variant_by_m_bucket():
    assert plan_w4a4_full(1, 28672, 4096, 32, "int4_2l", 64).variant == "swap_ab"
    assert plan_w4a4_full(1, 28672, 4096, 32, "int4_2l", 64).config.block_m == 16
    assert plan_w4a4_full(4608, 12288, 3072, 32, "int4_g64", 64).variant == "standard"


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
def test_aot_sm90_swap_ab(fmt):
    """SWAP-AB lowers to int8 wgmma with the tokens as N (m64n16) and TMA loads; SMEM per the ledger
    (2l: the compiler reports 128 B more than the ledger's terms — unexplained, bounded here)."""
    cfg = swap_config(1, 32, fmt, 64)
    info = aot_compile(cfg, fmt, 64, variant="swap_ab")
    assert "m64n16k32.s32.s8.s8" in info.ptx and "cp.async.bulk.tensor" in info.ptx
    pred = predicted_shared(cfg, fmt, 64, variant="swap_ab")
    assert 0 <= info.shared - pred <= (128 if fmt == "int4_2l" else 0), (info.shared, pred)


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
def test_aot_sm90_swap_wide_k_step(fmt):
    """block_k = 4 groups: 4× the TMA loads per step, wgmma as before; the ledger is exact for g64 and an
    upper bound (≤ 4 KB over) for 2l."""
    cfg = swap_config(1, 32, fmt, 64, block_k=256)
    info = aot_compile(cfg, fmt, 64, variant="swap_ab")
    assert "m64n16k32.s32.s8.s8" in info.ptx and "cp.async.bulk.tensor" in info.ptx
    pred = predicted_shared(cfg, fmt, 64, variant="swap_ab")
    if fmt == "int4_g64":
        assert info.shared == pred, (info.shared, pred)
    else:
        assert 0 <= pred - info.shared <= 4096, (info.shared, pred)



# ---- scale_tma and expand (issues 4/6) -------------------------------------------------------------

from lowrank_gemm.kernels.w4a4_gemm import expand_config, w4a4_expand_ledger  # noqa: E402


def _new_plans(m, r, fmt, g):
    std = KernelConfig(block_m=64, block_n=32, block_k=64, block_r=16, group_m=2, num_warps=4, num_stages=3)
    plans = {"std_tma": W4A4Plan("standard", std, scale_tma=True),
             "swap_tma": W4A4Plan("swap_ab", swap_config(m, r, fmt, g, block_n=64, scale_tma=True), scale_tma=True),
             "expand": W4A4Plan("expand", std.replace(block_k=64 if fmt == "int4_2l" else g)),
             "expand_tma": W4A4Plan("expand", std.replace(block_k=g), scale_tma=True)}
    if fmt == "int4_g64":
        plans["expand_fp8"] = W4A4Plan("expand", std.replace(block_k=g), mma_fp8=True)
    return plans


@pytest.mark.parametrize("fmt,g", [("int4_g64", 64), ("int4_2l", 64), ("int4_g64", 128)])
@pytest.mark.parametrize("m,n,r", [(24, 144, 16), (19, 150, 0)])
def test_scale_tma_and_expand_vs_reference(fmt, g, m, n, r):
    """(24, 144): every scale tensor meets TMA's 16-byte row rule (the TMA path runs); (19, 150): none
    does (per-tensor fallback to plain loads). Ragged vs the tiles either way; more tiles than programs."""
    k = 256
    ops, lowrank, bias = _operands(m, n, k, r, g, fmt)
    ref = _ref(ops, lowrank, bias, g, fmt)
    for name, plan in _new_plans(m, r, fmt, g).items():
        assert can_implement(plan.config, fmt, g, plan.variant, plan.scale_tma), name
        assert W4A4Plan.from_dict(plan.to_dict()) == plan
        y = _run_poisoned(ops, lowrank, bias, m, n, g, fmt, plan=plan)
        assert _rel(y, ref) < TOL, name


def test_old_plan_dicts_default_scale_tma_off():
    d = W4A4Plan("swap_ab", swap_config(1, 32, "int4_2l", 64)).to_dict()
    d.pop("scale_tma")
    assert W4A4Plan.from_dict(d).scale_tma is False


def test_expand_planner_and_ledger():
    cfg = expand_config(32, "int4_2l", 64)
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps) == (128, 256, 128, 8) and cfg.num_stages == 4
    assert can_implement(cfg, "int4_2l", 64, "expand") and not can_implement(cfg.replace(num_stages=5), "int4_2l", 64,
                                                                              "expand")
    assert "expand B w int8" in w4a4_expand_ledger(cfg, "int4_2l", 64).table()
    g = expand_config(32, "int4_g64", 64, scale_tma=True)
    assert g.block_k == 64 and "staging" in w4a4_expand_ledger(g, "int4_g64", 64, True).table()


@pytest.mark.parametrize("fmt,g,variant,tma,stages", [
    ("int4_2l", 64, "standard", True, 3), ("int4_2l", 64, "expand", False, 3), ("int4_g64", 64, "expand", False, 3),
    ("int4_g64", 64, "expand", True, 3), ("int4_g64", 128, "expand", False, 2), ("int4_g64", 64, "swap_ab", True, 6),
    ("int4_2l", 64, "swap_ab", True, 6)])
def test_aot_sm90_new_loops(fmt, g, variant, tma, stages):
    """wgmma + TMA in the PTX; scale_tma adds TMA load sites; SMEM = ledger (swap 2l: ledger ≤ 64 B over,
    like the unexplained swap-2l barrier bytes of test_aot_sm90_swap_ab)."""
    if variant == "expand":
        cfg = expand_config(32, fmt, g)
    elif variant == "swap_ab":
        cfg = swap_config(1, 32, fmt, g)
    else:
        cfg = plan_w4a4(4608, 12288, 3072, 32, fmt, g)
    cfg = cfg.replace(num_stages=stages)
    info = aot_compile(cfg, fmt, g, variant=variant, scale_tma=tma, has_lowrank=False)
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.s32\.s8\.s8", info.ptx)
    assert "cp.async.bulk.tensor" in info.ptx
    if tma:
        base = aot_compile(cfg, fmt, g, variant=variant, scale_tma=False, has_lowrank=False)
        assert info.ptx.count("cp.async.bulk.tensor") > base.ptx.count("cp.async.bulk.tensor")
    pred = predicted_shared(cfg, fmt, g, has_lowrank=False, variant=variant, scale_tma=tma)
    if variant == "swap_ab" and fmt == "int4_2l":
        assert 0 <= pred - info.shared <= 64, (info.shared, pred)
    else:
        assert info.shared == pred, (info.shared, pred)


# ---- pre-expanded e4m3 operands (act_quant(out="f8")): contract, routing, the layer op's dispatch ----------------

def _pre_expanded(m, n, k, r, g):
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    ops, lowrank, bias = _operands(m, n, k, r, g, "int4_g64")
    x8, xab = expand_act_f8(ops["x_q"], ops["x_scale"], g)
    return dict(ops, x_q=x8, x_scale=xab), lowrank, bias


def test_pre_expanded_contract_errors():
    """check_gemm_args takes (e4m3 [M, K], xab fp32 [K/G, 2, M]) for int4_g64 and names what is wrong otherwise;
    v1 (its launcher and impl="v1") and a device without the e4m3 kernels refuse them."""
    from lowrank_gemm.kernels.w4a4_gemm import check_gemm_args
    m, n, k, g = 6, 24, 256, 64
    ops, lowrank, bias = _pre_expanded(m, n, k, 16, g)
    args = lambda **o: {**ops, **o}  # noqa: E731
    gemm_args = ("x_q", "x_scale", "w_q", "w_scale", "w_mul")
    assert check_gemm_args(*(ops[a] for a in gemm_args), *lowrank, bias, g, "int4_g64") == (m, n, k, 16)
    with pytest.raises(ValueError, match=r"xab float32 \[K/G, 2, M\] = \[4, 2, 6\]"):
        check_gemm_args(*(args(x_scale=ops["x_scale"][:, 0].contiguous())[a] for a in gemm_args), *lowrank, bias, g,
                        "int4_g64")
    with pytest.raises(ValueError, match="xab float32"):
        check_gemm_args(*(args(x_scale=ops["x_scale"].half())[a] for a in gemm_args), *lowrank, bias, g, "int4_g64")
    with pytest.raises(ValueError, match=r"pre-expanded activations must be float8_e4m3fn \[M, 256\]"):
        check_gemm_args(*(args(x_q=ops["x_q"][:, :128].contiguous())[a] for a in gemm_args), *lowrank, bias, g,
                        "int4_g64")
    with pytest.raises(ValueError, match="int4_2l activations must be int8"):
        check_gemm_args(ops["x_q"], ops["x_scale"], ops["w_q"], torch.ones(n), torch.ones(k // g, n, dtype=torch.uint8),
                        *lowrank, bias, g, "int4_2l")
    out = torch.empty(m, n)
    with pytest.raises(ValueError, match="v1 takes packed int4"):
        launch_w4a4_v1(*(ops[a] for a in gemm_args), *lowrank, bias, out, "int4_g64", g)
    for impl in ("v1", "auto"):   # auto on the CPU: no e4m3 kernel to route to
        with pytest.raises(ValueError, match="run only on the e4m3 paths"):
            w4a4_gemm(ops["x_q"], ops["x_scale"], ops["w_q"], ops["w_scale"], *lowrank, bias, impl=impl)


def test_layer_f8_decision(monkeypatch):
    """The layer op asks for the e4m3 operands (default on; LOWRANK_GEMM_ACT_QUANT_F8=0 turns it off) only where the GEMM it
    routes to runs its e4m3 path at no loss: decode with decode_f8_default(), v2 with f8_default() where xab
    keeps the scale TMA the packed scales would get; never v1 (the CPU route)."""
    import lowrank_gemm.kernels.w4a4_gemm as g
    from lowrank_gemm.kernels.gluon.w4a4_ws import scale_tma_ok
    cuda = torch.device("cuda")
    ws = torch.ones(4096 // 64, 256, dtype=torch.bfloat16)
    want = lambda m, impl="auto", dev=cuda: g._layer_wants_f8(impl, "int4_g64", m, 256, 4096, 32, 64, dev,  # noqa: E731
                                                              torch.bfloat16, ws)
    monkeypatch.delenv("LOWRANK_GEMM_ACT_QUANT_F8", raising=False)
    monkeypatch.setenv("LOWRANK_GEMM_DECODE_F8", "1")
    assert g.ACT_QUANT_F8_DEFAULT and want(1, "decode")                             # on by default
    monkeypatch.setenv("LOWRANK_GEMM_ACT_QUANT_F8", "0")
    assert not want(1, "decode")
    monkeypatch.setenv("LOWRANK_GEMM_ACT_QUANT_F8", "1")
    assert want(1, "decode") and want(16, "decode")
    assert not want(16, "auto", torch.device("cpu"))                                # v1
    assert not g._layer_wants_f8("decode", "int4_2l", 1, 256, 4096, 32, 64, cuda, torch.bfloat16, ws)
    monkeypatch.setenv("LOWRANK_GEMM_DECODE_F8", "0")
    assert not want(1, "decode")                                                    # the int8 decode path
    for m in (5, 16, 64):   # v2: only where xab keeps whatever scale TMA the packed scales would have
        xab, packed = torch.empty(64, 2, m, device="meta"), torch.empty(64, m, dtype=torch.bfloat16, device="meta")
        assert want(m, "v2") == (scale_tma_ok(xab, ws, None, "int4_g64") or not scale_tma_ok(packed, ws, None,
                                                                                             "int4_g64"))
    monkeypatch.setenv("LOWRANK_GEMM_ACT_QUANT_F8", "0")
    assert not want(5, "v2")


def test_layer_dispatch_pre_expanded(monkeypatch):
    """Interpreter path of the layer op with the switch on: act_quant hands the decode launcher (here a CPU
    stand-in that checks the xab rows, repacks, and runs v1) the e4m3 operands; the output is bit-identical
    to the switch-off call, which hands it the packed ones."""
    import lowrank_gemm.kernels.w4a4_gemm as g
    from lowrank_gemm.kernels.gluon import w4a4_decode
    seen = []

    def decode_on_cpu(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt, group_size, config,
                      _dims=None, f8=None):
        seen.append(x_q.dtype)
        assert f8 is (True if x_q.dtype == torch.float8_e4m3fn else None)     # e4m3 operands pin the e4m3 path
        if x_q.dtype == torch.float8_e4m3fn:
            q = x_q.float()
            xs = x_scale[:, 0, :] / 512
            r = q.reshape(q.shape[0], -1, group_size).sum(-1).t()
            assert torch.equal(x_scale[:, 1, :].nan_to_num(7.0), (-8 * r * xs).nan_to_num(7.0))
            x_q, x_scale = pack_int4(q.to(torch.int8)), xs.to(w_scale.dtype)
        return launch_w4a4_v1(x_q, x_scale, w_q, w_scale, w_mul, lowrank_act, lora_up, bias, out, fmt, group_size,
                              config)

    monkeypatch.setattr(g, "_decode_route", lambda impl, m, n, fmt, device, pre_expanded=False: True)
    monkeypatch.setattr(w4a4_decode, "launch_w4a4_decode", decode_on_cpu)
    monkeypatch.setenv("LOWRANK_GEMM_DECODE_F8", "1")
    x, p = _layer(5, 40, 256, 16, 64, "int4_g64")
    x[1, 3] = float("nan")
    monkeypatch.setenv("LOWRANK_GEMM_ACT_QUANT_F8", "0")
    ref = w4a4_linear(x, group_size=64, out_dtype=torch.float32, **p)
    monkeypatch.setenv("LOWRANK_GEMM_ACT_QUANT_F8", "1")
    got = w4a4_linear(x, group_size=64, out_dtype=torch.float32, **p)
    assert seen == [torch.uint8, torch.float8_e4m3fn]
    assert torch.equal(got.nan_to_num(7.0), ref.nan_to_num(7.0)) and torch.isnan(got[1]).all()
