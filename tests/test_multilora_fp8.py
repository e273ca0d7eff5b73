"""Multi-LoRA on an fp8 base weight: W8A16 (the W tile widened on chip) and fp8 x per token (one or two e4m3 terms,
an fp8 × fp8 base product), against float64 on the same quantized operands; CPU interpreter at small sizes (fp16
x), the GPU at real sizes (bf16). The branch always reads the 16-bit x."""

import pytest
import torch

from lowrank_gemm.kernels import multilora_gemm as mg
from lowrank_gemm.kernels.row_quant import fp8_rows
from lowrank_gemm.plan.config import KernelConfig
from test_multilora_gemm import clean, make_case, small_plan

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def fp8_case(M, N, K, L, r_max, dtype=E4M3, seed=0, per_tensor=False):
    case = make_case(M, N, K, L, r_max, seed=seed)
    w8, ws = fp8_rows(case["weight"].float() * 3.0, dtype)      # not unit scale: the column scale matters
    if per_tensor:
        ws = ws.max().reshape(1)
        w8 = (case["weight"].float() * 3.0 / ws).to(dtype)
    case.update(weight=w8, weight_scale=ws)
    return case


def fp8_ref(case, terms=0):
    """float64: the base on the fp8 W (times its scale) and on x as the kernel's main operand sees it (the 16-bit x,
    or its e4m3 terms on their row scale); the branch on the 16-bit x."""
    x = case["x"]
    w = case["weight"].double() * case["weight_scale"].double().reshape(-1, 1)
    if terms:
        q, s = fp8_rows(x, terms=terms)
        xb = q.double().reshape(terms, *x.shape).sum(0) * s.double()[:, None]
    else:
        xb = x.double()
    y = xb @ w.T
    a, b = clean(case)
    for row, l in enumerate(case["adapter_ids"].tolist()):
        if l >= 0:
            r = int(case["ranks"][l])
            y[row] += float(case["scales"][l]) * (b[l, :, :r].double() @ (a[l, :r].double() @ x[row].double()))
    if case["bias"] is not None:
        y += case["bias"].double()
    return y


def run(case, mode, plan, **kw):
    M, N = case["x"].shape[0], case["weight"].shape[0]
    out = torch.full((M, N), float("nan"), dtype=case["x"].dtype)
    return mg.multi_lora_gemm(**case, mode=mode, plan=plan, out=out, poison_workspace=True, **kw)


def rel(y, ref):
    return float((y.double() - ref).norm() / ref.norm())


PLANS = {
    "plain": dict(),
    "split_k": dict(split_k=2),
    "fused": dict(fuse_d=2, epi_d=2),
    "swap": dict(bm=16, bn=64, swap_ab=True),
    "appended": dict(expand="appended"),
    "rows": dict(expand="rows", rows_chunk=4),
    "x_tma": dict(x_tma=True),
}


@pytest.mark.parametrize("mode", ["gather", "segment"])
@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("terms", [0, 1, 2])
def test_fp8_base_matches_reference(mode, plan, terms):
    if plan == "x_tma" and mode == "segment":
        pytest.skip("x through TMA is gather mode's (rows in place)")
    case = fp8_case(37, 70, 96, 5, 16, seed=3)
    p = mg.fp8_plan(small_plan(r_max=16, **PLANS[plan]), terms)
    y = run(case, mode, p, fp8_activations=terms)
    assert not y.isnan().any(), "unwritten (NaN) outputs"
    assert rel(y, fp8_ref(case, terms)) < 4e-3


@pytest.mark.parametrize("dtype, per_tensor", [(E5M2, False), (E4M3, True)])
def test_fp8_weight_formats(dtype, per_tensor):
    case = fp8_case(21, 48, 64, 3, 16, dtype=dtype, per_tensor=per_tensor, seed=1)
    y = run(case, "auto", mg.fp8_plan(small_plan(r_max=16), 0))
    assert rel(y, fp8_ref(case)) < 4e-3


def test_two_terms_close_the_gap_to_the_16_bit_x():
    """Against the fp8 W with the exact x: one e4m3 term of x costs ~2⁻⁵, two ~2⁻⁹ (row_quant's numbers)."""
    case = fp8_case(40, 64, 128, 4, 16, seed=5)
    exact = fp8_ref(case, 0)
    errs = [rel(run(case, "gather", mg.fp8_plan(small_plan(r_max=16), t), fp8_activations=t), exact) for t in (1, 2)]
    assert errs[1] < 5e-3 < errs[0] / 2


def test_fp8_plan_rules():
    base = small_plan(r_max=16, bn=64)
    assert mg.fp8_plan(base, 0).main.swap_ab                     # widened W: W on the wgmma's M where it fits
    assert mg.fp8_plan(base, 0).main.block_k == 128              # … reading 128 bytes of fp8 W per row and step
    assert mg.fp8_plan(small_plan(r_max=16, bn=64, bk=256), 0).main.block_k == 256
    assert not mg.fp8_plan(small_plan(r_max=16, bn=32), 0).main.swap_ab      # block_n 32 cannot be the wgmma's M
    fused = small_plan(r_max=16, bn=64, fuse_d=2, epi_d=2)
    assert mg.fp8_plan(fused, 0) == fused                        # a fused shrink stays (its MMA has block_m rows)
    assert mg.fp8_plan(fused, 1).fuse_d == 0 and mg.fp8_plan(fused, 2).fuse_d == 0   # S needs the 16-bit x
    assert mg.fp8_plan(base, 1) == base


def test_fp8_through_the_op_and_the_module():
    from lowrank_gemm.nn import MultiLoRALinear
    case = fp8_case(2 * 11, 48, 64, 3, 16, seed=2)
    args = [case[k] for k in ("x", "weight", "bank_a", "bank_b", "ranks", "scales", "adapter_ids", "bias")]
    for terms in (0, 1, 2):
        want = fp8_ref(case, terms)
        y = mg.multi_lora_linear(*args[:2], *args[2:7], bias=args[7], weight_scale=case["weight_scale"],
                                 fp8_activations=terms)
        assert rel(y, want) < 4e-3
        y3 = mg.multi_lora_linear(case["x"].reshape(2, 11, 64), *args[1:7], bias=args[7],
                                  weight_scale=case["weight_scale"], fp8_activations=terms)
        assert rel(y3.reshape(22, 48), want) < 4e-3
        y_op = torch.ops.lowrank_gemm.multi_lora_linear(*args[:7], args[7], None, "auto", True, None, False,
                                                        case["weight_scale"], terms)
        assert rel(y_op, want) < 4e-3
    # the module: quantize W in place, x per token in two terms
    lin = torch.nn.Linear(64, 48).half()
    mod = MultiLoRALinear.from_linear(lin, num_slots=3, r_max=16)
    a, b = clean(case)
    for l in range(3):
        r = int(case["ranks"][l])
        mod.bank.set_adapter(l, a[l, :r], b[l, :, :r], float(case["scales"][l]))
    mod.set_adapter_ids(case["adapter_ids"])
    y16 = mod(case["x"])
    mod.quantize_weight_fp8_(activations=2)
    assert mod.base.weight.dtype == E4M3 and mod.fp8_activations == 2 and "fp8" in repr(mod)
    with torch.no_grad():
        y8 = mod(case["x"])
        direct = mg.multi_lora_linear(case["x"], mod.base.weight, mod.bank, adapter_ids=case["adapter_ids"],
                                      bias=mod.base.bias, weight_scale=mod.weight_scale, fp8_activations=2)
    assert torch.equal(y8, direct)
    assert rel(y8, y16.detach().double()) < 3e-2          # e4m3 W: 3 mantissa bits
    with pytest.raises(ValueError, match="already"):
        mod.quantize_weight_fp8_()


def test_fp8_bad_input():
    case = fp8_case(8, 32, 64, 2, 16)
    with pytest.raises(ValueError, match="without the fused shrink"):     # a given plan runs as given, or not
        mg.multi_lora_gemm(**case, plan=small_plan(r_max=16, fuse_d=2, epi_d=2), fp8_activations=1)
    ws = case.pop("weight_scale")
    with pytest.raises(ValueError, match="needs weight_scale"):
        mg.multi_lora_gemm(**case)
    with pytest.raises(ValueError, match=r"weight_scale must be \[N\] = \[32\]"):
        mg.multi_lora_gemm(**case, weight_scale=ws[:5])
    with pytest.raises(TypeError, match="floating-point"):
        mg.multi_lora_gemm(**case, weight_scale=ws.int())
    with pytest.raises(ValueError, match="must be float8_e4m3fn"):
        mg.multi_lora_gemm(**dict(case, weight=case["weight"].to(E5M2)), weight_scale=ws, fp8_activations=True)
    with pytest.raises(ValueError, match="fp8_activations must be"):
        mg.multi_lora_linear(case["x"], case["weight"], case["bank_a"], case["bank_b"], case["ranks"],
                             case["scales"], case["adapter_ids"], weight_scale=ws, fp8_activations=3)
    with pytest.raises(ValueError, match="dtype must match x"):
        mg.multi_lora_gemm(**dict(case, weight=case["weight"].to(torch.int8)), weight_scale=ws)


@pytest.mark.parametrize("terms", [0, 2, "2swap"])
def test_fp8_main_compiles_for_sm90(terms):
    """sm_90: the fp8 × fp8 wgmma (terms) or the widened W on the swapped tile's register operand; no spill. Two
    terms on the swapped decode tile keep the residual's own accumulator (session 38) without spilling."""
    from _sm90 import ptxas_stats
    from test_multilora_gemm import _compile_main
    if terms == "2swap":
        cfg = KernelConfig(block_m=16, block_n=128, block_k=128, block_r=16, num_stages=4, num_warps=4, swap_ab=True)
        info = _compile_main(cfg, False, swap_ab=True, w_fp8=True, x_terms=2)
        assert info.has("wgmma.mma_async", "e4m3.e4m3")
    elif terms:
        cfg = KernelConfig(block_m=64, block_n=128, block_k=128, block_r=16, num_stages=4, num_warps=4)
        info = _compile_main(cfg, False, w_fp8=True, x_terms=terms)
        assert info.has("wgmma.mma_async", "e4m3.e4m3")
    else:
        cfg = KernelConfig(block_m=16, block_n=128, block_k=128, block_r=16, num_stages=4, num_warps=4, swap_ab=True)
        info = _compile_main(cfg, False, swap_ab=True, w_fp8=True)
        assert info.has("wgmma.mma_async") and "e4m3" not in info.ptx.split("wgmma")[1][:200]
    stats = ptxas_stats(info.ptx)
    if stats is not None:
        assert stats[1] == 0, f"spills {stats[1]} bytes"


# ---------------------------------------------------------------------------- GPU, real sizes

def _gpu_case(M, N, K, L, r, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    w8, ws = fp8_rows(torch.randn(N, K, device="cuda", generator=g) / K ** 0.5)
    a = (torch.randn(L, r, K, device="cuda", generator=g) / K ** 0.5).bfloat16()
    b = (torch.randn(L, N, r, device="cuda", generator=g) * 0.1).bfloat16()
    ids = torch.randint(-1, L, (M,), device="cuda", generator=g, dtype=torch.int32)
    return dict(x=x, weight=w8, bank_a=a, bank_b=b, ranks=torch.full((L,), r, dtype=torch.int32, device="cuda"),
                scales=torch.rand(L, device="cuda", generator=g) + 0.5, adapter_ids=ids,
                bias=torch.randn(N, device="cuda", generator=g).bfloat16(), weight_scale=ws)


@pytest.mark.gpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("terms", [0, 1, 2])
@pytest.mark.parametrize("shape", [(1, 28672, 4096, 4, 16), (16, 4096, 4096, 16, 16), (64, 28672, 4096, 16, 64),
                                   (256, 4096, 4096, 64, 16), (300, 5000, 3000, 7, 32)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_fp8_base_real_sizes(shape, terms):
    M, N, K, L, r = shape
    case = _gpu_case(M, N, K, L, r)
    y = mg.multi_lora_linear(case["x"], case["weight"], case["bank_a"], case["bank_b"], case["ranks"],
                             case["scales"], case["adapter_ids"], bias=case["bias"],
                             weight_scale=case["weight_scale"], fp8_activations=terms)
    assert not y.isnan().any()
    assert rel(y, fp8_ref({k: v.cpu() for k, v in case.items()}, terms).cuda()) < 1e-2
    again = mg.multi_lora_linear(case["x"], case["weight"], case["bank_a"], case["bank_b"], case["ranks"],
                                 case["scales"], case["adapter_ids"], bias=case["bias"],
                                 weight_scale=case["weight_scale"], fp8_activations=terms)
    assert torch.equal(y, again)


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_gpu_fp8_base_cuda_graph():
    case = _gpu_case(16, 4096, 4096, 8, 16, seed=4)
    call = lambda: mg.multi_lora_linear(case["x"], case["weight"], case["bank_a"], case["bank_b"], case["ranks"],  # noqa: E731
                                        case["scales"], case["adapter_ids"], bias=case["bias"],
                                        weight_scale=case["weight_scale"], fp8_activations=2, validate=False)
    want = call()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = call()
    case["x"].mul_(1.0)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, want)


def test_fp8_opcheck_and_compile():
    """The op's schema takes the fp8 arguments (fake tensor), and torch.compile traces the fp8 call."""
    case = fp8_case(6, 32, 64, 2, 16, seed=7)
    args = (case["x"], case["weight"], case["bank_a"], case["bank_b"], case["ranks"], case["scales"],
            case["adapter_ids"], case["bias"], None, "gather", False, None, False, case["weight_scale"], 2)
    torch.library.opcheck(torch.ops.lowrank_gemm.multi_lora_linear.default, args, test_utils=("test_faketensor",))

    def f(x):
        return mg.multi_lora_linear(x, case["weight"], case["bank_a"], case["bank_b"], case["ranks"], case["scales"],
                                    case["adapter_ids"], bias=case["bias"], weight_scale=case["weight_scale"],
                                    fp8_activations=1, validate=False).relu()
    y = torch.compile(f, fullgraph=True, backend="aot_eager")(case["x"])
    assert rel(y, fp8_ref(case, 1).relu()) < 4e-3
