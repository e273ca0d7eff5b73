"""LoRA on an fp8 base weight (``lora_linear(..., weight_scale=)``): the kernels read W as e4m3 / e5m2 and widen it
tile by tile; its per-output-channel scale multiplies the main product only. CPU interpreter (fp16 activations: its
bf16 dot is wrong), against the float64 spec on the same fp8 values, NaN-poisoned outputs and workspaces; the
default 16-bit kernels compile to the same PTX as without the option (checked where it was added: NOTES.md,
session 33)."""

import pytest
import torch

from lowrank_gemm.kernels import lora_gemm as LG
from lowrank_gemm.kernels.lora_gemm import WEIGHT_SCALE_STRATEGIES, lora_linear, run_strategy
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.plan.planner import can_implement
from lowrank_gemm.reference import lora_linear_ref

from test_lora_gemm import cfg_for, poisoned_workspaces  # noqa: F401  (fixture)

REL_TOL = 2e-3


def make_fp8(M, N, K, r, dtype=torch.float8_e4m3fn, per_tensor=False, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).half()
    w32 = torch.randn(N, K, generator=g) / K ** 0.5
    if per_tensor:
        ws = w32.abs().max() / 448.0
    else:
        ws = w32.abs().amax(dim=1) / 448.0
    w8 = (w32 / ws.reshape(-1, 1)).to(dtype)
    a = (torch.randn(r, K, generator=g) / K ** 0.5).half()
    b = torch.randn(N, r, generator=g).half()
    bb = torch.randn(N, generator=g).half() if bias else None
    return x, w8, ws.reshape(-1) if not per_tensor else ws.reshape(1), a, b, bb


def rel_err(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("strategy", WEIGHT_SCALE_STRATEGIES)
@pytest.mark.parametrize("split_k", [1, 3])
def test_fp8_weight_strategies_match_reference(strategy, split_k, poisoned_workspaces):  # noqa: F811
    if split_k > 1 and strategy not in ("kloop", "split", "streams"):
        pytest.skip("persistent / stream-K strategies do not take split_k")
    M, N, K, r = 37, 70, 88, 8             # ragged against 16×32×16 tiles; K = 88 pads to 96 for the 1-byte W
    x, w8, ws, a, b, bias = make_fp8(M, N, K, r)
    cfg = cfg_for(r, split_k)
    out = torch.full((M, N), float("nan"), dtype=x.dtype)
    assert can_implement(strategy, (M, N, K, r), cfg)
    y = run_strategy(strategy, x, w8, a, b, 0.7, bias, cfg, out=out, weight_scale=ws)
    assert not y.isnan().any()
    assert rel_err(y, lora_linear_ref(x, w8, a, b, 0.7, bias, weight_scale=ws)) < REL_TOL


@pytest.mark.parametrize("split_k", [1, 2])
def test_fp8_weight_swap_ab(split_k, poisoned_workspaces):  # noqa: F811
    """The swap-AB K loop auto gives fp8 weights (W widened as the register A operand of W·Xᵀ)."""
    from lowrank_gemm.plan.config import KernelConfig
    M, N, K, r = 21, 150, 88, 8
    x, w8, ws, a, b, bias = make_fp8(M, N, K, r)
    cfg = KernelConfig(block_m=16, block_n=64, block_k=16, block_r=16, num_warps=4, num_stages=2, swap_ab=True,
                       split_k=split_k)
    assert can_implement("split", (M, N, K, r), cfg)
    out = torch.full((M, N), float("nan"), dtype=x.dtype)
    y = run_strategy("split", x, w8, a, b, 0.7, bias, cfg, out=out, weight_scale=ws)
    assert not y.isnan().any()
    assert rel_err(y, lora_linear_ref(x, w8, a, b, 0.7, bias, weight_scale=ws)) < REL_TOL


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("per_tensor", [False, True])
def test_fp8_weight_op_auto(fp8, per_tensor):
    x, w8, ws, a, b, bias = make_fp8(2 * 19, 96, 64, 16, dtype=fp8, per_tensor=per_tensor)
    x3 = x.reshape(2, 19, 64)
    y = lora_linear(x3, w8, a, b, scale=0.5, bias=bias, weight_scale=ws)
    assert y.shape == (2, 19, 96) and y.dtype == x.dtype
    assert rel_err(y.reshape(-1, 96), lora_linear_ref(x, w8, a, b, 0.5, bias, weight_scale=ws)) < REL_TOL
    # the fp8 path equals the 16-bit op on the dequantized weight up to fp16 rounding of that weight
    w16 = (w8.float() * ws.reshape(-1, 1)).half()
    y16 = lora_linear(x3, w16, a, b, scale=0.5, bias=bias)
    assert rel_err(y, lora_linear_ref(x3, w16, a, b, 0.5, bias).reshape(2, 19, 96)) < REL_TOL
    assert rel_err(y16, lora_linear_ref(x3, w16, a, b, 0.5, bias)) < REL_TOL


def test_fp8_weight_through_the_custom_op_and_rank_zero():
    x, w8, ws, a, b, bias = make_fp8(5, 64, 64, 4)
    y_op = torch.ops.lowrank_gemm.lora_linear(x, w8, a, b, 0.5, bias, "split", ws)
    assert rel_err(y_op, lora_linear_ref(x, w8, a, b, 0.5, bias, weight_scale=ws)) < REL_TOL
    y0 = lora_linear(x, w8, a[:0], b[:, :0], bias=bias, weight_scale=ws)
    assert rel_err(y0, lora_linear_ref(x, w8, a[:0], b[:, :0], 1.0, bias, weight_scale=ws)) < REL_TOL
    y_t = lora_linear(x, w8, a, b, 0.5, bias, strategy="torch", weight_scale=ws)
    assert rel_err(y_t, lora_linear_ref(x, w8, a, b, 0.5, bias, weight_scale=ws)) < REL_TOL


def test_fp8_weight_opcheck_and_compile():
    x, w8, ws, a, b, bias = make_fp8(6, 64, 64, 4)
    # (test_schema runs the op under a dispatch mode that the interpreter's fp8 handling does not survive on the
    # CPU; the schema is the one test_lora_gemm.test_opcheck checks)
    torch.library.opcheck(torch.ops.lowrank_gemm.lora_linear.default, (x, w8, a, b, 0.5, bias, "split", ws),
                          test_utils=("test_faketensor",))

    def f(x):
        return lora_linear(x, w8, a, b, 0.5, bias, weight_scale=ws).relu()
    y = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
    assert rel_err(y, lora_linear_ref(x, w8, a, b, 0.5, bias, weight_scale=ws).relu()) < REL_TOL


def test_fp8_weight_bad_input():
    x, w8, ws, a, b, bias = make_fp8(5, 64, 64, 4)
    with pytest.raises(ValueError, match="needs weight_scale"):
        lora_linear(x, w8, a, b)
    with pytest.raises(ValueError, match=r"weight_scale must be \[N\]"):
        lora_linear(x, w8, a, b, weight_scale=ws[:10])
    with pytest.raises(TypeError, match="floating-point"):
        lora_linear(x, w8, a, b, weight_scale=torch.ones(64, dtype=torch.int32))
    for strategy in ("merged", "concat", "kcat"):
        with pytest.raises(ValueError, match="takes no weight_scale"):
            lora_linear(x, w8, a, b, strategy=strategy, weight_scale=ws)
    with pytest.raises(TypeError, match="or an fp8 dtype"):
        lora_linear(x, w8.to(torch.float32), a, b, weight_scale=ws)
    with pytest.raises(ValueError, match="takes no weight_scale"):
        run_strategy("merged", x, w8, a, b, 1.0, None, cfg_for(4), weight_scale=ws)


def test_fp8_auto_plan_rules():
    """auto on an fp8 weight: a lora_main_kernel strategy (else the shape's split plan), swap-AB where it fits."""
    from lowrank_gemm.kernels.lora_gemm import FP8_AUTO_STRATEGIES, _fp8_weight_plan
    from lowrank_gemm.plan.config import KernelConfig
    cpu = torch.device("cpu")
    prefill = KernelConfig(block_m=128, block_n=256, block_k=64, block_r=16, num_warps=8, num_stages=4)
    s, c = _fp8_weight_plan("split", prefill, 1024, 4096, 4096, 16, torch.bfloat16, cpu)
    assert s == "split" and c.swap_ab and c.block_n == 256
    s, c = _fp8_weight_plan("kloop", prefill, 1024, 4096, 4096, 16, torch.bfloat16, cpu)
    assert s == "kloop" and not c.swap_ab           # kloop's swap needs block_r ≥ 64: kept as planned
    s, c = _fp8_weight_plan("persistent_static", prefill, 1024, 4096, 4096, 16, torch.bfloat16, cpu)
    assert s in FP8_AUTO_STRATEGIES
    assert _fp8_weight_plan("torch", prefill, 1, 64, 64, 4, torch.bfloat16, cpu)[0] == "torch"
    s, c = _fp8_weight_plan("split", prefill.replace(s_producers=2), 1024, 4096, 4096, 16, torch.bfloat16, cpu, True)
    assert s == "split" and not c.swap_ab and c.s_producers == 0 and (c.block_n, c.block_k) == (128, 128)
    s, c = _fp8_weight_plan("kloop", prefill, 1024, 4096, 4096, 16, torch.bfloat16, cpu, True)
    assert s in LG.FP8_ACT_STRATEGIES
    # two x terms: the same square tile, with fewer stages where the 16-bit ledger wants them
    for M in (64, 256, 1024):
        s, c = _fp8_weight_plan("split", prefill, M, 28672, 4096, 16, torch.bfloat16, cpu, 2)
        assert (c.block_n, c.block_k) == (128, 128) and 2 <= c.num_stages <= prefill.num_stages
    # decode-sized M (≤ FP8_WEIGHT_NARROW_MAX_M; at M ≤ 16 only with N ≥ 8192): split, swap-AB, 64 weight rows ×
    # 128 K, 4 stages (probe_lora_fp8w)
    for M, bm in ((1, 16), (16, 16), (17, 32), (64, 64)):
        s, c = _fp8_weight_plan("kloop", prefill.replace(s_producers=2), M, 28672, 4096, 16, torch.bfloat16, cpu)
        assert s == "split" and c.swap_ab and (c.block_m, c.block_n, c.block_k, c.num_stages) == (bm, 64, 128, 4)
        assert c.split_k == 1 and c.s_producers == 0
    s, c = _fp8_weight_plan("split", prefill, 65, 28672, 4096, 16, torch.bfloat16, cpu)
    assert c.block_n == 256                         # past it: the 16-bit plan, swapped
    s, c = _fp8_weight_plan("split", prefill, 16, 4096, 4096, 16, torch.bfloat16, cpu)
    assert c.block_n == 256                         # N < 8192 at M ≤ 16: the 16-bit plan, swapped
    s, c = _fp8_weight_plan("split", prefill, 64, 4096, 4096, 16, torch.bfloat16, cpu)
    assert (c.block_m, c.block_n) == (64, 64)


def test_fp8_auto_never_plans_a_one_buffer_strategy(monkeypatch):
    """Where the 16-bit plan is merged / concat / kcat, the fp8 weight runs the same shape's split plan."""
    seen = []
    real = LG.run_strategy

    def spy(strategy, *args, **kw):
        seen.append(strategy)
        return real(strategy, *args, **kw)
    monkeypatch.setattr(LG, "run_strategy", spy)
    LG._fp8_weight_plan.cache_clear()           # memoized over plan_lora, which this test replaces
    monkeypatch.setattr(LG, "plan_lora", lambda *a, **k: (("merged", cfg_for(4)) if LG.current_pin() is None
                                                           else ("split", cfg_for(4))))
    x, w8, ws, a, b, bias = make_fp8(5, 64, 64, 4)
    y = LG.lora_linear_impl(x, w8, a, b, 0.5, bias, "auto", ws)
    LG._fp8_weight_plan.cache_clear()
    assert seen == ["split"]
    assert rel_err(y, lora_linear_ref(x, w8, a, b, 0.5, bias, weight_scale=ws)) < REL_TOL


# ---------------------------------------------------------------------------- fp8 activations (W8A8 base product)

def _w8a8_ref(x, w8, ws, a, b, scale, bias, terms=1):
    """float64: the base product of the per-token e4m3 x (LG.fp8_rows, in ``terms`` terms) and the scaled fp8 W, the
    branch on the 16-bit x."""
    x8, xs = LG.fp8_rows(x.reshape(-1, x.shape[-1]), terms=terms)
    xq = (x8.double().reshape(terms, -1, x.shape[-1]).sum(0) * xs.double()[:, None]).reshape(x.shape)
    y = lora_linear_ref(xq, w8, a[:0], b[:, :0], 1.0, bias, weight_scale=ws)
    return y + scale * (x.double() @ a.double().t()) @ b.double().t()


def test_fp8_rows():
    x = torch.randn(4, 64).half()
    x[1] = 0
    x[2, 3] = float("nan")
    x8, xs = LG.fp8_rows(x)
    assert x8.dtype == torch.float8_e4m3fn and xs.dtype == torch.float32 and xs[1] == 1
    assert torch.isnan(x8[2].float()).any() and not torch.isnan(x8[[0, 1, 3]].float()).any()
    rel = ((x8[0].float() * xs[0] - x[0].float()).abs() / x[0].float().abs().max()).max()
    assert float(rel) <= 2 ** -4 and float(x8[0].float().abs().max()) == 448.0


@pytest.mark.parametrize("strategy", ("split", "streams"))
@pytest.mark.parametrize("split_k", [1, 3])
def test_fp8_activations_match_reference(strategy, split_k, poisoned_workspaces):  # noqa: F811
    M, N, K, r = 37, 70, 88, 8
    x, w8, ws, a, b, bias = make_fp8(M, N, K, r)
    cfg = cfg_for(r, split_k)
    out = torch.full((M, N), float("nan"), dtype=x.dtype)
    y = run_strategy(strategy, x, w8, a, b, 0.7, bias, cfg, out=out, weight_scale=ws, x_fp8=LG.fp8_rows(x))
    assert not y.isnan().any()
    ref = _w8a8_ref(x, w8, ws, a, b, 0.7, bias)
    assert rel_err(y, ref) < REL_TOL
    # the fp8 x costs accuracy against the 16-bit x (e4m3: 3 mantissa bits), which the reference above accounts for
    assert rel_err(y, lora_linear_ref(x, w8, a, b, 0.7, bias, weight_scale=ws)) < 0.1


@pytest.mark.parametrize("strategy", ("split", "streams"))
@pytest.mark.parametrize("split_k, swap", [(1, False), (3, False), (1, True)])
def test_fp8_two_term_activations_match_reference(strategy, split_k, swap, poisoned_workspaces):  # noqa: F811
    """x as two e4m3 terms on one row scale (fp8_rows terms=2: rows M … 2M − 1 the residual's codes), both into the K
    loop's one accumulator; against float64 on the same two terms, and within ~2⁻⁸ of the 16-bit x's result (one
    term: ~2⁻⁴)."""
    M, N, K, r = 37, 70, 88, 8
    x, w8, ws, a, b, bias = make_fp8(M, N, K, r)
    cfg = cfg_for(r, split_k)
    if swap:
        cfg = KernelConfig(block_m=16, block_n=64, block_k=16, block_r=16, num_warps=4, num_stages=2, swap_ab=True)
    out = torch.full((M, N), float("nan"), dtype=x.dtype)
    q, qs = LG.fp8_rows(x, terms=2)
    y = run_strategy(strategy, x, w8, a, b, 0.7, bias, cfg, out=out, weight_scale=ws, x_fp8=(q, qs))
    assert not y.isnan().any()
    xq = (q[:M].double() + q[M:].double()) * qs[:, None].double()
    ref = lora_linear_ref(xq, w8, a[:0], b[:, :0], 1.0, bias, weight_scale=ws) + \
        0.7 * (x.double() @ a.double().t()) @ b.double().t()
    assert rel_err(y, ref) < REL_TOL
    exact = lora_linear_ref(x, w8, a, b, 0.7, bias, weight_scale=ws)
    assert rel_err(y, exact) < 4 * REL_TOL < rel_err(_w8a8_ref(x, w8, ws, a, b, 0.7, bias), exact)
    with pytest.raises(ValueError, match="or 2M"):
        run_strategy(strategy, x, w8, a, b, 0.7, bias, cfg, weight_scale=ws, x_fp8=(q[:M + 1], qs))
    with pytest.raises(ValueError, match="and M scales"):     # the two terms share their token's scale
        run_strategy(strategy, x, w8, a, b, 0.7, bias, cfg, weight_scale=ws, x_fp8=(q, torch.cat([qs, qs])))


def test_fp8_two_term_activations_op():
    """fp8_activations=2 through the op (direct, custom op, the torch fallback) and the module; what it refuses."""
    from lowrank_gemm.nn import LoRALinear
    x, w8, ws, a, b, bias = make_fp8(2 * 19, 96, 64, 16)
    x3 = x.reshape(2, 19, 64)
    ref = _w8a8_ref(x, w8, ws, a, b, 0.5, bias, terms=2)
    y = lora_linear(x3, w8, a, b, 0.5, bias, weight_scale=ws, fp8_activations=2)
    assert rel_err(y.reshape(-1, 96), ref) < REL_TOL
    exact = lora_linear_ref(x, w8, a, b, 0.5, bias, weight_scale=ws)
    assert rel_err(y.reshape(-1, 96), exact) < 4 * REL_TOL
    y_t = lora_linear(x3, w8, a, b, 0.5, bias, strategy="torch", weight_scale=ws, fp8_activations=2)
    assert rel_err(y_t.reshape(-1, 96), ref) < REL_TOL
    y_op = torch.ops.lowrank_gemm.lora_linear(x, w8, a, b, 0.5, bias, "streams", ws, 2)
    assert rel_err(y_op, ref) < REL_TOL
    for bad in (3, -1, 1.5, "2"):
        with pytest.raises(ValueError, match="fp8_activations must be False, True"):
            lora_linear(x, w8, a, b, weight_scale=ws, fp8_activations=bad)
    lin = torch.nn.Linear(64, 96).half()
    mod = LoRALinear.from_linear(lin, a, b, scale=0.5).quantize_weight_fp8_(activations=2)
    assert mod.fp8_activations == 2 and "two terms" in repr(mod)
    assert rel_err(mod(x), _w8a8_ref(x, mod.weight, mod.weight_scale, a, b, 0.5, mod.bias, terms=2)) < REL_TOL
    with pytest.raises(ValueError, match="activations must be False, True or 2"):
        LoRALinear.from_linear(lin, a, b).quantize_weight_fp8_(activations=3)


def test_fp8_activations_op(monkeypatch):
    x, w8, ws, a, b, bias = make_fp8(2 * 19, 96, 64, 16)
    x3 = x.reshape(2, 19, 64)
    seen = []
    real = LG.run_strategy
    monkeypatch.setattr(LG, "run_strategy", lambda st, *ar, **kw: seen.append((st, ar[6].s_producers)) or real(st, *ar, **kw))
    LG._fp8_weight_plan.cache_clear()
    y = lora_linear(x3, w8, a, b, 0.5, bias, weight_scale=ws, fp8_activations=True)
    assert seen and seen[0][0] in LG.FP8_ACT_STRATEGIES and seen[0][1] == 0
    assert rel_err(y.reshape(-1, 96), _w8a8_ref(x, w8, ws, a, b, 0.5, bias)) < REL_TOL
    y_t = lora_linear(x3, w8, a, b, 0.5, bias, strategy="torch", weight_scale=ws, fp8_activations=True)
    assert rel_err(y_t.reshape(-1, 96), _w8a8_ref(x, w8, ws, a, b, 0.5, bias)) < REL_TOL
    y0 = lora_linear(x, w8, a[:0], b[:, :0], bias=bias, weight_scale=ws, fp8_activations=True)
    assert rel_err(y0, _w8a8_ref(x, w8, ws, a[:0], b[:, :0], 1.0, bias)) < REL_TOL
    y_op = torch.ops.lowrank_gemm.lora_linear(x, w8, a, b, 0.5, bias, "split", ws, True)
    assert rel_err(y_op, _w8a8_ref(x, w8, ws, a, b, 0.5, bias)) < REL_TOL
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        lora_linear(x, w8.to(torch.float8_e5m2), a, b, weight_scale=ws, fp8_activations=True)
    with pytest.raises(ValueError, match="computes S from the main loop"):
        lora_linear(x, w8, a, b, strategy="kloop", weight_scale=ws, fp8_activations=True)
    with pytest.raises(ValueError, match="fp8 activations need"):
        run_strategy("kloop", x, w8, a, b, 0.5, bias, cfg_for(16), weight_scale=ws, x_fp8=LG.fp8_rows(x))


# ---------------------------------------------------------------------------- sm_90 compile

def _fp8_signature(bm, bn, bk, br):
    from test_lora_gemm import main_signature
    sig = main_signature(bm, bn, bk, br, dt="fp16")
    sig["w_desc"] = f"tensordesc<fp8e4nv[{bn}, {bk}]>"
    sig["wscale_ptr"] = "*fp32"
    return sig


@pytest.mark.parametrize("swap_ab, bm, bn, bk, stages", [(True, 16, 128, 128, 6), (False, 128, 128, 64, 4)])
def test_fp8_weight_compiles_for_sm90(swap_ab, bm, bn, bk, stages):
    """The decode (swap-AB: the widened W is wgmma's register A operand) and the prefill tile compile for sm_90 with
    wgmma, the e4m3 → f16 widening and TMA, within the shared memory of the same 16-bit plan."""
    from lowrank_gemm.kernels.aot import compile_sm90
    from test_lora_gemm import MAIN_FLAGS, MOD, main_signature
    consts = dict(MAIN_FLAGS, HAS_BIAS=True, SWAP_AB=swap_ab, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, BLOCK_R=16,
                  GROUP_M=1, LOWRANK=LG.K_.LOWRANK_GLOBAL, PARTIAL=False, R_CHUNKS=1)
    fp8 = compile_sm90(MOD, "lora_main_kernel", _fp8_signature(bm, bn, bk, 16), consts, num_warps=4,
                       num_stages=stages)
    ref = compile_sm90(MOD, "lora_main_kernel", main_signature(bm, bn, bk, 16, dt="fp16"), consts, num_warps=4,
                       num_stages=stages)
    assert "wgmma.mma_async" in fp8.ptx and "cp.async.bulk.tensor" in fp8.ptx
    assert "e4m3" in fp8.ptx                      # the widening (cvt.rn.f16x2.e4m3x2)
    assert fp8.shared <= ref.shared, (fp8.shared, ref.shared)


# ---------------------------------------------------------------------------- the module

def test_lora_linear_module_fp8_weight():
    from lowrank_gemm.nn import LoRALinear
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 96).half()
    a, b = torch.randn(8, 64).half() * 0.1, torch.randn(96, 8).half() * 0.1
    mod = LoRALinear.from_linear(lin, a, b, scale=0.5)
    x = torch.randn(7, 64).half()
    y16 = mod(x)
    assert mod.weight_scale is None and "weight_scale" not in mod.state_dict()
    mod.quantize_weight_fp8_()
    assert mod.weight.dtype == torch.float8_e4m3fn and mod.weight_scale.shape == (96,)
    assert "float8" in repr(mod) and "weight_scale" in mod.state_dict()
    y8 = mod(x)
    ref = lora_linear_ref(x, mod.weight, a, b, 0.5, lin.bias, weight_scale=mod.weight_scale)
    assert rel_err(y8, ref) < REL_TOL
    assert rel_err(y8, y16.double()) < 0.05           # e4m3 keeps ~3 mantissa bits of each weight
    with pytest.raises(ValueError, match="already"):
        mod.quantize_weight_fp8_()
    w8a8 = LoRALinear.from_linear(lin, a, b, scale=0.5).quantize_weight_fp8_(activations=True)
    assert w8a8.fp8_activations and "fp8 activations" in repr(w8a8)
    assert rel_err(w8a8(x), _w8a8_ref(x, w8a8.weight, w8a8.weight_scale, a, b, 0.5, lin.bias)) < REL_TOL
    with pytest.raises(ValueError, match="e4m3"):
        LoRALinear.from_linear(lin, a, b).quantize_weight_fp8_(torch.float8_e5m2, activations=True)
    packed = LoRALinear.from_linear(lin, a, b).pack_()
    with pytest.raises(ValueError, match="packed"):
        packed.quantize_weight_fp8_()
    with pytest.raises(ValueError, match="fp8 dtype"):
        LoRALinear.from_linear(lin, a, b).quantize_weight_fp8_(torch.int8)


def test_fuse_lora_fp8():
    peft = pytest.importorskip("peft")
    from _models import Tiny
    from lowrank_gemm.integrations.peft import fuse_lora_
    from lowrank_gemm.nn import LoRALinear
    model = peft.get_peft_model(Tiny(64, 64, 64).half(), peft.LoraConfig(target_modules=["up", "down"], r=4))
    fuse_lora_(model, fp8=torch.float8_e4m3fn)
    mods = [m for m in model.modules() if isinstance(m, LoRALinear)]
    assert len(mods) == 2 and all(m.weight.dtype == torch.float8_e4m3fn for m in mods)
    with pytest.raises(ValueError, match="exclude"):
        fuse_lora_(model, fp8=torch.float8_e4m3fn, pack=True)
    with pytest.raises(ValueError, match="needs fp8"):
        fuse_lora_(model, fp8_activations=True)


def test_bench_fp8_rows_cpu():
    """The bench's fp8 sets and its auto_fp8w row (the op under the interpreter); fp8_scaled_mm needs CUDA."""
    from lowrank_gemm.bench import lora as B
    x, _, ws, a, b, _ = make_fp8(5, 64, 64, 4)
    w = torch.randn(64, 64).half() / 8
    (xx, w8, aa, bb, ws, x8, xs), = B.fp8_sets([(x, w, a, b, b * B.SCALE)])
    assert w8.dtype == x8.dtype == torch.float8_e4m3fn and ws.shape == (64,) and xs.shape == (5, 1)
    assert float((w8.float() * ws[:, None] - w.float()).abs().max()) <= float(w.float().abs().max()) * 2 ** -3
    y = B.impls()["auto_fp8w"](xx, w8, aa, bb, ws, x8, xs)
    assert B.rel_err(y, x, w8.float() * ws[:, None], a, b) < REL_TOL
    y = B.impls()["auto_w8a8"](xx, w8, aa, bb, ws, x8, xs)
    assert B.rel_err(y, x, w8.float() * ws[:, None], a, b) < 0.05


# ---------------------------------------------------------------------------- GPU (pytest -m gpu)

GPU_SHAPES = [(1, 28672, 4096, 16), (16, 28672, 4096, 16), (64, 4096, 4096, 16), (300, 5000, 3000, 64),
              (1024, 8192, 8192, 16)]


def _gpu_fp8(M, N, K, r, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    w = torch.randn(N, K, device="cuda", generator=g) / K ** 0.5
    ws = w.abs().amax(dim=1) / 448.0
    w8 = (w / ws[:, None]).to(torch.float8_e4m3fn)
    a = (torch.randn(r, K, device="cuda", generator=g) / K ** 0.5).bfloat16()
    b = (torch.randn(N, r, device="cuda", generator=g) / r ** 0.5).bfloat16()
    bias = torch.randn(N, device="cuda", generator=g).bfloat16()
    return x, w8, ws, a, b, bias


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("strategy", ("auto",) + WEIGHT_SCALE_STRATEGIES)
def test_fp8_weight_real_sizes(strategy, shape):
    from lowrank_gemm.plan.planner import pinned, plan_lora
    M, N, K, r = shape
    x, w8, ws, a, b, bias = _gpu_fp8(M, N, K, r)
    ref = lora_linear_ref(x, w8, a, b, 0.5, bias, weight_scale=ws)
    if strategy == "auto":
        y = lora_linear(x, w8, a, b, 0.5, bias, weight_scale=ws)
    else:
        with pinned(strategy=strategy):
            s, cfg = plan_lora(M, N, K, r, torch.bfloat16, torch.device("cuda"))
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        y = run_strategy(s, x, w8, a, b, 0.5, bias, cfg, out=out, weight_scale=ws)
    assert not y.isnan().any()
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2
    again = lora_linear(x, w8, a, b, 0.5, bias, weight_scale=ws) if strategy == "auto" else run_strategy(
        s, x, w8, a, b, 0.5, bias, cfg, weight_scale=ws)
    assert torch.equal(y, again)


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("M", [1, 64, 1024])
def test_fp8_weight_cuda_graph(M):
    from lowrank_gemm.bench.common import capture_graph
    x, w8, ws, a, b, bias = _gpu_fp8(M, 4096, 4096, 16)
    eager = lora_linear(x, w8, a, b, 0.5, bias, weight_scale=ws)
    _, graph, out = capture_graph(lambda: lora_linear(x, w8, a, b, 0.5, bias, weight_scale=ws))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_fp8_pinned_plan_is_taken_as_given(monkeypatch):
    """A pinned strategy/config is not rewritten for fp8 (no split fallback, no swap); one that cannot take a weight
    scale is refused, not replaced."""
    from lowrank_gemm.plan.planner import pinned
    seen = []
    real = LG.run_strategy
    monkeypatch.setattr(LG, "run_strategy", lambda s, *a, **k: seen.append((s, a[6].swap_ab)) or real(s, *a, **k))
    x, w8, ws, a, b, bias = make_fp8(5, 64, 64, 4)
    with pinned(strategy="streamk", config=cfg_for(4)):
        y = LG.lora_linear_impl(x, w8, a, b, 0.5, bias, "auto", ws)
    assert seen == [("streamk", False)]
    assert rel_err(y, lora_linear_ref(x, w8, a, b, 0.5, bias, weight_scale=ws)) < REL_TOL
    with pinned(strategy="merged", config=cfg_for(4)):
        with pytest.raises(ValueError, match="takes no weight_scale"):
            LG.lora_linear_impl(x, w8, a, b, 0.5, bias, "auto", ws)


@pytest.mark.parametrize("terms", [1, 2])
@pytest.mark.parametrize("bm, bn, bk, warps, stages, swap", [(128, 128, 128, 8, 4, False), (64, 128, 128, 4, 4, False),
                                                             (16, 128, 128, 4, 4, True)])
def test_fp8_activations_compile_to_fp8_wgmma(bm, bn, bk, warps, stages, swap, terms):
    """With x and W both e4m3 the K loop is the fp8 wgmma straight from the TMA tiles (nothing widened), no spill on
    the tiles auto gives it (a 256-wide one spills: _fp8_weight_plan makes it 128×128×128). Two x terms: twice the
    wgmma into the same accumulator, in the same registers as one term (a second accumulator took 245–253 and, on a
    128×256 tile, spilled 2.3 KB with every wgmma serialized: 18× slower on the H200, session 35). The swapped decode
    tile keeps the residual's own accumulator (16 registers there)."""
    from lowrank_gemm.kernels.aot import compile_sm90
    from test_lora_gemm import MAIN_FLAGS, MOD
    from _sm90 import ptxas_stats
    sig = _fp8_signature(bm, bn, bk, 16)
    sig["x_desc"] = f"tensordesc<fp8e4nv[{bm}, {bk}]>"
    sig["xscale_ptr"] = "*fp32"
    consts = dict(MAIN_FLAGS, HAS_BIAS=True, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, BLOCK_R=16, GROUP_M=8,
                  LOWRANK=LG.K_.LOWRANK_GLOBAL, PARTIAL=False, R_CHUNKS=1, X_TERMS=terms, SWAP_AB=swap)
    info = compile_sm90(MOD, "lora_main_kernel", sig, consts, num_warps=warps, num_stages=stages)
    assert "e4m3.e4m3" in info.ptx and "wgmma.mma_async" in info.ptx and "cp.async.bulk.tensor" in info.ptx
    # per x term the main loop's k32 wgmma per K step (BK 128: four; swapped, BN = 128 rows of W: two m64 each)
    assert info.ptx.count("e4m3.e4m3") == terms * (bk // 32) * (bn // 64 if swap else 1)
    stats = ptxas_stats(info.ptx)
    if stats is not None:
        assert stats[1] == 0, f"spills {stats[1]} bytes"
        assert stats[0] <= (120 if swap else 207) and "C751" not in stats[2], stats[2]   # C751x: wgmma serialized


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("shape", [(1, 28672, 4096, 16), (16, 4096, 4096, 16), (64, 28672, 4096, 16),
                                   (300, 5000, 3000, 64), (1024, 8192, 8192, 16)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("strategy", ("auto",) + LG.FP8_ACT_STRATEGIES)
def test_fp8_two_term_activations_real_sizes(strategy, shape):
    M, N, K, r = shape
    x, w8, ws, a, b, bias = _gpu_fp8(M, N, K, r)
    y = lora_linear(x, w8, a, b, 0.5, bias, strategy=strategy, weight_scale=ws, fp8_activations=2)
    assert not y.isnan().any()
    assert ((y.double() - _w8a8_ref(x, w8, ws, a, b, 0.5, bias, terms=2)).norm()
            / _w8a8_ref(x, w8, ws, a, b, 0.5, bias, terms=2).norm()).item() < 1e-2
    exact = lora_linear_ref(x, w8, a, b, 0.5, bias, weight_scale=ws)
    assert ((y.double() - exact).norm() / exact.norm()).item() < 5e-3     # one term: ~2.4e-2
    assert torch.equal(y, lora_linear(x, w8, a, b, 0.5, bias, strategy=strategy, weight_scale=ws,
                                      fp8_activations=2))


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("shape", [(256, 28672, 4096, 16), (1024, 4096, 4096, 16), (4096, 8192, 8192, 64),
                                   (300, 5000, 3000, 64)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("strategy", ("auto",) + LG.FP8_ACT_STRATEGIES)
def test_fp8_activations_real_sizes(strategy, shape):
    M, N, K, r = shape
    x, w8, ws, a, b, bias = _gpu_fp8(M, N, K, r)
    y = lora_linear(x, w8, a, b, 0.5, bias, strategy=strategy, weight_scale=ws, fp8_activations=True)
    ref = _w8a8_ref(x, w8, ws, a, b, 0.5, bias)
    assert not y.isnan().any()
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2
    assert torch.equal(y, lora_linear(x, w8, a, b, 0.5, bias, strategy=strategy, weight_scale=ws,
                                      fp8_activations=True))
