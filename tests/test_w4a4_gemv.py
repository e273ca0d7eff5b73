"""The W4A4 GEMV for a few tokens (kernels/w4a4_gemv.py): interpreter numerics against the float64 reference on
ragged shapes, sm_90 compiles (dp4a, no spills), bad inputs; on the GPU real decode sizes, repeats, graph replay.

    CPU:  PYTHONPATH=src python -m pytest -q tests/test_w4a4_gemv.py
    GPU:  PYTHONPATH=src python -m pytest -m gpu -q tests/test_w4a4_gemv.py
"""

import re

import pytest
import torch

from lowrank_gemm.kernels import w4a4_gemv as gv
from lowrank_gemm.kernels.gluon import w4a4_ws as w4

from _sm90 import ptxas_stats  # noqa: E402

MOD = "lowrank_gemm.kernels.w4a4_gemv"


def _ops(M, N, K, rank, G, *, device="cpu", out=torch.float32, bias=True, col_scale=True, seed=0):
    # lora_up fp16 on the CPU: the interpreter rounds fp32 → bf16 by truncation, fp16 as the GPU does
    return w4.make_operands_v2("int4_g64", M, N, K, rank, G, device=device, bias=bias, col_scale=col_scale,
                               out_dtype=out, lowrank_dtype=torch.float16 if device == "cpu" else torch.bfloat16,
                               seed=seed)


@pytest.mark.parametrize("M,N,K,rank,G,cfg", [
    (1, 40, 448, 16, 64, None),                    # ragged N; K = 7 groups (the 512-wide chunk shrinks to one group)
    (3, 72, 512, 0, 64, None),                     # no low-rank, three tokens
    (2, 33, 256, 5, 128, None),                    # G = 128, odd rank, N not a multiple of anything
    (4, 100, 1024, 32, 64, gv.GemvConfig(16, 32, 2, 2)),
    (1, 64, 2048, 64, 64, gv.GemvConfig(64, 128, 4, 3)),
])
def test_matches_the_float64_reference(M, N, K, rank, G, cfg):
    ops = _ops(M, N, K, rank, G, bias=rank > 0, col_scale=rank % 2 == 0)
    y = gv.launch_w4a4_gemv(**ops, config=cfg).double()
    ref = w4.reference_v2(ops)
    assert torch.isfinite(y).all(), "every output element written (out was NaN-poisoned)"
    assert float((y - ref).abs().max() / ref.abs().max()) < 1e-5


def test_bf16_out_and_repeats_are_bit_identical():
    ops = _ops(2, 48, 512, 16, 64, out=torch.bfloat16)
    y = gv.launch_w4a4_gemv(**ops).clone()
    ref = w4.reference_v2(ops)
    assert float((y.double() - ref).abs().max() / ref.abs().max()) < 1e-2
    ops["out"].fill_(float("nan"))
    assert torch.equal(gv.launch_w4a4_gemv(**ops), y)


@pytest.mark.parametrize("M,N,K,rank,cfg", [
    (1, 40, 448, 16, None),                        # ragged N, 7 groups
    (2, 72, 512, 5, gv.GemvConfig(16, 32, 2, 2)),
    (3, 33, 256, 0, None),
    (1, 64, 2048, 8, gv.GemvConfig(64, 128, 4, 3)),
])
def test_two_level_matches_the_float64_reference(M, N, K, rank, cfg):
    """int4_2l (expanded int8 activations, per-group integer multipliers u, per-row s and per-token t): the int32
    partials × u summed exactly, × t·s once."""
    ops = w4.make_operands_v2("int4_2l", M, N, K, rank, 64, device="cpu", bias=True, col_scale=rank % 2 == 0,
                              out_dtype=torch.float32, lowrank_dtype=torch.float16)
    y = gv.launch_w4a4_gemv(**ops, config=cfg).double()
    ref = w4.reference_v2(ops)
    assert torch.isfinite(y).all(), "every output element written (out was NaN-poisoned)"
    assert float((y - ref).abs().max() / ref.abs().max()) < 1e-5


@pytest.mark.parametrize("kw,match", [
    (dict(fmt="int4_g128"), "int4_g64 or int4_2l"),
    (dict(config=gv.GemvConfig(32, 12, 4, 3)), "power of two"),
    (dict(config=gv.GemvConfig(32, 4, 4, 3)), "whole groups"),
])
def test_bad_configs(kw, match):
    ops = _ops(1, 32, 256, 0, 64)
    if "fmt" in kw:
        ops["fmt"] = kw.pop("fmt")
    with pytest.raises(ValueError, match=match):
        gv.launch_w4a4_gemv(**ops, **kw)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_group_scale_poisons_its_token_only(bad):
    """act_quant gives a group holding NaN/Inf a NaN/Inf scale and zero nibbles: 0 · NaN and 0 · Inf are NaN, so that
    token's outputs are all NaN (as w4a4_linear documents) and the other tokens' are untouched."""
    ops = _ops(3, 40, 512, 8, 64)
    clean = gv.launch_w4a4_gemv(**ops).clone()
    xq = ops["x_q"].clone()
    xq[1, 64:96] = 0                                  # token 1, group 2: zero nibbles …
    xs = ops["x_scale"].clone()
    xs[2, 1] = bad                                    # … and a non-finite scale
    ops["out"].fill_(0.0)
    y = gv.launch_w4a4_gemv(**{**ops, "x_q": xq, "x_scale": xs})
    assert torch.isnan(y[1]).all()
    assert torch.equal(y[0], clean[0]) and torch.equal(y[2], clean[2])


def test_split_k_is_the_gluon_kernels():
    """The few-row default config splits K (Gluon); the Triton kernel runs it unsplit; asking the Triton kernel
    for split-K explicitly is an error."""
    ops = _ops(1, 40, 512, 0, 64)
    y = gv.launch_w4a4_gemv(**ops, kernel="triton")
    assert torch.isfinite(y).all()
    _, _, _, cfg = gv.gemv_args(**ops, kernel="triton")
    assert cfg.split == 1 and gv.gemv_config(None, 40).split == 2
    with pytest.raises(ValueError, match="Gluon kernel's option"):   # two 512-wide chunks to split
        gv.launch_w4a4_gemv(**_ops(1, 40, 1024, 0, 64), kernel="triton", config=gv.GemvConfig(8, 64, 4, 2, 2))


def test_bad_inputs():
    ops = _ops(1, 32, 256, 8, 64)
    with pytest.raises(ValueError, match="packed int4"):
        gv.launch_w4a4_gemv(**{**ops, "x_q": torch.zeros(1, 256, dtype=torch.float8_e4m3fn),
                               "x_scale": torch.zeros(4, 2, 1)})
    with pytest.raises(ValueError, match="out must be"):
        gv.launch_w4a4_gemv(**{**ops, "out": torch.empty(1, 31)})
    with pytest.raises(ValueError, match="wscales"):
        gv.launch_w4a4_gemv(**{**ops, "w_scale": ops["w_scale"][:, :16]})
    with pytest.raises(ValueError, match="4-byte aligned"):
        xq = torch.empty(1 * 128 + 1, dtype=torch.uint8)[1:].view(1, 128)
        gv.launch_w4a4_gemv(**{**ops, "x_q": xq})
    with pytest.raises(ValueError, match="GEMV_CONFIG"):
        import os
        os.environ[gv.CONFIG_ENV] = "32,64"
        try:
            gv.launch_w4a4_gemv(**ops)
        finally:
            del os.environ[gv.CONFIG_ENV]


def _compile(cfg, kernel):
    from lowrank_gemm.kernels.aot import compile_sm90
    sig, cx, c = gv.aot_signature_gemv(cfg, kernel=kernel)
    name = "w4a4_gemv_gl_kernel" if kernel == "gluon" else "w4a4_gemv_kernel"
    # the pointers 16-byte aligned, as the JIT specializes them at launch (torch allocations)
    return compile_sm90(MOD, name, sig, cx, num_warps=c.num_warps, num_stages=c.num_stages,
                        aligned=tuple(a for a in sig if a.endswith("_ptr")))


@pytest.mark.parametrize("kernel,cfg", [("triton", None), ("triton", gv.GemvConfig(64, 128, 4, 3)),
                                        ("gluon", None), ("gluon", gv.GemvConfig(32, 128, 4, 1)),
                                        ("gluon", gv.GemvConfig(16, 16, 2, 1, 4))],
                         ids=lambda v: v if isinstance(v, str) else "default" if v is None else "-".join(map(str, v)))
def test_sm90_compile_dp4a_no_spills(kernel, cfg):
    """Compiled for sm_90: the weight words go through dp4a (two per packed word and token), the weight loads are
    16-byte vectors, PDL's griddepcontrol is there, and ptxas spills nothing."""
    info = _compile(cfg, kernel)
    assert "dp4a.u32.s32" in info.ptx and "griddepcontrol.wait" in info.ptx
    tickets = bool(re.search(r"atom\.global\.gpu\.acq_rel\.add", info.ptx))
    assert tickets == bool(cfg and cfg.split > 1), "split-K tickets"
    assert not re.search(r"\bmma\b|wgmma", info.ptx), "CUDA cores only"
    assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", info.ptx), "16-byte weight loads"
    res = ptxas_stats(info.ptx)
    if res is not None:
        assert res[1] == 0, f"ptxas spills {res[1]} B ({res[0]} registers)"


@pytest.mark.parametrize("kernel", ["gluon", "triton"])
def test_sm90_compile_two_level(kernel):
    """int4_2l compiled for sm_90: dp4a on the weight words against the int8 activation words (16-byte loads of
    both), the u multipliers as integers (no per-group float rescale: one int → float conversion per row, after the
    loop), no split-K tickets, no spills."""
    from lowrank_gemm.kernels.aot import compile_sm90
    sig, cx, c = gv.aot_signature_gemv(None, kernel=kernel, fmt="int4_2l", N=256, K=2048, M=1)
    assert cx["TWO_LEVEL"] and sig["wu_ptr"] == "*u8" and sig["xq_ptr"] == "*i32"
    name = "w4a4_gemv_gl_kernel" if kernel == "gluon" else "w4a4_gemv_kernel"
    info = compile_sm90(MOD, name, sig, cx, num_warps=c.num_warps, num_stages=c.num_stages,
                        aligned=tuple(a for a in sig if a.endswith("_ptr")))
    assert "dp4a.u32.s32" in info.ptx and not re.search(r"atom\.global", info.ptx)
    assert len(re.findall(r"ld\.global(\.\w+)*\.v4\.b32", info.ptx)) >= 2, "16-byte weight and activation loads"
    if kernel == "gluon":
        loops = [b for _, b in _ptx_loops(info.ptx) if "dp4a" in "".join(b)]
        assert loops and not any("cvt.rn.f32.s32" in x for b in loops for x in b), "no float rescale in the loop"
    res = ptxas_stats(info.ptx)
    if res is not None:
        assert res[1] == 0, f"ptxas spills {res[1]} B ({res[0]} registers)"


def test_two_level_split_k_is_refused():
    ops = w4.make_operands_v2("int4_2l", 1, 64, 512, 0, 64, device="cpu", out_dtype=torch.float32)
    with pytest.raises(ValueError, match="int4_2l runs without split-K"):
        gv.gemv_args(**ops, config=gv.GemvConfig(16, 16, 2, 1, 4), kernel="gluon", swar=True)
    assert gv.gemv_args(**ops, kernel="gluon", swar=True)[3].split == 1      # the few-row default's split dropped


def test_sm90_gluon_k_loop_stays_in_registers():
    """The Gluon kernel's K loop moves nothing between threads: no shared memory, no barrier, no shuffle (the
    Triton version's compiler converted its accumulator through shared memory every iteration)."""
    info = _compile(None, "gluon")
    body = [x for _, b in _ptx_loops(info.ptx) for x in b if "dp4a" in "".join(b)]
    assert body and not any(re.search(r"\b(bar\.sync|st\.shared|ld\.shared|shfl)", x) for x in body)


def _ptx_loops(ptx):
    """(label, body lines) of every PTX loop (a block that branches back to its own label)."""
    lines = ptx.splitlines()
    out = []
    for i, ln in enumerate(lines):
        mt = re.match(r"^(\$L__BB\d+_\d+):", ln)
        if not mt:
            continue
        for j in range(i + 1, len(lines)):
            if re.search(rf"bra(\.uni)?\s+{re.escape(mt.group(1))};", lines[j]):
                out.append((mt.group(1), lines[i:j + 1]))
                break
    return out


def test_route(monkeypatch):
    """impl="auto": int4_g64 with M ≤ AUTO_GEMV_MAX_M on packed activations on CUDA goes to the GEMV; two-level,
    pre-expanded e4m3 activations, more tokens, the CPU or LOWRANK_GEMM_GEMV=0 do not; impl="gemv" on what it
    cannot run is an error."""
    from lowrank_gemm.kernels.w4a4_gemm import _route
    cuda = torch.device("cuda")
    xs = torch.empty(64, 1, dtype=torch.bfloat16, device="meta")
    ws = torch.empty(64, 28672, dtype=torch.bfloat16, device="meta")

    def route(impl="auto", fmt="int4_g64", m=1, device=cuda, pre=False):
        return _route(impl, fmt, m, 28672, 4096, 32, 64, device, xs, ws, None, pre)

    assert route() == "gemv" and route(m=gv.AUTO_GEMV_MAX_M) == "gemv"
    assert route(m=gv.AUTO_GEMV_MAX_M + 1) != "gemv"
    # few weight rows: the same bound (the skinny GEMM takes M = 3.. there)
    few = _route("auto", "int4_g64", gv.AUTO_GEMV_MAX_M, 4096, 4096, 32, 64, cuda, xs, ws, None, False)
    more = _route("auto", "int4_g64", gv.AUTO_GEMV_MAX_M + 1, 4096, 4096, 32, 64, cuda, xs, ws, None, False)
    assert few == "gemv" and more == "skinny" and gv.auto_gemv_max_m(4096) == gv.auto_gemv_max_m(28672)
    assert route(pre=True) != "gemv" and route(device=torch.device("cpu")) == "v1"
    assert route(impl="gemv", m=16) == "gemv"
    # int4_2l: the same bound (session 11: M = 1 / 2 beat the decode kernel at every measured shape but N = 28672,
    # M = 2, a tie), and the decode kernel above it
    assert route(fmt="int4_2l") == "gemv" and route(fmt="int4_2l", m=gv.AUTO_GEMV_MAX_M) == "gemv"
    assert route(fmt="int4_2l", m=gv.AUTO_GEMV_MAX_M + 1) == "decode"
    assert route(impl="gemv", fmt="int4_2l") == "gemv"
    monkeypatch.setenv("LOWRANK_GEMM_GEMV", "0")
    assert route() != "gemv"
    with pytest.raises(ValueError, match="impl='gemv'"):
        route(impl="gemv", fmt="int4_g128")
    with pytest.raises(ValueError, match="impl='gemv'"):
        route(impl="gemv", pre=True)


def test_config_by_rows():
    assert gv.gemv_config(None, 28672) == gv.DEFAULT_CONFIG and gv.gemv_config(None, 4096) == gv.WIDE_CONFIG
    assert gv.gemv_config(gv.GemvConfig(8, 64, 1, 3), 4096) == (8, 64, 1, 3, 1)


# ---------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 2])
def test_gpu_layer_auto_routes_here_and_matches_v1(M):
    """The layer op (act_quant + GEMM) with impl="auto" at M ≤ 2 runs the GEMV (packed activations, PDL) and agrees
    with the v1 kernel on the same quantized operands."""
    from lowrank_gemm.kernels.w4a4_gemm import w4a4_linear
    from _w4a4_layer import layer_args
    args = layer_args(M, seed=M)
    y = w4a4_linear(*args, impl="auto")
    ref = w4a4_linear(*args, impl="v1")
    assert float((y.float() - ref.float()).abs().max() / ref.float().abs().max()) < 1e-2
    assert torch.equal(w4a4_linear(*args, impl="gemv"), y)
SPLIT4 = gv.GemvConfig(16, 64, 2, 1, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,cfg", [("gluon", None), ("gluon", SPLIT4), ("triton", None)],
                         ids=["gluon", "gluon-split4", "triton"])
@pytest.mark.parametrize("M", [1, 2, 4])
@pytest.mark.parametrize("N,K,rank", [(28672, 4096, 32), (4096, 4096, 16), (3000, 1536, 0), (200, 448, 5)])
def test_gpu_real_sizes_repeats_and_graph(M, N, K, rank, kernel, cfg):
    """NaN-poisoned bf16 out vs the float64 reference, bit-identical repeats, CUDA-graph replay; split-K leaves its
    tickets at zero (K=448: 7 groups, split over 4 programs unevenly)."""
    from lowrank_gemm.kernels.lora_gemm import _TICKETS
    ops = _ops(M, N, K, rank, 64, device="cuda", out=torch.bfloat16, bias=True, col_scale=rank == 5, seed=M)
    _check_gpu_launch(ops, kernel, cfg)
    region = _TICKETS.region(torch.device("cuda", torch.cuda.current_device()))
    assert region is None or int(region.abs().sum()) == 0, "tickets back at zero"


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["gluon", "triton"])
@pytest.mark.parametrize("M", [1, 2])
@pytest.mark.parametrize("N,K,rank", [(28672, 4096, 32), (4096, 4096, 16), (200, 448, 5)])
def test_gpu_two_level_real_sizes(M, N, K, rank, kernel):
    """int4_2l through the GEMV (impl="gemv", opt-in): NaN-poisoned bf16 out vs the float64 reference, repeats,
    graph replay."""
    ops = w4.make_operands_v2("int4_2l", M, N, K, rank, 64, device="cuda", bias=True, col_scale=rank == 5, seed=M)
    _check_gpu_launch(ops, kernel, None)


def _check_gpu_launch(ops, kernel, cfg):
    """NaN-poisoned out vs the float64 reference, a bit-identical repeat, a CUDA-graph replay."""
    y = gv.launch_w4a4_gemv(**ops, kernel=kernel, config=cfg).clone()
    torch.cuda.synchronize()
    ref = w4.reference_v2(ops)
    assert torch.isfinite(y).all()
    assert float((y.double().cpu() - ref).abs().max() / ref.abs().max()) < 1e-2
    ops["out"].fill_(float("nan"))
    assert torch.equal(gv.launch_w4a4_gemv(**ops, kernel=kernel, config=cfg), y), "bit-identical repeats"
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gv.launch_w4a4_gemv(**ops, kernel=kernel, config=cfg)
    ops["out"].fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(ops["out"], y), "graph replay"


@pytest.mark.gpu
def test_gpu_two_level_layer_gemv_matches_decode():
    """The int4_2l layer with impl="gemv" against the decode kernel on the same quantized operands."""
    from lowrank_gemm.formats.int4_twolevel import pack_weight_2l
    from lowrank_gemm.kernels.w4a4_gemm import w4a4_linear
    torch.manual_seed(0)
    n, k = 4096, 4096
    wq, wmul, wsc = pack_weight_2l(torch.randn(n, k, device="cuda") * 0.02, 64)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    p = dict(qweight=wq, wscales=wsc, wmul=wmul, smooth=(torch.rand(k, device="cuda") + 0.5).to(torch.bfloat16),
             lora_down=(torch.randn(32, k, device="cuda") * 0.02).to(torch.bfloat16),
             lora_up=(torch.randn(n, 32, device="cuda") * 0.02).to(torch.bfloat16))
    y = w4a4_linear(x, **p, fmt="int4_2l", impl="gemv", out_dtype=torch.float32)
    ref = w4a4_linear(x, **p, fmt="int4_2l", impl="decode", out_dtype=torch.float32)
    assert float((y - ref).abs().max() / ref.abs().max()) < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["gluon", "triton"])
def test_gpu_fp32_result_is_exact_to_fp32_rounding(kernel):
    """The issue's accuracy bar on the fp32 result (before any cast): ≤ 1e-3 — here ~1e-7, the sums are exact ints."""
    ops = _ops(1, 28672, 4096, 32, 64, device="cuda", out=torch.float32)
    y = gv.launch_w4a4_gemv(**ops, kernel=kernel).double().cpu()
    ref = w4.reference_v2(ops)
    assert float((y - ref).norm() / ref.norm()) < 1e-6


def test_load_hints_reach_the_weight_loads_only():
    """``hints`` (default evict_first; env LOWRANK_GEMM_GEMV_HINTS): the weight stream's 16-byte loads carry the cache
    hint, the scale loads do not; unknown or conflicting hints are refused."""
    import re
    from lowrank_gemm.kernels.aot import compile_sm90
    assert gv.load_hints("") == {} and gv.load_hints("ef") == {"W_EVICT": "evict_first"}
    with pytest.raises(ValueError, match="hints"):
        gv.load_hints("zz")
    with pytest.raises(ValueError, match="cg"):
        gv.load_hints("ef,cg")
    sig, cx, cfg = gv.aot_signature_gemv(None, kernel="gluon", N=256, K=2048, M=1)
    assert cx["W_EVICT"] == "evict_first" and gv.DEFAULT_HINTS == "ef"      # the shipped default (session 11)
    cx = {k: v for k, v in cx.items() if k not in ("W_EVICT", "W_CACHE")}
    for hints, want in (("ef", "ld.global.L1::evict_first.L2::cache_hint.v4.b32"), ("cg", "ld.global.cg.v4.b32")):
        info = compile_sm90("lowrank_gemm.kernels.w4a4_gemv", "w4a4_gemv_gl_kernel", sig,
                            {**cx, **gv.load_hints(hints)}, num_warps=cfg.num_warps,
                            aligned=("xq_ptr", "wq_ptr", "ws_ptr", "xs_ptr"))
        lds = re.findall(r"ld\.global[^ \t]*", info.ptx)
        scale_loads = [x for x in lds if x.endswith(".b16")]
        hinted = [x for x in scale_loads if "evict" in x or ".cg" in x]
        assert want in lds and scale_loads and not hinted, sorted(set(lds))


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
def test_early_weight_load_knob(monkeypatch, fmt):
    """LOWRANK_GEMM_GEMV_EARLY=0 (probe knob, read per call, PDL only): the first weight chunk is loaded after
    griddepcontrol.wait instead of before it; by default before."""
    import re
    from lowrank_gemm.kernels.aot import compile_sm90
    from lowrank_gemm.kernels.gluon.w4a4_ws import make_operands_v2
    ops = make_operands_v2(fmt, 1, 160, 512, 16, 64, device="cpu")
    assert "LATE_W" not in gv.gemv_args(**ops, swar=True, pdl=True, kernel="gluon")[2]
    monkeypatch.setenv(gv.EARLY_ENV, "0")
    assert gv.gemv_args(**ops, swar=True, pdl=True, kernel="gluon")[2]["LATE_W"] is True
    assert "LATE_W" not in gv.gemv_args(**ops, swar=True, pdl=False, kernel="gluon")[2]
    sig, cx, cfg = gv.aot_signature_gemv(None, kernel="gluon", N=256, K=2048, M=1, fmt=fmt)
    for early in (True, False):
        ptx = compile_sm90("lowrank_gemm.kernels.w4a4_gemv", "w4a4_gemv_gl_kernel", sig, {**cx, "LATE_W": not early},
                           num_warps=cfg.num_warps, aligned=("xq_ptr", "wq_ptr", "ws_ptr", "xs_ptr")).ptx
        weight_load = re.search(r"ld\.global\S*evict_first", ptx).start()
        assert (weight_load < ptx.find("griddepcontrol.wait")) == early


def _check_count_knob(monkeypatch, ops, env, constexpr, bad_values, match):
    """A GEMV probe knob read per call: absent by default, ``env=3`` → constexpr 3, each bad value refused."""
    assert constexpr not in gv.gemv_args(**ops, swar=True, pdl=True, kernel="gluon")[2]
    monkeypatch.setenv(env, "3")
    assert gv.gemv_args(**ops, swar=True, pdl=True, kernel="gluon")[2][constexpr] == 3
    for bad in bad_values:
        monkeypatch.setenv(env, bad)
        with pytest.raises(ValueError, match=match):
            gv.gemv_args(**ops, swar=True, pdl=True, kernel="gluon")
    monkeypatch.delenv(env)


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
def test_l2_prefetch_knob(monkeypatch, fmt):
    """LOWRANK_GEMM_GEMV_L2_PREFETCH=P (probe knob, Gluon kernel): the next P chunks of each weight row are bulk-
    prefetched into L2 before griddepcontrol.wait, one instruction per row; off by default (no prefetch in the PTX);
    a non-count is refused."""
    import re
    from lowrank_gemm.kernels.aot import compile_sm90
    from lowrank_gemm.kernels.gluon.w4a4_ws import make_operands_v2
    _check_count_knob(monkeypatch, make_operands_v2(fmt, 1, 160, 512, 16, 64, device="cpu"), gv.L2_PREFETCH_ENV,
                      "L2_PREFETCH", ("two", ), "chunk count")
    sig, cx, cfg = gv.aot_signature_gemv(None, kernel="gluon", N=256, K=2048, M=1, fmt=fmt)
    for pf in (0, 2):
        ptx = compile_sm90("lowrank_gemm.kernels.w4a4_gemv", "w4a4_gemv_gl_kernel", sig, {**cx, "L2_PREFETCH": pf},
                           num_warps=cfg.num_warps, aligned=("xq_ptr", "wq_ptr", "ws_ptr", "xs_ptr")).ptx
        prefetches = [m.start() for m in re.finditer(r"cp\.async\.bulk\.prefetch\.L2\.global", ptx)]
        per_thread = cfg.block_n * (cfg.block_kw // 4) // (32 * cfg.num_warps)    # [BN, Q] elements (predicated)
        assert len(prefetches) == (per_thread if pf else 0)
        assert all(p < ptx.find("griddepcontrol.wait") for p in prefetches)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,cfg", [("int4_g64", None), ("int4_g64", SPLIT4), ("int4_2l", None)],
                         ids=["g64", "g64-split4", "2l"])
@pytest.mark.parametrize("prefetch", ["1", "7", "64"])
def test_gpu_l2_prefetch_knob_bit_identical(monkeypatch, fmt, cfg, prefetch):
    """The L2 prefetch only warms the cache: outputs bit-identical to the default launch, including a prefetch
    window past the program's last chunk (clamped) and split-K's per-program chunk ranges."""
    ops = w4.make_operands_v2(fmt, 1, 28672, 4096, 32, 64, device="cuda", bias=True, seed=3)
    want = gv.launch_w4a4_gemv(**ops, kernel="gluon", config=cfg).clone()
    monkeypatch.setenv(gv.L2_PREFETCH_ENV, prefetch)
    ops["out"].fill_(float("nan"))
    assert torch.equal(gv.launch_w4a4_gemv(**ops, kernel="gluon", config=cfg), want)


def test_act_quant_early_launch_route(monkeypatch):
    """The layer op hands act_quant the GEMV's launch-order choice (measured per format and config, session 12):
    int4_g64 early on the wide config and at M = 1, K ≤ 4096, N ≥ 24576 (paired with EPI_EARLY, session 14), int4_2l
    early only at M = 1 with K ≤ 8192; other routes keep act_quant's default (None)."""
    from lowrank_gemm.kernels import w4a4_gemm as wg
    cuda = torch.device("cuda")
    for fmt, m, n, k, want in (("int4_g64", 1, 28672, 4096, True), ("int4_g64", 2, 28672, 4096, False),
                               ("int4_g64", 1, 14336, 4096, False), ("int4_g64", 1, 28672, 8192, False),
                               ("int4_g64", 2, 14336, 4096, False),
                               ("int4_g64", 1, 4096, 14336, True), ("int4_2l", 1, 28672, 4096, True),
                               ("int4_2l", 2, 28672, 4096, False), ("int4_2l", 1, 4096, 4096, True),
                               ("int4_2l", 1, 4096, 14336, False)):
        assert gv.act_quant_early_launch(fmt, m, n, k) is want, (fmt, m, n, k)
        assert wg._early_launch("auto", fmt, m, n, k, cuda) is want
    assert wg._early_launch("auto", "int4_g64", 16, 28672, 4096, cuda) is None          # not the GEMV's
    monkeypatch.setenv("LOWRANK_GEMM_GEMV", "0")
    assert wg._early_launch("auto", "int4_g64", 1, 28672, 4096, cuda) is None


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,m,n", [("int4_g64", 1, 14336), ("int4_g64", 1, 4096), ("int4_2l", 1, 28672),
                                     ("int4_2l", 2, 28672)])
def test_gpu_layer_launch_order_same_bits(monkeypatch, fmt, m, n):
    """The layer op passes the GEMV's launch-order choice to act_quant, and either order gives the same bits."""
    from lowrank_gemm.formats.int4_twolevel import pack_weight_2l
    from lowrank_gemm.kernels import w4a4_gemm as wg
    from _w4a4_layer import layer_args
    x, qw, sw, smooth, down, up = layer_args(m, seed=1, n=n)
    p = dict(smooth=smooth, lora_down=down, lora_up=up)
    if fmt == "int4_2l":
        wq, wmul, wsc = pack_weight_2l(torch.randn(n, x.shape[1], device="cuda") * 0.02, 64)
        p.update(qweight=wq, wscales=wsc, wmul=wmul)
    else:
        p.update(qweight=qw, wscales=sw)
    seen = []
    real = wg.act_quant
    monkeypatch.setattr(wg, "act_quant", lambda *a, **kw: seen.append(kw.get("early_launch")) or real(*a, **kw))
    y = wg.w4a4_linear(x, **p, fmt=fmt, impl="auto")
    assert seen == [gv.act_quant_early_launch(fmt, m, n, x.shape[1])]
    for env in ("0", "1"):
        monkeypatch.setenv("LOWRANK_GEMM_ACT_QUANT_EARLY_DEPS", env)
        assert torch.equal(wg.w4a4_linear(x, **p, fmt=fmt, impl="auto"), y)


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
def test_cp_async_ring_knob(monkeypatch, fmt):
    """LOWRANK_GEMM_GEMV_CP_STAGES=s (probe knob, Gluon kernel): the weights go through a cp.async ring of s chunks in
    shared memory (s − 1 in flight) instead of the register double buffer; off by default (no cp.async, no ring in
    the shared memory); 1 and non-counts are refused."""
    from lowrank_gemm.kernels.aot import compile_sm90
    from lowrank_gemm.kernels.gluon.w4a4_ws import make_operands_v2
    _check_count_knob(monkeypatch, make_operands_v2(fmt, 1, 160, 512, 16, 64, device="cpu"), gv.CP_STAGES_ENV,
                      "CP_STAGES", ("1", "x"), "ring depth")
    sig, cx, cfg = gv.aot_signature_gemv(None, kernel="gluon", N=28672, K=4096, M=1, fmt=fmt)
    for stages in (0, 3):
        info = compile_sm90("lowrank_gemm.kernels.w4a4_gemv", "w4a4_gemv_gl_kernel", sig, {**cx, "CP_STAGES": stages},
                            num_warps=cfg.num_warps, aligned=("xq_ptr", "wq_ptr", "ws_ptr", "xs_ptr"))
        ring_bytes = stages * cfg.block_n * cfg.block_kw * 4
        assert ("cp.async.cg.shared.global" in info.ptx) == bool(stages)
        assert (info.shared >= ring_bytes) if stages else info.shared < 1024, info.shared


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,cfg", [("int4_g64", None), ("int4_g64", SPLIT4), ("int4_2l", None)],
                         ids=["g64", "g64-split4", "2l"])
@pytest.mark.parametrize("stages", ["2", "3", "4"])
def test_gpu_cp_async_ring_bit_identical(monkeypatch, fmt, cfg, stages):
    """The cp.async ring changes how the weights arrive, not the arithmetic: outputs bit-identical to the default
    launch (split-K's per-program chunk ranges included)."""
    ops = w4.make_operands_v2(fmt, 1, 28672, 4096, 32, 64, device="cuda", bias=True, seed=5)
    want = gv.launch_w4a4_gemv(**ops, kernel="gluon", config=cfg).clone()
    monkeypatch.setenv(gv.CP_STAGES_ENV, stages)
    ops["out"].fill_(float("nan"))
    assert torch.equal(gv.launch_w4a4_gemv(**ops, kernel="gluon", config=cfg), want)


def test_epilogue_early_knob(monkeypatch):
    """EPI_EARLY (Gluon kernel): the epilogue operands act_quant does not write (col scale, up rows, bias) load before
    the K loop and S right after griddepcontrol.wait. Routed where measured faster — int4_2l at M = 1 (act_quant's
    early trigger) on the many-rows config, int4_g64 with that trigger at M = 1, N ≥ 24576 —, ``LOWRANK_GEMM_GEMV_EPI_EARLY`` = 1 / 0 forces it; the kernel without
    it compiles to the PTX it had before the option existed (checked against that commit when it was added)."""
    from lowrank_gemm.kernels.aot import compile_sm90
    monkeypatch.delenv(gv.EPI_EARLY_ENV, raising=False)
    for fmt, m, n, k, want in (("int4_2l", 1, 28672, 4096, True), ("int4_2l", 1, 14336, 4096, True),
                               ("int4_2l", 2, 28672, 4096, False), ("int4_2l", 1, 4096, 4096, False),
                               ("int4_2l", 1, 28672, 14336, False), ("int4_g64", 1, 28672, 4096, True),
                               ("int4_g64", 1, 14336, 4096, False), ("int4_g64", 2, 28672, 4096, False),
                               ("int4_g64", 1, 4096, 4096, False)):
        assert gv.epilogue_early(fmt, m, n, k) is want, (fmt, m, n, k)
        if fmt == "int4_g64" and want:            # the pair: EPI_EARLY pays for g64 only with the early trigger
            assert gv.act_quant_early_launch(fmt, m, n, k)
    ops = w4.make_operands_v2("int4_g64", 1, 160, 512, 16, 64, device="cpu", bias=True, col_scale=True)
    assert "EPI_EARLY" not in gv.gemv_args(**ops, kernel="gluon", swar=True, pdl=False)[2]
    monkeypatch.setenv(gv.EPI_EARLY_ENV, "1")
    assert gv.gemv_args(**ops, kernel="gluon", swar=True, pdl=False)[2]["EPI_EARLY"] is True
    assert gv.epilogue_early("int4_g64", 2, 4096, 4096)
    monkeypatch.setenv(gv.EPI_EARLY_ENV, "0")
    assert not gv.epilogue_early("int4_2l", 1, 28672, 4096)
    sig, cx, cfg = gv.aot_signature_gemv(None, kernel="gluon", N=28672, K=4096, M=1)
    ptx = {}
    for epi in (False, True):
        info = compile_sm90("lowrank_gemm.kernels.w4a4_gemv", "w4a4_gemv_gl_kernel", sig, {**cx, "EPI_EARLY": epi},
                            num_warps=cfg.num_warps, aligned=("xq_ptr", "wq_ptr", "ws_ptr", "xs_ptr"))
        ptx[epi] = info.ptx
    # early: more global loads are issued before griddepcontrol.wait (the up rows, bias, col scale join the first
    # weight chunk there)
    def loads_before_wait(text):
        return text[:text.index("griddepcontrol.wait")].count("ld.global")
    assert loads_before_wait(ptx[True]) > loads_before_wait(ptx[False])


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,cfg,m", [("int4_g64", None, 1), ("int4_g64", None, 2), ("int4_g64", SPLIT4, 1),
                                       ("int4_g64", gv.WIDE_CONFIG, 1), ("int4_2l", None, 1), ("int4_2l", None, 2)],
                         ids=["g64", "g64-m2", "g64-split4", "g64-wide", "2l", "2l-m2"])
@pytest.mark.parametrize("terms", ["all", "none"])
def test_gpu_epilogue_early_bit_identical(monkeypatch, fmt, cfg, m, terms):
    """EPI_EARLY moves loads, not arithmetic: outputs bit-identical to the default launch, with every epilogue term
    (rank 32, bias, col scale) or none."""
    on = terms == "all"
    ops = w4.make_operands_v2(fmt, m, 28672 if cfg is not gv.WIDE_CONFIG else 4096, 4096, 32 if on else 0, 64,
                              device="cuda", bias=on, col_scale=on, seed=7)
    monkeypatch.setenv(gv.EPI_EARLY_ENV, "0")
    want = gv.launch_w4a4_gemv(**ops, kernel="gluon", config=cfg).clone()
    monkeypatch.setenv(gv.EPI_EARLY_ENV, "1")
    ops["out"].fill_(float("nan"))
    assert torch.equal(gv.launch_w4a4_gemv(**ops, kernel="gluon", config=cfg), want)
