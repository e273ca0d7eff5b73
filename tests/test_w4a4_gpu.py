"""W4A4 kernels on the GPU at real sizes (bf16): accuracy vs float64, determinism, CUDA graphs, compile.

Run on the device machine: ``PYTHONPATH=src python -m pytest -m gpu tests/test_w4a4_gpu.py -x -q``.
"""


import pytest
import torch

from lowrank_gemm.bench.common import capture_graph
from lowrank_gemm.formats.int4 import pack_int4, quantize_act_int4, quantize_weight_int4
from lowrank_gemm.formats.int4_twolevel import pack_weight_2l, quantize_act_2l
from lowrank_gemm.kernels.act_quant import act_quant
from lowrank_gemm.kernels.w4a4_gemm import svdq_forward_cuda, w4a4_gemm, w4a4_linear
from lowrank_gemm.reference import svdq_linear_ref, w4a4_gemm_ref

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]

SHAPES = [(4608, 12288, 3072), (4608, 3072, 12288), (1, 28672, 4096), (16, 28672, 4096), (64, 28672, 4096),
          (333, 1000, 1024)]  # the last one ragged in M and N
FMTS = ["int4_g64", "int4_2l"]


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _layer(m, n, k, fmt, r=32, g=64):
    dev = "cuda"
    torch.manual_seed(0)
    x = (torch.randn(m, k, device=dev) * torch.exp(torch.randn(k, device=dev) * 0.5)).bfloat16()
    smooth = (torch.rand(k, device=dev) + 0.5).bfloat16()
    w = torch.randn(n, k, device=dev) * 0.02
    p = dict(smooth=smooth, lora_down=(torch.randn(r, k, device=dev) * 0.02).bfloat16(),
             lora_up=(torch.randn(n, r, device=dev) * 0.02).bfloat16(), bias=torch.randn(n, device=dev).bfloat16())
    if fmt == "int4_g64":
        qw, sw = quantize_weight_int4(w, g)
        p.update(qweight=pack_int4(qw), wscales=sw)
    else:
        q, u, s = pack_weight_2l(w, g)
        p.update(qweight=q, wscales=s, wmul=u)
    return x, p


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemm_fp32_vs_float64(fmt, m, n, k):
    """rel err ≤ 1e-3 before the final cast, on the same quantized operands (act_quant's output)."""
    x, p = _layer(m, n, k, fmt)
    xq, xs, s = act_quant(x, p["smooth"], p["lora_down"], 64, fmt)
    y = w4a4_gemm(xq, xs, p["qweight"], p["wscales"], s, p["lora_up"], p["bias"], w_mul=p.get("wmul"), fmt=fmt,
                  out_dtype=torch.float32, impl="v1")
    ref = w4a4_gemm_ref(xq, xs, p["qweight"], p["wscales"], s, p["lora_up"], p["bias"], w_mul=p.get("wmul"),
                        fmt=fmt)
    assert torch.isfinite(y).all()
    assert _rel(y, ref) <= 1e-3
    y2 = w4a4_gemm(xq, xs, p["qweight"], p["wscales"], s, p["lora_up"], p["bias"], w_mul=p.get("wmul"), fmt=fmt,
                   out_dtype=torch.float32, impl="v1")
    assert torch.equal(y, y2)  # deterministic: bit-identical reruns


def _assert_torch_quantizer_bits(xq, xs, s, x, p, fmt):
    """act_quant's outputs are the torch quantizer's bits; S within 1e-5 of float64."""
    xsm = x.float() / p["smooth"].float()
    if fmt == "int4_g64":
        q_ref, sc_ref = quantize_act_int4(xsm, 64)
        assert torch.equal(xq, pack_int4(q_ref)) and torch.equal(xs, sc_ref)
    else:
        e_ref, t_ref = quantize_act_2l(xsm, 64)
        assert torch.equal(xq, e_ref) and torch.equal(xs, t_ref)
    assert _rel(s, xsm.double() @ p["lora_down"].double().T) < 1e-5


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("m", [4608, 64])
def test_act_quant_bit_identical_on_gpu(fmt, m):
    x, p = _layer(m, 1024, 3072, fmt)
    xq, xs, s = act_quant(x, p["smooth"], p["lora_down"], 64, fmt)
    _assert_torch_quantizer_bits(xq, xs, s, x, p, fmt)


@pytest.mark.parametrize("m,n,k", [(4608, 3072, 3072), (16, 28672, 4096)])
def test_linear_vs_svdq_reference(m, n, k):
    x, p = _layer(m, n, k, "int4_g64")
    y = w4a4_linear(x, out_dtype=torch.float32, impl="v1", **p)
    ref = svdq_linear_ref(x, **p)
    # act_quant matches the spec's quantizer; S is rounded to bf16 before S·Bᵀ (the epilogue contract)
    assert _rel(y, ref) <= 3e-3
    yb = w4a4_linear(x, impl="v1", **p)
    assert yb.dtype == torch.bfloat16 and _rel(yb, ref) <= 5e-3


@pytest.mark.parametrize("impl", ["v1", "auto"])
@pytest.mark.parametrize("m", [64, 512])
@pytest.mark.parametrize("fmt", FMTS)
def test_cuda_graph_capture_and_compile(fmt, m, impl):
    """M=512 takes the "expand" plan (a transient expanded-weight buffer inside the capture); auto may pick
    the Gluon v2."""
    x, p = _layer(m, 28672 if m == 64 else 3072, 4096, fmt)
    eager = w4a4_linear(x, fmt=fmt, impl=impl, **p)
    static_x = x.clone()
    _, graph, out = capture_graph(lambda: w4a4_linear(static_x, fmt=fmt, impl=impl, **p))
    static_x.copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    compiled = torch.compile(lambda x: w4a4_linear(x, fmt=fmt, impl=impl, **p), fullgraph=True)
    assert torch.equal(compiled(x), eager)


@pytest.mark.parametrize("m", [1, 16, 64])
def test_torch_compile_reduce_overhead(m, fresh_kernel_buffers):
    """CUDA-graph trees over the W4A4 layer (decode kernels, activation quantizer with its tickets, Gluon
    placeholders) from a fresh process's state, new X every call: each output equals the eager op's bits."""
    _, p = _layer(m, 3072, 4096, "int4_g64")
    g = torch.compile(lambda x: w4a4_linear(x, fmt="int4_g64", **p), mode="reduce-overhead", fullgraph=True)
    for seed in range(5):
        torch.manual_seed(100 + seed)
        x = torch.randn(m, 4096, device="cuda").bfloat16()
        y = g(x).clone()
        torch.cuda.synchronize()
        assert torch.equal(y, w4a4_linear(x, fmt="int4_g64", **p)), f"call {seed}"


def test_nan_rows_on_gpu():
    x, p = _layer(128, 4096, 4096, "int4_g64")
    x[7, 100] = float("nan")
    x[9, 5] = float("inf")
    y = w4a4_linear(x, impl="v1", **p)
    assert torch.isnan(y[7]).all() and torch.isnan(y[9]).all()
    assert torch.isfinite(y[10:]).all()


def test_odd_rank_appended_lora():
    """Extra LoRA rank appended to the SVD branch (r = 32 + 13) goes through the same kernels."""
    x, p = _layer(300, 3072, 3072, "int4_g64", r=45)
    y = w4a4_linear(x, out_dtype=torch.float32, impl="v1", **p)
    assert _rel(y, svdq_linear_ref(x, **p)) <= 3e-3


def test_svdq_module_hookup():
    import lowrank_gemm.quant  # noqa: F401  (import order: nn.svdq and quant import each other)
    from lowrank_gemm.nn.svdq import SVDQLinear
    x, p = _layer(64, 3072, 3072, "int4_g64")
    layer = SVDQLinear(3072, 3072, 32, 64, bias=True, bias_dtype=torch.bfloat16).cuda()
    for name in ("qweight", "wscales", "smooth", "lora_down", "lora_up", "bias"):
        setattr(layer, name, p[name])
    layer._forward_kernel = svdq_forward_cuda
    y = layer(x)
    assert _rel(y, layer.forward_reference(x)) <= 1e-2


@pytest.mark.parametrize("m", [1, 64, 4608])
def test_two_level_module_on_the_kernels(m):
    """quantize_ with weight_format="int4_2l" gives layers whose CUDA forward runs the two-level kernels and matches
    their float64 spec (``svdq_linear_ref(fmt="int4_2l")``) and the layer's own reference path."""
    from lowrank_gemm.quant import SVDQuantConfig, quantize_
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3072, 3072)).cuda()
    calib = torch.randn(256, 3072, device="cuda")
    quantize_(model, SVDQuantConfig(rank=32, refit_iters=2, weight_format="int4_2l"), [calib], progress=False)
    layer = model[0]
    assert layer.weight_format == "int4_2l" and layer.wmul.is_cuda
    x = (torch.randn(m, 3072, device="cuda") * 2).bfloat16()
    y = layer(x)
    ref = svdq_linear_ref(x, layer.qweight, layer.wscales, layer.smooth, layer.lora_down, layer.lora_up, layer.bias,
                          64, fmt="int4_2l", wmul=layer.wmul)
    assert y.dtype == torch.bfloat16 and _rel(y, ref) <= 1e-2
    assert _rel(y, layer.forward_reference(x)) <= 1e-2
    assert torch.equal(y, layer(x))


@pytest.mark.parametrize("fmt", FMTS)
def test_v2_matches_v1_if_present(fmt):
    pytest.importorskip("lowrank_gemm.kernels.gluon.w4a4_ws")
    from lowrank_gemm.kernels.gluon.w4a4_ws import two_level_enabled
    if fmt == "int4_2l" and not two_level_enabled():
        pytest.skip("int4_2l v2 switched off (LOWRANK_GEMM_GLUON_2L=0)")
    x, p = _layer(4608, 3072, 3072, fmt)
    y1 = w4a4_linear(x, fmt=fmt, impl="v1", out_dtype=torch.float32, **p)
    y2 = w4a4_linear(x, fmt=fmt, impl="v2", out_dtype=torch.float32, **p)
    assert _rel(y2, y1) <= 1e-5


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("m", [1, 64])
def test_swap_wide_k_steps_bit_identical(fmt, m):
    """SWAP-AB with block_k = 128/256/512 (several groups per pipelined step) adds the same terms in the
    same order as one group per step: bit-identical outputs (fp32 out)."""
    from lowrank_gemm.kernels.w4a4_gemm import W4A4Plan, launch_w4a4_v1, swap_config
    n, k = 4096, 4096
    x, p = _layer(m, n, k, fmt)
    xq, xs, s = act_quant(x, p["smooth"], p["lora_down"], 64, fmt)
    outs = []
    for bk in (None, 128, 256, 512):
        out = torch.full((m, n), float("nan"), device="cuda")
        plan = W4A4Plan("swap_ab", swap_config(m, 32, fmt, 64, block_n=128, block_k=bk))
        outs.append(launch_w4a4_v1(xq, xs, p["qweight"], p["wscales"], p.get("wmul"), s, p["lora_up"], p["bias"],
                                   out, fmt, 64, plan=plan))
    assert torch.isfinite(outs[0]).all()
    for o in outs[1:]:
        assert torch.equal(o, outs[0])


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("tiles", [(32, 64, 4), (64, 64, 4), (64, 256, 8)])
def test_act_quant_plan_variants_bit_identical(fmt, tiles):
    """Every act_quant plan the probe can pin gives the torch quantizer's bits at FLUX size."""
    x, p = _layer(4608, 8, 3072, fmt)
    bm, bk, w = tiles
    xq, xs, s = act_quant(x, p["smooth"], p["lora_down"], 64, fmt, block_m=bm, block_k=bk, num_warps=w)
    _assert_torch_quantizer_bits(xq, xs, s, x, p, fmt)
