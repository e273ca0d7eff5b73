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
    assert plan_act_quant(4608, 3072, 64, block_k=128, variant="v1").block_k == 128
    assert plan_act_quant(1, 4096, 64).block_k == 64
    assert plan_act_quant(4608, 320, 64).block_k == 64  # 320 = 5 groups: only G divides it


# --- v2 (cheap per-element path + exact fallback): same bits as the torch quantizers ------------------

def _check_formats(fmt, x_q, x_scale, xs, g):
    if fmt == "int4_g64":
        q_ref, sc_ref = quantize_act_int4(xs, g)
        assert torch.equal(x_q, pack_int4(q_ref))
        assert torch.equal(x_scale.float().nan_to_num(7.0), sc_ref.float().nan_to_num(7.0))
    else:
        e_ref, t_ref = quantize_act_2l(xs, g)
        assert torch.equal(x_q, e_ref) and torch.equal(x_scale.nan_to_num(7.0), t_ref.nan_to_num(7.0))


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("m,k,g,r,split,dtype", [
    (37, 192, 64, 16, 1, torch.float16), (20, 320, 64, 32, 3, torch.float16), (5, 256, 128, 0, 2, torch.float16),
    (33, 256, 64, 32, 4, torch.bfloat16), (17, 128, 64, 0, 1, torch.bfloat16)])
def test_v2_bit_identical(fmt, m, k, g, r, split, dtype):
    """Ragged M, K slices, r ∈ {0, 16, 32}: v2 == torch quantizer bit for bit, S vs float64, deterministic
    (bf16 X: the interpreter's pieces are fp32 because its bf16 dot is wrong)."""
    x, smooth, down = _inputs(m, k, r, dtype)
    out = act_quant(x, smooth, down, g, fmt, split=split, block_m=16, variant="v2")
    _check_formats(fmt, out[0], out[1], x.float() / smooth.float(), g)
    _check_lowrank(out[2], x, smooth, down)
    assert torch.equal(out[2], act_quant(x, smooth, down, g, fmt, split=split, block_m=16, variant="v2")[2])


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
def test_v2_fallback_cases_bit_identical(fmt):
    """Steps outside the fast path's range rerun v1's exact code: NaN, ±Inf, all-zero groups, tiny and
    huge groups, λ outside [2⁻³⁰, 2³⁰] — same bits as the torch quantizer, NaN S only on NaN/Inf rows."""
    x, smooth, down = _inputs(40, 256, 16)
    x = x.float()
    x[1, 5] = float("nan")
    x[2, 100] = float("inf")
    x[3, 64:] = 0
    x[5, :64] *= 2.0 ** -100     # tiny group (products and remainders near the fp32 underflow)
    x[6, 128:192] *= 2.0 ** 100  # huge group
    x[7] = 0                     # all-zero row (2l: t = 1)
    smooth = smooth.float()
    smooth[200] = 2.0 ** -40     # 1/λ outside the fast range → that step is exact
    x16 = x.to(torch.bfloat16)   # bf16 keeps the tiny/huge values representable
    xs = x16.float() / smooth.float()
    q, sc, s = act_quant(x16, smooth, down, 64, fmt, split=2, block_m=16, variant="v2")
    _check_formats(fmt, q, sc, xs, 64)
    assert torch.isnan(s[1]).all() and torch.isfinite(s[8:]).all()


def test_v2_plan_defaults():
    from lowrank_gemm.kernels.act_quant import plan_act_quant
    assert plan_act_quant(4608, 3072, 64).variant == "v2"
    assert plan_act_quant(1, 4096, 64).variant == "v1"
    p = plan_act_quant(4608, 3072, 64, variant="v2", block_k=128)
    assert p.block_k == 64 and p.split * p.steps_per_slice >= 48  # v2 always steps one group
    assert plan_act_quant(4608, 3072, 64, variant="v1").variant == "v1"
    assert plan_act_quant(4608, 3072, 32, variant="v2").variant == "v1"  # the packed halves need G % 64 == 0
    with pytest.raises(ValueError, match="variant"):
        plan_act_quant(64, 128, 64, variant="v3")


def test_v2_sm90_ptx_uses_wgmma_and_fma():
    """The S MMAs read X as bf16 (wgmma); the divisions became mul + two fma.rn (no div.rn in the fast
    path; the exact fallback keeps div.rn)."""
    from lowrank_gemm.kernels.aot import compile_sm90
    sig = dict(x_ptr="*bf16", stride_xm="i32", smooth_ptr="*bf16", rl_ptr="*fp32", q_ptr="*u8", stride_qm="i32",
               sc_ptr="*bf16", stride_sg="i32", p_ptr="*bf16", stride_pp="i32", sp_ptr="*fp32", stride_sps="i32",
               stride_spm="i32", M="i32", K="i32", R="i32", STEPS_PER_SLICE="i32")
    info = compile_sm90("lowrank_gemm.kernels.act_quant", "_act_quant_g_v2_kernel", sig,
                        dict(G=64, BLOCK_M=64, BLOCK_R=32, HAS_LOWRANK=True, SCALE_BF16=True, SHIFT=8, EMU_FMA=False),
                        aligned=("x_ptr", "stride_xm", "q_ptr", "stride_qm", "p_ptr", "stride_pp"), num_warps=4)
    assert info.has("wgmma", "bf16", "fma.rn.f32")


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("m,k", [(300, 3072), (4608, 3072), (1, 4096), (130, 12288)])
def test_v2_gpu_bit_identical(fmt, m, k):
    """bf16 X, real sizes: v2 (bf16 MMA pieces, fma divisions) == torch quantizer on the GPU, S vs float64."""
    dev = torch.device("cuda")
    x = (torch.randn(m, k, device=dev) * torch.exp(torch.randn(k, device=dev) * 0.5)).to(torch.bfloat16)
    smooth = (torch.rand(k, device=dev) + 0.5).to(torch.bfloat16)
    down = (torch.randn(32, k, device=dev) * 0.02).to(torch.bfloat16)
    q, sc, s = act_quant(x, smooth, down, 64, fmt, variant="v2")
    xs = x.float() / smooth.float()
    _check_formats(fmt, q, sc, xs, 64)
    ref = xs.double() @ down.double().T
    assert ((s.double() - ref).norm() / ref.norm()).item() < 2e-5
    assert torch.equal(s, act_quant(x, smooth, down, 64, fmt, variant="v2")[2])
