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


# M ≤ 64 defaults to the fused single launch; "v1" is the old split path (still selectable)
SMALL_VARIANTS = pytest.mark.parametrize("variant", ["v1", "fused"])


@SMALL_VARIANTS
@pytest.mark.parametrize("m,k,g,r", [(37, 192, 64, 16), (5, 256, 128, 23), (33, 128, 64, 0), (20, 256, 64, 64)])
def test_int4_g64_bit_identical(m, k, g, r, variant):
    x, smooth, down = _inputs(m, k, r)
    x_q, x_scale, s = act_quant(x, smooth, down, g, "int4_g64", variant=variant)
    q_ref, sc_ref = quantize_act_int4(x.float() / smooth.float(), g)
    assert x_q.dtype == torch.uint8 and x_q.shape == (m, k // 2)
    assert torch.equal(x_q, pack_int4(q_ref))
    assert x_scale.dtype == torch.bfloat16 and torch.equal(x_scale, sc_ref)
    _check_lowrank(s, x, smooth, down)


@SMALL_VARIANTS
def test_int4_g64_fp16_scales_bf16_input(variant):
    x, smooth, down = _inputs(19, 128, 32, torch.bfloat16)
    x_q, x_scale, s = act_quant(x, smooth, down, 64, "int4_g64", torch.float16, variant=variant)
    q_ref, sc_ref = quantize_act_int4(x.float() / smooth.float(), 64, torch.float16)
    assert torch.equal(x_q, pack_int4(q_ref)) and torch.equal(x_scale, sc_ref)
    _check_lowrank(s, x, smooth, down)


@SMALL_VARIANTS
@pytest.mark.parametrize("m,k,g,r", [(37, 192, 64, 32), (6, 256, 128, 23), (17, 128, 64, 0)])
def test_int4_2l_bit_identical(m, k, g, r, variant):
    x, smooth, down = _inputs(m, k, r)
    x_q, t, s = act_quant(x, smooth, down, g, "int4_2l", variant=variant)
    e_ref, t_ref = quantize_act_2l(x.float() / smooth.float(), g)
    assert x_q.dtype == torch.int8 and torch.equal(x_q, e_ref)
    assert t.dtype == torch.float32 and torch.equal(t, t_ref)
    _check_lowrank(s, x, smooth, down)


@SMALL_VARIANTS
@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
def test_nan_inf_and_zero_groups(fmt, variant):
    """NaN in a group → scale NaN, ±Inf → scale +Inf, q = 0 there (the torch quantizers' contract)."""
    x, smooth, down = _inputs(20, 128, 16)
    x[1, 5] = float("nan")
    x[2, 100] = float("inf")
    x[3, 64:] = 0
    x_q, x_scale, s = act_quant(x, smooth, down, 64, fmt, variant=variant)
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


@SMALL_VARIANTS
@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("split,bm", [(1, 16), (3, 16), (64, 32)])
def test_k_split_matches_and_is_deterministic(fmt, split, bm, variant):
    """K split over programs (decode path): same bits as the torch quantizer for any split; S partials
    summed in fixed order, so two calls agree bit for bit."""
    x, smooth, down = _inputs(5, 320, 24)
    x_q, x_scale, s = act_quant(x, smooth, down, 64, fmt, split=split, block_m=bm, variant=variant)
    xs = x.float() / smooth.float()
    if fmt == "int4_g64":
        q_ref, sc_ref = quantize_act_int4(xs, 64)
        assert torch.equal(x_q, pack_int4(q_ref)) and torch.equal(x_scale, sc_ref)
    else:
        e_ref, t_ref = quantize_act_2l(xs, 64)
        assert torch.equal(x_q, e_ref) and torch.equal(x_scale, t_ref)
    _check_lowrank(s, x, smooth, down)
    assert torch.equal(s, act_quant(x, smooth, down, 64, fmt, split=split, block_m=bm, variant=variant)[2])


@SMALL_VARIANTS
@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("g,bk,split,bm", [(64, 256, 1, 32), (64, 128, 2, 16), (128, 256, 1, 16)])
def test_wide_steps_bit_identical(fmt, g, bk, split, bm, variant):
    """Large-M plan: several groups per step (block_k = 2–4 groups) must give the same bits."""
    x, smooth, down = _inputs(37, 512, 20)
    x[4, 70] = float("nan")
    x_q, x_scale, s = act_quant(x, smooth, down, g, fmt, split=split, block_m=bm, block_k=bk, variant=variant)
    _check_formats(fmt, x_q, x_scale, x.float() / smooth.float(), g)
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


@pytest.mark.parametrize("variant", ["v2", "v3"])
@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("m,k,g,r,split,dtype", [
    (37, 192, 64, 16, 1, torch.float16), (20, 320, 64, 32, 3, torch.float16), (5, 256, 128, 0, 2, torch.float16),
    (33, 256, 64, 32, 4, torch.bfloat16), (17, 128, 64, 0, 1, torch.bfloat16)])
def test_v2_bit_identical(fmt, m, k, g, r, split, dtype, variant):
    """Ragged M, K slices, r ∈ {0, 16, 32}: v2 == torch quantizer bit for bit, S vs float64, deterministic
    (bf16 X: the interpreter's pieces are fp32 because its bf16 dot is wrong)."""
    x, smooth, down = _inputs(m, k, r, dtype)
    out = act_quant(x, smooth, down, g, fmt, split=split, block_m=16, variant=variant)
    _check_formats(fmt, out[0], out[1], x.float() / smooth.float(), g)
    _check_lowrank(out[2], x, smooth, down)
    assert torch.equal(out[2], act_quant(x, smooth, down, g, fmt, split=split, block_m=16, variant=variant)[2])


@pytest.mark.parametrize("variant", ["v2", "v3"])
@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
def test_v2_fallback_cases_bit_identical(fmt, variant):
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
    q, sc, s = act_quant(x16, smooth, down, 64, fmt, split=2, block_m=16, variant=variant)
    _check_formats(fmt, q, sc, xs, 64)
    assert torch.isnan(s[1]).all() and torch.isfinite(s[8:]).all()


# --- v3 (large M): v2's fast path in the loop, the exact redo of a slice after it ----------------------

@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("m,k,g,r,split,bad", [
    (37, 320, 64, 32, 2, "nan"), (21, 256, 128, 16, 1, "tiny"), (50, 192, 64, 0, 3, "none"),
    (33, 384, 128, 23, 3, "inf_zero")])
def test_v3_poisoned_ragged_same_as_v2(poisoned, fmt, m, k, g, r, split, bad):
    """Ragged M/K, G 64/128, r ∈ {0, 16, 23, 32}, bad groups in only some slices (the others keep their
    fast-path bytes, the bad slice is redone): every element written, bytes == torch quantizer, outputs
    == v2 (S bit for bit: same MMAs), repeat bit-identical."""
    x, smooth, down = _inputs(m, k, r)
    if bad == "nan":
        x[3, k - 5] = float("nan")        # last slice only
    elif bad == "tiny":
        x = x.float()
        x[4, :g] *= 2.0 ** -100
        x = x.to(torch.bfloat16)
    elif bad == "inf_zero":
        x[2, 7] = float("inf")
        x[9, g:2 * g] = 0
    out = act_quant(x, smooth, down, g, fmt, split=split, block_m=16, variant="v3")
    _check_formats(fmt, out[0], out[1], x.float() / smooth.float(), g)
    ref = act_quant(x, smooth, down, g, fmt, split=split, block_m=16, variant="v2")
    again = act_quant(x, smooth, down, g, fmt, split=split, block_m=16, variant="v3")
    for a, b, c in zip(out, ref, again):
        if a.is_floating_point():
            a, b, c = a.nan_to_num(7.0), b.nan_to_num(7.0), c.nan_to_num(7.0)
        assert torch.equal(a, b) and torch.equal(a, c)
    rows = torch.isfinite(x.float()).all(1)
    if r:
        assert not torch.isnan(out[2][rows]).any()
        _check_lowrank(out[2][rows], x[rows], smooth, down)


def test_v3_plan(monkeypatch):
    import lowrank_gemm.kernels.act_quant as aq
    assert aq.plan_act_quant(4608, 3072, 64).variant == "v3"  # measured faster on the H200 (session 4)
    p = aq.plan_act_quant(4608, 3072, 64, variant="v3")
    assert p.variant == "v3" and p.block_k == 64 and p.split * p.steps_per_slice >= 48
    big = aq.plan_act_quant(4608, 12288, 64, variant="v3")   # ≤ V3_MAX_STEPS steps per slice at large K
    assert big.steps_per_slice <= aq.V3_MAX_STEPS and big.split * big.steps_per_slice >= 192
    monkeypatch.setattr(aq, "_ENV_LARGE", "v2")
    assert aq.plan_act_quant(4608, 3072, 64).variant == "v2"
    assert aq.plan_act_quant(4608, 3072, 32, variant="v3").variant == "v1"  # packed halves: G % 64 == 0
    monkeypatch.setattr(aq, "_ENV_LARGE", "v3")
    assert aq.plan_act_quant(4608, 3072, 64).variant == "v3"
    assert aq.plan_act_quant(64, 3072, 64, fmt="int4_2l").variant == "fused"  # M ≤ 64 untouched


@pytest.mark.parametrize("kernel", ["_act_quant_g_v3_kernel", "_act_2l_stats_v3_kernel", "_act_2l_quant_v3_kernel"])
def test_v3_sm90_no_spills(kernel):
    """sm_90 (ptxas): no spills, ≤ 168 registers (v2 g64: 199–243), 16-byte λ / 1/λ loads."""
    import os
    import re
    import subprocess
    import tempfile
    import triton
    from lowrank_gemm.kernels.aot import compile_sm90
    common = dict(x_ptr="*bf16", stride_xm="i32", smooth_ptr="*bf16", rl_ptr="*fp32")
    al = ("x_ptr", "stride_xm", "smooth_ptr", "rl_ptr")
    if kernel == "_act_quant_g_v3_kernel":
        sig = dict(common, q_ptr="*u8", stride_qm="i32", sc_ptr="*bf16", stride_sg="i32", p_ptr="*bf16",
                   stride_pp="i32", sp_ptr="*fp32", stride_sps="i32", stride_spm="i32", M="i32", K="i32", R="i32",
                   STEPS_PER_SLICE="i32")
        ce = dict(G=64, BLOCK_M=64, BLOCK_R=32, HAS_LOWRANK=True, SCALE_BF16=True, SHIFT=8, EMU_FMA=False)
        al += ("q_ptr", "stride_qm", "p_ptr", "stride_pp", "sp_ptr", "stride_spm", "sc_ptr")
    elif kernel == "_act_2l_stats_v3_kernel":
        sig = dict(common, p_ptr="*bf16", stride_pp="i32", sp_ptr="*fp32", stride_sps="i32", stride_spm="i32",
                   ap_ptr="*fp32", stride_aps="i32", M="i32", K="i32", R="i32", STEPS_PER_SLICE="i32")
        ce = dict(BLOCK_M=64, BLOCK_K=64, BLOCK_R=32, HAS_LOWRANK=True, SHIFT=8, EMU_FMA=False)
        al += ("p_ptr", "stride_pp", "sp_ptr", "stride_spm")
    else:
        sig = dict(common, e_ptr="*i8", stride_em="i32", t_ptr="*fp32", ap_ptr="*fp32", stride_aps="i32",
                   M="i32", K="i32", SPLIT="i32", STEPS_PER_SLICE="i32")
        ce = dict(G=64, BLOCK_M=64, SPLIT_P2=8, EMU_FMA=False)
        al += ("e_ptr", "stride_em")
    info = compile_sm90("lowrank_gemm.kernels.act_quant", kernel, sig, ce, aligned=al, num_warps=4)
    if "grid" not in kernel and "stats" not in kernel and "quant_v3" not in kernel:
        assert info.has("wgmma")
    assert "ld.global.v4" in info.ptx or "ld.global.nc.v4" in info.ptx
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        open(src, "w").write(info.ptx)
        res = subprocess.run([ptxas, "-arch=sm_90a", "-v", src, "-o", os.path.join(d, "k.cubin")],
                             capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "0 bytes spill stores" in res.stderr and "0 bytes spill loads" in res.stderr
    regs = int(re.search(r"Used (\d+) registers", res.stderr).group(1))
    assert regs <= 168, regs


def test_plan_defaults():
    from lowrank_gemm.kernels.act_quant import plan_act_quant
    assert plan_act_quant(4608, 3072, 64).variant == "v3"
    assert plan_act_quant(1, 4096, 64).variant == "fused"
    assert plan_act_quant(64, 4096, 64, fmt="int4_2l").variant == "fused"
    assert plan_act_quant(65, 4096, 64, fmt="int4_2l").variant == "v3"
    # int4_g64 above M = 16 (probes/s10/actquant_midm): the rank-split fused plan while M·K is small, v3 at large K
    # or where v1's last 16-row block would be partial, v1 otherwise
    assert plan_act_quant(16, 4096, 64).variant == "fused" and plan_act_quant(16, 4096, 64).s_ranks >= 1
    for m, k, want in [(17, 4096, "fused"), (48, 4096, "fused"), (64, 3072, "fused"), (24, 8192, "fused"),
                       (64, 4096, "v1"), (32, 8192, "v1"), (40, 8192, "v3"), (17, 14336, "v3"), (64, 14336, "v3"),
                       (17, 12288, "v3")]:
        p = plan_act_quant(m, k, 64)
        assert p.variant == want, (m, k, p)
        if want == "fused":
            assert p.s_ranks >= 1, (m, k, p)   # rank-split S, not the ticket path
    assert plan_act_quant(17, 4096, 64, fmt="int4_2l").variant == "fused"
    assert plan_act_quant(17, 4096, 64, s_ranks=0).s_ranks == 0   # an explicit S mode wins
    p = plan_act_quant(4608, 3072, 64, variant="v2", block_k=128)
    assert p.block_k == 64 and p.split * p.steps_per_slice >= 48  # v2 always steps one group
    assert plan_act_quant(4608, 3072, 64, variant="v1").variant == "v1"
    assert plan_act_quant(4608, 3072, 32, variant="v2").variant == "v1"  # the packed halves need G % 64 == 0
    with pytest.raises(ValueError, match="variant"):
        plan_act_quant(64, 128, 64, variant="v9")


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
@pytest.mark.parametrize("variant", ["v2", "v3"])
@pytest.mark.parametrize("m,k", [(300, 3072), (4608, 3072), (1, 4096), (130, 12288)])
def test_v2_gpu_bit_identical(fmt, m, k, variant):
    """bf16 X, real sizes: v2 (bf16 MMA pieces, fma divisions) == torch quantizer on the GPU, S vs float64."""
    dev = torch.device("cuda")
    x = (torch.randn(m, k, device=dev) * torch.exp(torch.randn(k, device=dev) * 0.5)).to(torch.bfloat16)
    smooth = (torch.rand(k, device=dev) + 0.5).to(torch.bfloat16)
    down = (torch.randn(32, k, device=dev) * 0.02).to(torch.bfloat16)
    q, sc, s = act_quant(x, smooth, down, 64, fmt, variant=variant)
    xs = x.float() / smooth.float()
    _check_formats(fmt, q, sc, xs, 64)
    ref = xs.double() @ down.double().T
    assert ((s.double() - ref).norm() / ref.norm()).item() < 2e-5
    assert torch.equal(s, act_quant(x, smooth, down, 64, fmt, variant=variant)[2])


# --- fused: one launch for decode (S programs with a ticketed fixed-order sum + quant units) -----------

class _PoisonedTorch:
    """Stands in for ``torch`` inside act_quant: every ``empty`` comes back poisoned (float NaN, int8 −128
    which no q·v can be, uint8 0xA5), so an element the kernel never writes fails the comparison."""

    _FILL = {torch.int8: -128, torch.uint8: 0xA5}

    def __getattr__(self, name):
        return getattr(torch, name)

    def empty(self, *shape, dtype=None, **kw):
        t = torch.empty(*shape, dtype=dtype, **kw)
        return t.fill_(float("nan") if t.is_floating_point() else self._FILL.get(t.dtype, 0x5A))


@pytest.fixture
def poisoned(monkeypatch):
    import lowrank_gemm.kernels.act_quant as aq
    monkeypatch.setattr(aq, "torch", _PoisonedTorch())


def _tickets_zero():
    from lowrank_gemm.kernels.act_quant import _TICKETS
    return all(int(t.abs().sum()) == 0 for t in _TICKETS.values())


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("m,k,r,split,s_ranks", [   # s_ranks None: the plan's S mode (rank-split at M ≤ 16); 0: ticket
    (1, 320, 32, None, None), (1, 320, 32, None, 0), (5, 192, 16, None, None), (16, 256, 32, 2, None),
    (16, 256, 32, 2, 0), (37, 320, 0, None, None), (64, 128, 32, None, None), (3, 128, 16, 1, None),
    (3, 128, 16, 1, 0)])
def test_fused_poisoned_ragged(poisoned, fmt, m, k, r, split, s_ranks):
    """Ragged M/K, r ∈ {0, 16, 32}, split 1 (S stored directly) and > 1 (ticketed sum), both S modes: every
    output element written, bytes == torch quantizer, S vs float64, repeat bit-identical, tickets at 0."""
    x, smooth, down = _inputs(m, k, r)
    out = act_quant(x, smooth, down, 64, fmt, split=split, variant="fused", s_ranks=s_ranks)
    _check_formats(fmt, out[0], out[1], x.float() / smooth.float(), 64)
    assert not torch.isnan(out[1]).any() and not torch.isnan(out[2]).any()
    _check_lowrank(out[2], x, smooth, down)
    again = act_quant(x, smooth, down, 64, fmt, split=split, variant="fused", s_ranks=s_ranks)
    assert all(torch.equal(a, b) for a, b in zip(out, again))
    assert _tickets_zero()


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("m,k,r,sr,rb", [(1, 320, 32, 1, 1), (7, 320, 23, 2, 2), (13, 192, 5, 4, 4), (3, 128, 16, 8, 1),
                                         (20, 256, 32, 1, 8), (2, 64, 0, 1, 1)])
def test_fused_rank_s_poisoned(poisoned, monkeypatch, fmt, m, k, r, sr, rb):
    """Rank-split S (SR rows × RB ranks per program over all of K): ragged M / r (r % RB ≠ 0, r = 0),
    several unrolled K chunks with a masked tail (the chunk tile shrunk so K = 320 needs 3 chunks),
    NaN / Inf / zero rows; every element written, exact bytes, S vs float64, repeat bit-identical."""
    import lowrank_gemm.kernels.act_quant as aq
    monkeypatch.setattr(aq, "_RANK_TILE_ELEMS", 256)
    x, smooth, down = _inputs(m, k, r)
    if m >= 7:
        x[1, 5] = float("nan")
        x[2, 30] = float("inf")
        x[3] = 0
    plan = aq.plan_act_quant(m, k, 64, fmt=fmt, rank=r, variant="fused", s_rows=sr, s_ranks=rb)
    assert (plan.s_rows, plan.s_ranks) == (sr, rb)
    out = act_quant(x, smooth, down, 64, fmt, variant="fused", s_rows=sr, s_ranks=rb)
    _check_formats(fmt, out[0], out[1], x.float() / smooth.float(), 64)
    again = act_quant(x, smooth, down, 64, fmt, variant="fused", s_rows=sr, s_ranks=rb)
    assert all(torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) if a.is_floating_point() else torch.equal(a, b)
               for a, b in zip(out, again))
    assert out[2].shape == (m, r)
    if m >= 7:
        if r:
            assert torch.isnan(out[2][1]).all()
        _check_lowrank(out[2][3:], x[3:], smooth, down)
    else:
        assert not torch.isnan(out[2]).any()
        _check_lowrank(out[2], x, smooth, down)


def test_fused_s_mode_plan(monkeypatch):
    """Default S mode: rank-split for M ≤ 16, ticket above; the env var pins it; bad values are errors."""
    import lowrank_gemm.kernels.act_quant as aq
    p = aq.plan_act_quant
    assert (p(1, 4096, 64, variant="fused").s_rows, p(1, 4096, 64, variant="fused").s_ranks) == (1, 1)
    assert p(16, 4096, 64, variant="fused").s_ranks == 1 and p(64, 4096, 64, variant="fused").s_ranks == 0
    assert p(1, 4096, 64, variant="fused", s_ranks=0).s_ranks == 0
    assert p(64, 4096, 64, variant="fused", s_ranks=2).s_ranks == 2
    assert aq._rank_chunks(4096, 1, 1) == (4096, 1) and aq._rank_chunks(12288, 2, 1) == (2048, 6)
    monkeypatch.setattr(aq, "_ENV_FUSED_S", "ticket")
    assert p(1, 4096, 64, variant="fused").s_ranks == 0
    monkeypatch.setattr(aq, "_ENV_FUSED_S", "rank")
    assert p(64, 4096, 64, variant="fused").s_ranks == 1
    monkeypatch.setattr(aq, "_ENV_FUSED_S", "bogus")
    with pytest.raises(ValueError, match="FUSED_S"):
        p(1, 4096, 64, variant="fused")
    with pytest.raises(ValueError, match="powers of two"):
        p(1, 4096, 64, variant="fused", s_rows=3, s_ranks=1)


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
def test_fused_arrival_order_does_not_change_bits(fmt):
    """The interpreter runs programs in order, so program SPLIT−1 always arrives last; rotating which
    program owns which slice makes a different slice's program the elector: S must not change a bit."""
    x, smooth, down = _inputs(21, 384, 24)
    ref = act_quant(x, smooth, down, 64, fmt, split=6, variant="fused")
    for rot in (1, 4):
        out = act_quant(x, smooth, down, 64, fmt, split=6, variant="fused", _slice_rot=rot)
        assert all(torch.equal(a, b) for a, b in zip(ref, out))
    _check_lowrank(ref[2], x, smooth, down)
    assert _tickets_zero()


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("qm,qk,g,bm", [(2, 64, 64, 16), (4, 128, 64, 32), (1, 256, 128, 16), (1, 512, 64, 16)])
def test_fused_quant_units(poisoned, fmt, qm, qk, g, bm):
    """Quant units of several rows / a chunk wider than K / G = 128; NaN, Inf and zero rows inside."""
    x, smooth, down = _inputs(13, 384, 16)
    x[1, 5] = float("nan")
    x[2, 300] = float("inf")
    x[3] = 0
    out = act_quant(x, smooth, down, g, fmt, block_m=bm, quant_rows=qm, quant_cols=qk, variant="fused")
    _check_formats(fmt, out[0], out[1], x.float() / smooth.float(), g)
    assert torch.isnan(out[2][1]).all() and torch.isfinite(out[2][3:]).all()
    _check_lowrank(out[2][3:], x[3:], smooth, down)


def test_fused_bf16_input_fp16_scales(poisoned):
    x, smooth, down = _inputs(9, 256, 32, torch.bfloat16)
    q, sc, _ = act_quant(x, smooth, down, 64, "int4_g64", torch.float16, variant="fused")
    q_ref, sc_ref = quantize_act_int4(x.float() / smooth.float(), 64, torch.float16)
    assert torch.equal(q, pack_int4(q_ref)) and torch.equal(sc, sc_ref)


def test_fused_plan():
    from lowrank_gemm.kernels.act_quant import _FUSED_SUM_ELEMS, plan_act_quant
    for fmt in ("int4_g64", "int4_2l"):
        for m in (1, 16, 64):
            for k in (3072, 4096):
                p = plan_act_quant(m, k, 64, fmt=fmt, rank=32, variant="fused")
                assert p.variant == "fused" and p.steps_per_slice == 1  # no serial K loop in an S program
                assert triton_p2(p.split) * min(16, triton_p2(m)) * 32 <= _FUSED_SUM_ELEMS
                assert p.block_k <= 128 and p.quant_rows == 1 and p.quant_cols % 64 == 0
    assert plan_act_quant(1, 4096, 64).split == 64
    assert plan_act_quant(64, 4096, 64, split=5).split == 5
    assert plan_act_quant(8, 4096, 64, variant="v1").variant == "v1"
    with pytest.raises(ValueError, match="quant_cols"):
        plan_act_quant(8, 4096, 64, quant_cols=96)


def triton_p2(v):
    import triton
    return triton.next_power_of_2(v)


def _fused_signature(q: str, sc: str, cnt: str) -> dict:
    """sm_90 signature of ``_act_quant_fused_kernel`` (``q``/``sc``/``cnt``: the format-dependent pointer types)."""
    return dict(x_ptr="*bf16", stride_xm="i32", smooth_ptr="*bf16", q_ptr=q, stride_qm="i32", sc_ptr=sc,
                stride_sg="i32", a_ptr="*bf16", stride_ar="i32", sp_ptr="*fp32", stride_sps="i32", stride_spm="i32",
                s_ptr="*fp32", stride_sm="i32", cnt_ptr=cnt, M="i32", K="i32", R="i32", SPLIT="i32",
                STEPS_PER_SLICE="i32", N_SPROG="i32", QS="i32", ROT="i32")


def test_fused_sm90_ptx_ticket():
    """sm_90: one acq_rel gpu-scope ticket add + a relaxed reset (no other atomics), S via mma."""
    from lowrank_gemm.kernels.aot import compile_sm90
    sig = _fused_signature(q="*i8", sc="*fp32", cnt="*i32")
    ce = dict(TWO_LEVEL=True, G=64, BLOCK_M=16, BLOCK_K=128, BLOCK_R=32, SPLIT_P2=32, SUM_ROWS=16, QM=1, QK=2048,
              CH=4096, SCALE_BF16=True)
    info = compile_sm90("lowrank_gemm.kernels.act_quant", "_act_quant_fused_kernel", sig, ce,
                        aligned=("x_ptr", "stride_xm", "q_ptr", "stride_qm", "a_ptr", "stride_ar"), num_warps=4)
    atoms = [ln for ln in info.ptx.splitlines() if "atom." in ln]
    assert len(atoms) == 2 and "gpu.acq_rel.add" in atoms[0] and "relaxed.exch" in atoms[1], atoms
    assert info.has("mma.sync", "div.rn.f32")


def test_fused_rank_sm90_ptx():
    """sm_90, rank-split S: no atomics, no MMA (plain FMAs), 16-byte vector loads of X / A / λ."""
    from lowrank_gemm.kernels.aot import compile_sm90
    sig = _fused_signature(q="*u8", sc="*bf16", cnt="*fp32")
    ce = dict(TWO_LEVEL=False, G=64, BLOCK_M=16, BLOCK_K=64, BLOCK_R=32, SPLIT_P2=1, SUM_ROWS=1, QM=1, QK=256,
              CH=4096, SCALE_BF16=True, S_RANK=True, SR=1, RB=1, CK=4096, NCH=1)
    info = compile_sm90("lowrank_gemm.kernels.act_quant", "_act_quant_fused_kernel", sig, ce,
                        aligned=("x_ptr", "stride_xm", "smooth_ptr", "q_ptr", "stride_qm", "a_ptr", "stride_ar",
                                 "K"), num_warps=4)
    assert "atom." not in info.ptx and "mma" not in info.ptx and "griddepcontrol" not in info.ptx   # PDL off
    assert info.has("ld.global.v4", "fma.rn.f32", "div.rn.f32")


def _gpu_inputs(m, k, r=32):
    dev = torch.device("cuda")
    x = (torch.randn(m, k, device=dev) * torch.exp(torch.randn(k, device=dev) * 0.5)).to(torch.bfloat16)
    smooth = (torch.rand(k, device=dev) + 0.5).to(torch.bfloat16)
    down = (torch.randn(r, k, device=dev) * 0.02).to(torch.bfloat16)
    return x, smooth, down


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("s_ranks", [None, 0, 1])  # plan default, ticket, rank-split
@pytest.mark.parametrize("m,k", [(1, 3072), (1, 4096), (16, 4096), (37, 3072), (64, 4096), (64, 12288)])
def test_fused_gpu_bit_identical(fmt, m, k, s_ranks):
    """bf16, decode sizes: fused == torch quantizer, S vs float64, 20 calls bit-identical, tickets at 0."""
    x, smooth, down = _gpu_inputs(m, k)
    q, sc, s = act_quant(x, smooth, down, 64, fmt, variant="fused", s_ranks=s_ranks)
    xs = x.float() / smooth.float()
    _check_formats(fmt, q, sc, xs, 64)
    ref = xs.double() @ down.double().T
    assert ((s.double() - ref).norm() / ref.norm()).item() < 2e-5
    for _ in range(20):
        assert torch.equal(s, act_quant(x, smooth, down, 64, fmt, variant="fused", s_ranks=s_ranks)[2])
    torch.cuda.synchronize()
    assert _tickets_zero()


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("s_ranks", [0, 1])
@pytest.mark.parametrize("m", [1, 64])
def test_fused_gpu_cuda_graph(fmt, m, s_ranks):
    """Captured once, replayed 50×: same bits as eager each replay (the ticket resets itself)."""
    x, smooth, down = _gpu_inputs(m, 4096)
    eager = act_quant(x, smooth, down, 64, fmt, variant="fused", s_ranks=s_ranks)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = act_quant(x, smooth, down, 64, fmt, variant="fused", s_ranks=s_ranks)
    for _ in range(50):
        for t in out:
            t.fill_(-1) if not t.is_floating_point() else t.fill_(float("nan"))
        g.replay()
        assert all(torch.equal(a, b) for a, b in zip(eager, out))
    torch.cuda.synchronize()
    assert _tickets_zero()


# --- out="f8": the e4m3 GEMM operands straight from x, bit-identical to expand_act_f8 of the packed pair ------

def _same_bits(a, b):
    """Bitwise equality (NaN payloads and signed zeros included) of two tensors of one dtype."""
    view = {torch.float32: torch.int32, torch.float8_e4m3fn: torch.uint8, torch.bfloat16: torch.int16,
            torch.float16: torch.int16}.get(a.dtype)
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(view) if view else a,
                                                                     b.view(view) if view else b)


_F8_A = (5, 320, 64, 16, torch.bfloat16)
_F8_B = (3, 256, 128, 0, torch.float16)


@pytest.mark.parametrize("variant,s_ranks,m,k,g,r,scale_dtype", [
    ("fused", None, *_F8_A), ("fused", None, *_F8_B), ("fused", 0, *_F8_A), ("v1", None, *_F8_A), ("v1", None, *_F8_B),
    ("v3", None, *_F8_A), ("v3", None, *_F8_B), ("v2", None, *_F8_B)])
def test_f8_out_bit_identical_to_expand(poisoned, variant, s_ranks, m, k, g, r, scale_dtype):
    """act_quant(out="f8") == expand_act_f8(act_quant(...)) bit for bit (x8 bytes, xab words incl. NaN rows), on
    ragged M/K, G 64/128, NaN / Inf / all-zero groups (v3: its exact redo of the slice), fp16 scales; every element
    written (poisoned buffers); S identical to the packed call's."""
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    x, smooth, down = _inputs(m, k, r)
    x[0, 3] = float("nan")
    if m > 2:
        x[2, k - 7] = float("inf")
        x[1, :64] = 0
    kw = dict(variant=variant, s_ranks=s_ranks) if variant == "fused" else dict(variant=variant, split=2, block_m=16)
    q, sc, s = act_quant(x, smooth, down, g, "int4_g64", scale_dtype, **kw)
    x8_ref, xab_ref = expand_act_f8(q, sc, g)
    x8, xab, s8 = act_quant(x, smooth, down, g, "int4_g64", scale_dtype, out="f8", **kw)
    assert x8.dtype == torch.float8_e4m3fn and x8.shape == (m, k) and xab.shape == (k // g, 2, m)
    assert _same_bits(x8, x8_ref) and _same_bits(xab, xab_ref) and _same_bits(s8, s)
    assert torch.isnan(xab[0, :, 0]).all()                                  # the NaN group of row 0


@pytest.mark.parametrize("m,k", [(20, 256), (33, 192)])
def test_f8_out_with_the_tens_of_rows_default(m, k):
    """The default plan above M = 16 (the rank-split fused program with 4-row S tiles) writes the e4m3 operands
    bit-identical to expanding its packed output — the layer asks for them on the v2 route (N ≥ 12288)."""
    from lowrank_gemm.kernels.act_quant import plan_act_quant
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    p = plan_act_quant(m, k, 64)
    assert p.variant == "fused" and p.s_ranks >= 1 and p.s_rows == 4
    x, smooth, down = _inputs(m, k, 16)
    q, sc, s = act_quant(x, smooth, down, 64, "int4_g64", torch.float16)
    x8_ref, xab_ref = expand_act_f8(q, sc, 64)
    x8, xab, s8 = act_quant(x, smooth, down, 64, "int4_g64", torch.float16, out="f8")
    assert _same_bits(x8, x8_ref) and _same_bits(xab, xab_ref) and _same_bits(s8, s)
    _check_lowrank(s, x, smooth, down)


def test_f8_out_bad_arguments():
    x, smooth, down = _inputs(3, 128, 16)
    with pytest.raises(ValueError, match="out must be one of"):
        act_quant(x, smooth, down, out="e5m2")
    with pytest.raises(ValueError, match="fmt='int4_g64'"):
        act_quant(x, smooth, down, 64, "int4_2l", out="f8")


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
@pytest.mark.parametrize("m,k,r,out", [(1, 320, 32, "packed"), (6, 256, 23, "f8"), (4, 320, 32, "packed")])
def test_fused_loads_first_same_bits(poisoned, monkeypatch, fmt, m, k, r, out):
    """LOADS_FIRST (the S program's load gate and the g64 unit's barrier) changes no bit, with one or several K
    chunks per S program (the chunk tile shrunk), also when picked by the env switch (read per call)."""
    import lowrank_gemm.kernels.act_quant as aq
    monkeypatch.setattr(aq, "_RANK_TILE_ELEMS", 256)
    if fmt == "int4_2l" and out == "f8":
        out = "packed"
    x, smooth, down = _inputs(m, k, r)
    x[0, 5] = float("nan")
    ref = act_quant(x, smooth, down, 64, fmt, variant="fused", out=out, loads_first=False)
    monkeypatch.setenv("LOWRANK_GEMM_ACT_QUANT_LOADS_FIRST", "1")
    got = act_quant(x, smooth, down, 64, fmt, variant="fused", out=out)
    assert all(_same_bits(a, b) for a, b in zip(ref, got))


def _sass_load_waves(ptx: str, tmp) -> tuple[list, list]:
    """Load-issue waves of the fused kernel's rank-split S program (the code up to its unconditional EXIT) and of its
    quant unit (up to the next one): loads issued before the next first use of any pending load's register — one
    wave is one round trip. None without triton's ptxas / cuobjdump."""
    import os
    import re
    import subprocess
    import triton
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    if not all(os.path.exists(os.path.join(bin_dir, t)) for t in ("ptxas", "cuobjdump")):
        return None
    (tmp / "k.ptx").write_text(ptx)
    subprocess.run([os.path.join(bin_dir, "ptxas"), "-arch=sm_90a", str(tmp / "k.ptx"), "-o", str(tmp / "k.cubin")],
                   check=True, capture_output=True)
    sass = subprocess.run([os.path.join(bin_dir, "cuobjdump"), "-sass", str(tmp / "k.cubin")], check=True,
                          capture_output=True, text=True).stdout
    ins = re.findall(r"/\*[0-9a-f]{4}\*/ +([^;]*);", sass)

    def waves(seg):
        out, cur, pending = [], 0, {}
        for n, t in enumerate(seg):
            m = re.match(r"(@!?P\d+ )?LDG\S*?(\.128|\.64)? (R\d+)", t)
            if m:
                pending[n] = (int(m.group(3)[1:]), {".128": 4, ".64": 2}.get(m.group(2), 1))
                cur += 1
                continue
            srcs = [int(v) for v in re.findall(r"\bR(\d+)\b", t.split(",", 1)[1])] if "," in t else []
            used = [key for key, (d, w) in pending.items() if any(d <= s < d + w for s in srcs)]
            if used and cur:
                out.append(cur)
                cur = 0
            for key in used:
                pending.pop(key)
        return out + ([cur] if cur else [])

    ends = [i for i, t in enumerate(ins) if t.strip() == "EXIT"]   # the unconditional exit of each program kind
    return waves(ins[:ends[0]]), waves(ins[ends[0] + 1:ends[1]])


def test_fused_sm90_pdl_f8_loads_first(tmp_path):
    """sm_90, the M=1 int4_g64 decode plan with the e4m3 outputs, PDL and LOADS_FIRST: griddepcontrol
    .launch_dependents then .wait before the first global access; e4m3 stores; no spills; the S program issues its
    12 loads in one wave and the quant unit its 4 (SASS; without LOADS_FIRST ptxas spreads them over 6 and 2)."""
    import os
    import re
    import subprocess
    import triton
    from lowrank_gemm.kernels.aot import compile_sm90
    sig = dict(_fused_signature(q="*fp8e4nv", sc="*fp32", cnt="*fp32"))
    ce = dict(TWO_LEVEL=False, G=64, BLOCK_M=16, BLOCK_K=64, BLOCK_R=32, SPLIT_P2=1, SUM_ROWS=1, QM=1, QK=256,
              CH=4096, SCALE_BF16=True, S_RANK=True, SR=1, RB=1, CK=4096, NCH=1, F8=True, PDL=True,
              LOADS_FIRST=True)
    info = compile_sm90("lowrank_gemm.kernels.act_quant", "_act_quant_fused_kernel", sig, ce,
                        aligned=("x_ptr", "stride_xm", "smooth_ptr", "q_ptr", "stride_qm", "a_ptr", "stride_ar",
                                 "K"), num_warps=4)
    ptx = info.ptx
    first_global = min(ptx.find(op) for op in ("ld.global", "st.global", "atom.global") if op in ptx)
    assert 0 < ptx.find("griddepcontrol.launch_dependents") < ptx.find("griddepcontrol.wait") < first_global
    assert "e4m3" in ptx and "atom." not in ptx
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    (tmp_path / "a.ptx").write_text(ptx)
    log = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(tmp_path / "a.ptx"), "-o", str(tmp_path / "a.cubin")],
                         capture_output=True, text=True).stderr
    assert "0 bytes spill stores" in log, log
    assert int(re.search(r"Used (\d+) registers", log).group(1)) <= 128
    res = _sass_load_waves(ptx, tmp_path)
    if res is not None:
        assert res == ([12], [4]), res


def test_fused_early_deps_knob(monkeypatch):
    """LOWRANK_GEMM_ACT_QUANT_EARLY_DEPS=0 (probe knob): the fused kernel keeps griddepcontrol.wait before its first
    global access but issues no launch_dependents (the next kernel launches as this one's programs exit); the env is
    read per call and only matters with PDL on."""
    import lowrank_gemm.kernels.act_quant as aq
    from lowrank_gemm.kernels.aot import compile_sm90
    assert aq._early_deps() and aq._early_deps(True) and not aq._early_deps(False)   # caller's choice, default on
    monkeypatch.setenv("LOWRANK_GEMM_ACT_QUANT_EARLY_DEPS", "0")
    assert not aq._early_deps() and not aq._early_deps(True)                          # the env wins
    monkeypatch.setenv("LOWRANK_GEMM_ACT_QUANT_EARLY_DEPS", "1")
    assert aq._early_deps(False)
    sig = dict(_fused_signature(q="*fp8e4nv", sc="*fp32", cnt="*fp32"))
    ce = dict(TWO_LEVEL=False, G=64, BLOCK_M=16, BLOCK_K=64, BLOCK_R=32, SPLIT_P2=1, SUM_ROWS=1, QM=1, QK=256,
              CH=4096, SCALE_BF16=True, S_RANK=True, SR=1, RB=1, CK=4096, NCH=1, F8=True, PDL=True,
              LOADS_FIRST=True, LATE_DEPS=True)
    ptx = compile_sm90("lowrank_gemm.kernels.act_quant", "_act_quant_fused_kernel", sig, ce,
                       aligned=("x_ptr", "stride_xm", "smooth_ptr", "q_ptr", "stride_qm", "a_ptr", "stride_ar",
                                "K"), num_warps=4).ptx
    first_global = min(ptx.find(op) for op in ("ld.global", "st.global") if op in ptx)
    assert "griddepcontrol.launch_dependents" not in ptx and 0 < ptx.find("griddepcontrol.wait") < first_global


# --- v3 S feed (act_quant(s_feed=...) / LOWRANK_GEMM_ACT_QUANT_S_FEED; "one" by default at r ≤ 32): the three A'
# pieces in ONE accumulator ("one"), and X by TMA in the int4_2l stats pass ("one_tma"); x_q / scales / t as "split"

# ragged M (not a multiple of the 16-row test blocks), uneven K slices, G 64 / 128, r 0 / 16 / 32 / 64, and a bad
# group in some slices (their exact redo) — the v3 cases of test_v3_poisoned_ragged_same_as_v2
_FEED_CASES = [(37, 320, 64, 32, 3, "nan"), (21, 384, 128, 16, 2, "tiny"), (50, 192, 64, 0, 2, "none"),
               (19, 256, 64, 64, 3, "inf_zero")]


def _feed_inputs(m, k, g, r, bad):
    x, smooth, down = _inputs(m, k, r, torch.bfloat16)   # the feed is bf16-only (fp16 X keeps "split")
    if bad == "nan":
        x[3, k - 5] = float("nan")
    elif bad == "tiny":
        x[4, :g] = (x[4, :g].float() * 2.0 ** -100).to(torch.bfloat16)
    elif bad == "inf_zero":
        x[2, 7] = float("inf")
        x[9, g:2 * g] = 0
    return x, smooth, down


_FEED_OUTS = [("int4_g64", "packed", "one"), ("int4_g64", "f8", "one"), ("int4_2l", "packed", "one"),
              ("int4_2l", "packed", "one_tma")]


# each (format, output, feed) on two of the cases and each case under two of them (the full product doubled the
# interpreter time for no new code path)
@pytest.mark.parametrize("fmt,out,feed,m,k,g,r,split,bad",
                         [(*_FEED_OUTS[i], *_FEED_CASES[(i + j) % 4]) for i in range(4) for j in (0, 1)])
def test_s_feed_same_bits_as_default(poisoned, fmt, out, feed, m, k, g, r, split, bad):
    """Every output element written (poisoned buffers); x_q / x_scale bit-identical to the default feed (packed: to
    the torch quantizer too); S of the finite rows vs float64 and within 1e-6 of the default's S (max-normalized;
    under the interpreter the pieces are fp32, so there it is the same S), NaN on the NaN/Inf rows; repeat
    bit-identical."""
    x, smooth, down = _feed_inputs(m, k, g, r, bad)
    kw = dict(variant="v3", split=split, block_m=16, out=out)
    got = act_quant(x, smooth, down, g, fmt, s_feed=feed, **kw)
    ref = act_quant(x, smooth, down, g, fmt, s_feed="split", **kw)
    assert _same_bits(got[0], ref[0]) and _same_bits(got[1], ref[1])
    if out == "packed":
        _check_formats(fmt, got[0], got[1], x.float() / smooth.float(), g)
    assert all(_same_bits(a, b) for a, b in zip(got, act_quant(x, smooth, down, g, fmt, s_feed=feed, **kw)))
    rows = torch.isfinite(x.float()).all(1)
    assert torch.isnan(got[2][~rows]).all() and not torch.isnan(got[2][rows]).any()
    if r:
        _check_lowrank(got[2][rows], x[rows], smooth, down)
        d = (got[2][rows] - ref[2][rows]).abs().max() / ref[2][rows].abs().max()
        assert d <= 1e-6, d


def test_s_feed_unscaled_bf16_pieces(monkeypatch):
    """The GPU MMAs read bf16 pieces (the interpreter gets fp32 ones: its bf16 dot is wrong), so their algebra is
    checked here: the prep at SHIFT 0 ("one") splits A' = A/λ into three unscaled bf16 pieces with p1 + p2 + p3 = A'
    to 2⁻²⁰ per element (the interpreter's bf16 cast truncates; round-to-nearest on the GPU: ~2⁻²⁴), as the scaled
    pieces of "split" do, and S = Σ x·(p1 + p2 + p3) — the one-accumulator MMA chain, in float64 — matches float64."""
    import lowrank_gemm.kernels.act_quant as aq
    monkeypatch.setattr(aq, "_interpreting", lambda: False)   # bf16 pieces, as on the GPU
    x, smooth, down = _inputs(9, 320, 23, torch.bfloat16)      # rank 23: BLOCK_R 32, the pad columns stay 0
    ap = down.double().T / smooth.double()[:, None]            # [K, r]
    _, p, shift = aq._prep(x, smooth, down, 23, 32, unscaled=True)
    assert shift == 0 and p.dtype == torch.bfloat16 and p.shape == (3, 320, 32)
    one = p.double().sum(0)
    assert (one[:, 23:] == 0).all() and ((one[:, :23] - ap).abs() <= 2.0 ** -20 * ap.abs()).all()
    _, p8, shift8 = aq._prep(x, smooth, down, 23, 32)
    split = p8[0].double() + p8[1].double() * 2.0 ** -shift8 + p8[2].double() * 2.0 ** (-2 * shift8)
    assert ((split[:, :23] - ap).abs() <= 2.0 ** -20 * ap.abs()).all()
    s = x.double() @ one[:, :23]
    ref = (x.double() / smooth.double()) @ down.double().T
    assert ((s - ref).norm() / ref.norm()).item() < 1e-6


def test_s_feed_knob_and_fallbacks(monkeypatch):
    """s_feed: kwarg, else LOWRANK_GEMM_ACT_QUANT_S_FEED read per call, else "one" at r ≤ 32 and "split" above;
    "split" for fp16 X (unscaled fp16 pieces would underflow), r = 0 and non-v3 variants; "one_tma" → "one" where X
    is not TMA-legal; a bad name raises. Under the knob an fp16 call is the default bit for bit (S included)."""
    import lowrank_gemm.kernels.act_quant as aq
    x, smooth, down = _inputs(20, 192, 16, torch.bfloat16)
    assert aq._s_feed(None, x, 16, "v3") == "one" and aq._s_feed(None, x, 32, "v3") == "one"
    assert aq._s_feed(None, x, 64, "v3") == "split"
    monkeypatch.setenv("LOWRANK_GEMM_ACT_QUANT_S_FEED", "split")
    assert aq._s_feed(None, x, 16, "v3") == "split"
    monkeypatch.setenv("LOWRANK_GEMM_ACT_QUANT_S_FEED", "one")
    assert aq._s_feed(None, x, 16, "v3") == "one" and aq._s_feed("split", x, 16, "v3") == "split"
    assert aq._s_feed("one", x.half(), 16, "v3") == "split"
    assert aq._s_feed("one", x, 0, "v3") == "split" and aq._s_feed("one", x, 16, "v2") == "split"
    odd = torch.empty(20 * 192 + 1, dtype=torch.bfloat16)[1:].view(20, 192).copy_(x)   # base 2 bytes off 16
    assert aq._s_feed("one_tma", odd, 16, "v3") == "one" and aq._s_feed("one_tma", x, 16, "v3") == "one_tma"
    with pytest.raises(ValueError, match="s_feed"):
        act_quant(x, smooth, down, 64, "int4_g64", variant="v3", s_feed="wide")
    xh = x.half()
    kw = dict(variant="v3", split=2, block_m=16)
    assert all(_same_bits(a, b) for a, b in zip(act_quant(xh, smooth, down, 64, "int4_2l", **kw),
                                                act_quant(xh, smooth, down, 64, "int4_2l", s_feed="split", **kw)))
    q, sc, s = act_quant(odd, smooth, down, 64, "int4_2l", s_feed="one_tma", **kw)   # the fallback runs
    _check_formats("int4_2l", q, sc, x.float() / smooth.float(), 64)
    _check_lowrank(s, x, smooth, down)


def test_s_feed_sm90_one_accumulator(tmp_path):
    """sm_90 at the FLUX plan (64 × 64 steps, 4 warps, r = 32, 2 stages): with ONE_ACC every wgmma of the K loop
    accumulates into the same 16 registers (m64n32k16; the default feeds three), the int4_2l stats pass with X_TMA
    loads X by TMA (cp.async.bulk.tensor.2d, mbarrier wait), no spills, and ptxas fits 4 CTAs per SM (≤ 128
    registers; the default feed: 155–164, 3 CTAs)."""
    import os
    import re
    import subprocess
    import triton
    from lowrank_gemm.kernels.aot import compile_sm90
    common = dict(x_ptr="*bf16", stride_xm="i32", smooth_ptr="*bf16", rl_ptr="*fp32", p_ptr="*bf16", stride_pp="i32",
                  sp_ptr="*fp32", stride_sps="i32", stride_spm="i32", M="i32", K="i32", R="i32", STEPS_PER_SLICE="i32")
    al = ("x_ptr", "stride_xm", "smooth_ptr", "rl_ptr", "p_ptr", "stride_pp", "sp_ptr", "stride_spm")
    cases = []
    for f8 in (False, True):
        sig = dict(common, q_ptr="*fp8e4nv" if f8 else "*u8", stride_qm="i32", sc_ptr="*fp32" if f8 else "*bf16",
                   stride_sg="i32")
        cases.append(("_act_quant_g_v3_kernel", sig, dict(G=64, BLOCK_M=64, BLOCK_R=32, HAS_LOWRANK=True,
                                                          SCALE_BF16=True, SHIFT=0, EMU_FMA=False, F8=f8, ONE_ACC=True),
                      al + ("q_ptr", "stride_qm", "sc_ptr")))
    sig = dict(common, x_ptr="tensordesc<bf16[64, 64]>", ap_ptr="*fp32", stride_aps="i32")
    cases.append(("_act_2l_stats_v3_kernel", sig, dict(BLOCK_M=64, BLOCK_K=64, BLOCK_R=32, HAS_LOWRANK=True, SHIFT=0,
                                                       EMU_FMA=False, ONE_ACC=True, X_TMA=True), al))
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    for i, (kernel, sig, ce, aligned) in enumerate(cases):
        ptx = compile_sm90("lowrank_gemm.kernels.act_quant", kernel, sig, ce, aligned=aligned, num_warps=4,
                           num_stages=2).ptx
        accs = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n32k16\.f32\.bf16\.bf16 (\{[^}]*\})", ptx))
        assert len(accs) == 1, accs
        if ce.get("X_TMA"):
            assert "cp.async.bulk.tensor.2d" in ptx and "mbarrier.try_wait" in ptx
        (tmp_path / f"{i}.ptx").write_text(ptx)
        log = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(tmp_path / f"{i}.ptx"), "-o",
                              str(tmp_path / f"{i}.cubin")], capture_output=True, text=True).stderr
        assert "0 bytes spill stores" in log, log
        regs = int(re.search(r"Used (\d+) registers", log).group(1))
        assert regs <= 128, (kernel, ce, regs)


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt,out,feed", [("int4_g64", "packed", "one"), ("int4_g64", "f8", "one"),
                                          ("int4_2l", "packed", "one"), ("int4_2l", "packed", "one_tma")])
@pytest.mark.parametrize("m,k", [(4608, 3072), (4608, 12288), (300, 3072)])
def test_s_feed_gpu(fmt, out, feed, m, k):
    """bf16, r = 32, FLUX sizes (and ragged M = 300): x_q / x_scale bit-identical to the default feed (packed: to the
    torch quantizer), S vs float64 as the default's GPU test (2e-5) and within 1e-5 of the default's S
    (max-normalized, the A/B probe's check), repeat bit-identical."""
    dev = torch.device("cuda")
    x = (torch.randn(m, k, device=dev) * torch.exp(torch.randn(k, device=dev) * 0.5)).to(torch.bfloat16)
    smooth = (torch.rand(k, device=dev) + 0.5).to(torch.bfloat16)
    down = (torch.randn(32, k, device=dev) * 0.02).to(torch.bfloat16)
    got = act_quant(x, smooth, down, 64, fmt, out=out, variant="v3", s_feed=feed)
    ref = act_quant(x, smooth, down, 64, fmt, out=out, variant="v3", s_feed="split")
    assert _same_bits(got[0], ref[0]) and _same_bits(got[1], ref[1])
    if out == "packed":
        _check_formats(fmt, got[0], got[1], x.float() / smooth.float(), 64)
    s64 = (x.double() / smooth.double()) @ down.double().T
    assert ((got[2].double() - s64).norm() / s64.norm()).item() < 2e-5
    assert ((got[2] - ref[2]).abs().max() / ref[2].abs().max()).item() < 1e-5
    assert _same_bits(got[2], act_quant(x, smooth, down, 64, fmt, out=out, variant="v3", s_feed=feed)[2])


def test_s_feed_one_sizes_the_split_for_one_wave(monkeypatch):
    """The default "one" feed re-plans v3's K split for one wave at its occupancy (⌊CTAs/SM · SMs / row blocks⌋, the
    measured optimum at M = 4608: g64 7, 2l 9 on 132 SMs); an explicit ``split`` or the "split" feed keeps the
    plan's."""
    import lowrank_gemm.kernels.act_quant as aq
    dev = torch.device("cuda")
    monkeypatch.setattr(aq, "num_sms", lambda device: 132)
    assert aq._one_wave_split(4608, 64, "int4_g64", dev) == 7 and aq._one_wave_split(4608, 64, "int4_2l", dev) == 9
    assert aq.plan_act_quant(4608, 3072, 64, dev, fmt="int4_g64").split == 8        # the default feed-free plan
    seen = []
    real = aq._act_quant_v2
    monkeypatch.setattr(aq, "_act_quant_v2", lambda *a: seen.append((a[10], a[11], a[17])) or real(*a))
    x, smooth, down = _inputs(80, 384, 16, torch.bfloat16)       # 2 row blocks of 64: a small interpreter run
    monkeypatch.setattr(aq, "_one_wave_split", lambda m, bm, fmt, device: 3)
    act_quant(x, smooth, down, 64, "int4_g64", variant="v3")
    act_quant(x, smooth, down, 64, "int4_g64", variant="v3", split=2)
    act_quant(x, smooth, down, 64, "int4_g64", variant="v3", s_feed="split")
    want_default = aq.plan_act_quant(80, 384, 64, x.device, variant="v3").split
    assert [(nsplit, feed) for _, nsplit, feed in seen] == [(3, "one"), (2, "one"), (want_default, "split")]


# --- out="f16": the int4_g64 decode kernel's fp16 token operand straight from x -------------------------------

def _f16_inputs(m, k, r, case):
    """Random rows plus the corners of the row power of two: a NaN group, an Inf group, a row of tiny values with an
    all-zero group (whose scale of 1 must not set the row's power), an all-zero row, a row spanning 2⁻⁶⁰…2⁶⁰."""
    x, smooth, down = _inputs(m, k, r, torch.bfloat16)
    if case == "corners":
        x[0, 3] = float("nan")
        x[min(1, m - 1), k - 5] = float("inf")
        if m > 3:
            x[2] = x[2] * 1e-30
            x[2, :64] = 0
            x[3] = 0
        if m > 4:
            x[4, ::2] *= 2.0 ** 60
            x[4, 1::2] *= 2.0 ** -60
    return x, smooth, down


@pytest.mark.parametrize("m,k,g,r,scale_dtype,s_ranks,qk,case", [
    (5, 320, 64, 16, torch.bfloat16, None, None, "corners"),     # ragged K: the last 256-column unit half past K
    (6, 256, 128, 0, torch.float16, None, None, "corners"),      # fp16 scales: the 2⁶⁰ row overflows them (Inf)
    (3, 192, 64, 16, torch.bfloat16, 0, 128, "random"),          # ticketed S, three 128-column units per row
    (37, 256, 64, 32, torch.bfloat16, None, None, "corners"),    # above 33 rows: the decode route's sizes
    (2, 128, 64, 23, torch.float16, 1, 64, "random")])
def test_f16_out_bit_identical_to_the_operand_kernel(poisoned, m, k, g, r, scale_dtype, s_ranks, qk, case):
    """act_quant(out="f16") == w4_expand.f16_act_operands_ref of the fused packed call, bit for bit (x16 incl. NaN
    payloads, t), every element written (poisoned buffers), S identical to the packed call's on the same S plan."""
    from lowrank_gemm.kernels.w4_expand import f16_act_operands_ref
    x, smooth, down = _f16_inputs(m, k, r, case)
    kw = dict(variant="fused", s_ranks=s_ranks, quant_cols=qk)
    if s_ranks is None:
        from lowrank_gemm.kernels.act_quant import f16_s_ranks
        kw["s_ranks"] = f16_s_ranks(m, k)
    q, sc, s = act_quant(x, smooth, down, g, "int4_g64", scale_dtype, **kw)
    x16_ref, t_ref = f16_act_operands_ref(q, sc, g)
    x16, t, s16 = act_quant(x, smooth, down, g, "int4_g64", scale_dtype, out="f16", s_ranks=s_ranks, quant_cols=qk)
    assert x16.dtype == torch.float16 and x16.shape == (m, k) and t.dtype == torch.float32 and t.shape == (m,)
    assert _same_bits(x16, x16_ref) and _same_bits(t, t_ref) and _same_bits(s16, s)
    if case == "corners":
        assert torch.isnan(x16[0, :g]).all() and torch.isfinite(x16[0, g:]).all()     # only row 0's NaN group
        if m > 3:
            assert t[3] == 1 and not x16[3].any()
        if m > 3 and scale_dtype == torch.bfloat16:        # (fp16 scales cannot hold the tiny row: its codes are 0)
            assert x16[2, 64:].abs().max() >= 2.0 ** 14 and t[2] < 2.0 ** -80
    again = act_quant(x, smooth, down, g, "int4_g64", scale_dtype, out="f16", s_ranks=s_ranks, quant_cols=qk)
    assert all(_same_bits(a, b) for a, b in zip((x16, t, s16), again))


def test_f16_out_plan_and_bad_arguments(monkeypatch):
    """The S programs: rank-split where the packed output's default is the rank-split fused kernel (M·K ≤ 48·4096,
    K ≤ 8192), the ticketed sum elsewhere (the packed output runs v1 / v3 there), the env pin; errors name the
    expected."""
    import lowrank_gemm.kernels.act_quant as aq
    assert [aq.f16_s_ranks(m, 4096) for m in (33, 48, 49, 64)] == [1, 1, 0, 0]
    assert aq.f16_s_ranks(40, 12288) == 0
    monkeypatch.setattr(aq, "_ENV_FUSED_S", "rank")
    assert aq.f16_s_ranks(64, 4096) == 1
    x, smooth, down = _inputs(3, 128, 16, torch.bfloat16)
    with pytest.raises(ValueError, match="fmt='int4_g64'"):
        act_quant(x, smooth, down, 64, "int4_2l", out="f16")
    with pytest.raises(ValueError, match="fused kernel"):
        act_quant(x, smooth, down, 64, out="f16", variant="v1")
    with pytest.raises(ValueError, match="act_shift"):
        act_quant(x, smooth, down, 64, out="f16", act_shift=torch.zeros(128))


def test_f16_out_sm90_no_spills():
    """sm_90, the decode route's shapes (K = 4096, 2048-column units, both S modes): the F16 unit compiles without
    spills, and with the rank-split S programs (4 rows) no more registers than the packed kernel (164)."""
    import lowrank_gemm.kernels.act_quant as aq
    from lowrank_gemm.kernels.aot import compile_sm90
    from _sm90 import ptxas_stats
    sig = _fused_signature(q="*fp16", sc="*fp32", cnt="*i32")
    for rank_s in (True, False):
        ce = dict(TWO_LEVEL=False, G=64, BLOCK_M=16, BLOCK_K=128, BLOCK_R=32, SPLIT_P2=32, SUM_ROWS=16, QM=1, QK=2048,
                  CH=aq.F16_ROW_CHUNK, SCALE_BF16=True, F16=True)
        if rank_s:
            ce.update(BLOCK_K=64, SPLIT_P2=1, SUM_ROWS=1, S_RANK=True, SR=4, RB=1, CK=1024, NCH=4)
        info = compile_sm90("lowrank_gemm.kernels.act_quant", "_act_quant_fused_kernel", sig, ce,
                            aligned=("x_ptr", "stride_xm", "smooth_ptr", "q_ptr", "stride_qm", "a_ptr", "stride_ar",
                                     "K"), num_warps=4)
        stats = ptxas_stats(info.ptx)
        if stats is not None:
            regs, spills, log = stats
            assert spills == 0 and (regs <= 168 or not rank_s), log
        assert info.has("div.rn.f32", "cvt.rn.f16.f32")
