"""W4A8: int4_g64 weights with per-token e4m3 activations (``act_bits=8``, formats/fp8.py, the v2 kernel's A8 route).

CPU: the spec, the quantizer kernel under the interpreter, the reference, the module, the checks, the sm_90 compile
(one FFMA per element per group, no activation rows in the ring, the ledger against the compiled shared memory).
GPU (``-m gpu``): the v2 kernel against float64 on ragged and real shapes, bit-identical reruns, the layer op and
the module against the spec, CUDA-graph capture, bad input.
"""

import pytest
import torch

from lowrank_gemm.formats.fp8 import E4M3_MAX, dequantize_act_e4m3, quantize_act_e4m3
from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
from lowrank_gemm.kernels.w4a4_gemm import check_gemm_args, w4a4_gemm, w4a4_linear
from lowrank_gemm.reference import svdq_linear_ref, w4a4_gemm_ref

gpu = pytest.mark.gpu


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _layer(m, n, k, r=32, g=64, dev="cpu", dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    x = (torch.randn(m, k, device=dev) * torch.exp(torch.randn(k, device=dev) * 0.5)).to(dtype)
    w = torch.randn(n, k, device=dev) * 0.02
    qw, sw = quantize_weight_int4(w, g)
    return x, dict(qweight=pack_int4(qw), wscales=sw, smooth=(torch.rand(k, device=dev) + 0.5).to(dtype),
                   lora_down=(torch.randn(r, k, device=dev) * 0.02).to(dtype),
                   lora_up=(torch.randn(n, r, device=dev) * 0.02).to(dtype), bias=torch.randn(n, device=dev).to(dtype))


# ---- CPU ------------------------------------------------------------------------------------------------------------

def test_spec_rows_and_special_values():
    x = torch.randn(5, 200) * torch.tensor([1.0, 1e-3, 100.0, 0.0, 1.0])[:, None]
    x[4, 7] = float("nan")
    q, t = quantize_act_e4m3(x)
    assert q.dtype == torch.float8_e4m3fn and t.dtype == torch.float32 and t.shape == (5, )
    amax = x[:3].abs().amax(1)
    assert torch.equal(t[:3], amax / torch.full_like(amax, E4M3_MAX))
    assert q[:3].float().abs().amax(1).tolist() == [448.0] * 3       # the row maximum lands on the format's max
    assert t[3] == 1 and (q[3].float() == 0).all()                   # an all-zero row
    assert t[4] == 1 and torch.isnan(q[4].float()).all() == torch.isnan(x[4]).all()
    rel = (dequantize_act_e4m3(q[:3], t[:3]) - x[:3]).norm() / x[:3].norm()
    assert 0 < rel < 0.04                                              # 3 mantissa bits


def test_spec_inf_row_is_nan_downstream():
    x = torch.randn(2, 64)
    x[1, 3] = float("inf")
    q, t = quantize_act_e4m3(x)
    assert torch.isinf(t[1]) and torch.isnan(dequantize_act_e4m3(q, t)[1]).any()


def _codes_equal_off_nan_rows(q, q_ref, x):
    """Codes equal bit for bit on rows without NaN, a NaN code matching any NaN code (a NaN row's t is 1 and its
    codes past 448 are the cast's own: formats/fp8.py; the row's outputs are NaN either way)."""
    rows = ~torch.isnan(x.float()).any(1)
    a, b = q[rows], q_ref[rows]
    same = (a.view(torch.uint8) == b.view(torch.uint8)) | (torch.isnan(a.float()) & torch.isnan(b.float()))
    return bool(same.all())


def test_act_quant_e4m3_interpreter_bits(monkeypatch):
    """The two-pass quantizer (act_quant's 2l stats pass + the e4m3 pass) under the interpreter: ragged M, an
    all-zero row, a NaN row, an Inf row, a row of tiny values; codes and t are the spec's, S ≈ float64."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from lowrank_gemm.kernels.act_e4m3 import act_quant_e4m3
    torch.manual_seed(0)
    m, k, r = 70, 320, 5
    x = (torch.randn(m, k) * torch.exp(torch.randn(k))).to(torch.float16)
    x[3] = 0
    x[4, 7] = float("nan")
    x[5, 9] = float("inf")
    x[6] *= 1e-3
    lam = (torch.rand(k) + 0.5).to(torch.float16)
    lam[11] = 2e-3
    a = (torch.randn(r, k) * 0.02).to(torch.float16)
    q, t, s = act_quant_e4m3(x, lam, a)
    xs = x.float() / lam.float()
    q_ref, t_ref = quantize_act_e4m3(xs)
    assert torch.equal(t, t_ref) and _codes_equal_off_nan_rows(q, q_ref, x)
    assert torch.isinf(t[5]) and t[3] == 1 and t[4] == 1
    fin = torch.isfinite(xs).all(1)
    ref = xs[fin].double() @ a.double().T
    assert ((s[fin].double() - ref).norm() / ref.norm()).item() < 1e-5
    assert torch.isnan(s[4]).all() and not torch.isnan(s[fin]).any()


def test_act_quant_e4m3_exact_redo_interpreter(monkeypatch):
    """Slices off the fast path — λ outside [2⁻³⁰, 2³⁰] (the prep's NaN 1/λ) and row scales above 2⁶⁰ — are redone
    with IEEE divisions: the same codes as the spec."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from lowrank_gemm.kernels.act_e4m3 import act_quant_e4m3
    torch.manual_seed(2)
    m, k = 9, 256
    x = torch.randn(m, k).to(torch.bfloat16)
    x[2] *= 1e25                                    # t ≈ 1e22 > 2⁶⁰
    lam = (torch.rand(k) + 0.5).to(torch.bfloat16)
    lam[100] = 1e-12                                # 1/λ outside the prep's range
    q, t, s = act_quant_e4m3(x, lam, torch.zeros(0, k, dtype=torch.bfloat16))
    q_ref, t_ref = quantize_act_e4m3(x.float() / lam.float())
    assert s is None and torch.equal(t, t_ref) and torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("m,k", [(1, 4096), (5, 1088), (2, 9024)])     # the row in registers; walked twice
def test_act_quant_e4m3_f16_operand_interpreter(m, k, monkeypatch):
    """out="f16": the decode kernel's fp16 token operand holds the spec's e4m3 values at the permuted columns."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from lowrank_gemm.kernels.act_e4m3 import act_quant_e4m3, e4m3_f16_operand_ref
    torch.manual_seed(3)
    x = (torch.randn(m, k) * 4).half()
    lam = (torch.rand(k) + 0.5).half()
    a = (torch.randn(7, k) * 0.02).half()          # a rank that is not a multiple of the chunk
    x16, t, s = act_quant_e4m3(x, lam, a, out="f16")
    xs = x.float() / lam.float()
    q_ref, t_ref = quantize_act_e4m3(xs)
    assert x16.dtype == torch.float16 and torch.equal(x16, e4m3_f16_operand_ref(q_ref)) and torch.equal(t, t_ref)
    s_ref = xs.double() @ a.double().T
    assert s.shape == (m, 7) and ((s.double() - s_ref).norm() / s_ref.norm()).item() < 1e-6
    assert act_quant_e4m3(x, lam, a[:0], out="f16")[2] is None
    # the permutation is the decode kernel's: column 8j + 2q + i of a 16-chunk holds K 4q + 2j + i
    assert torch.equal(x16[:, 2], q_ref[:, 4].half()) and torch.equal(x16[:, 8], q_ref[:, 2].half())
    with pytest.raises(ValueError, match="out must be one of"):
        act_quant_e4m3(x, lam, torch.zeros(0, k).half(), out="f8")


@pytest.mark.parametrize("m,k", [(1, 4096), (5, 1088), (3, 9024)])     # the row in registers; walked twice
def test_act_quant_e4m3_xab_operand_interpreter(m, k, monkeypatch):
    """out="xab": the spec's e4m3 codes at their columns and the decode kernel's e4m3 group rows (2⁹·t, −8·R·t) bit
    for bit — on rows with a NaN, a zero row and rows whose codes span the format's range; the same S as out="e4m3"."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from lowrank_gemm.kernels.act_e4m3 import act_quant_e4m3, e4m3_xab_ref
    torch.manual_seed(4)
    x = (torch.randn(m, k) * torch.exp(torch.randn(k) * 2)).half()
    if m >= 3:
        x[1] = 0
        x[2, 5] = float("nan")
    lam = (torch.rand(k) + 0.5).half()
    a = (torch.randn(7, k) * 0.02).half()
    q, xab, s = act_quant_e4m3(x, lam, a, out="xab")
    xs = x.float() / lam.float()
    q_ref, t_ref = quantize_act_e4m3(xs)
    want = e4m3_xab_ref(q_ref, t_ref)
    assert q.dtype == torch.float8_e4m3fn and xab.shape == (k // 64, 2, m)
    assert _codes_equal_off_nan_rows(q, q_ref, x)
    ok = ~torch.isnan(x.float()).any(1)
    assert torch.equal(xab[:, :, ok], want[:, :, ok])
    if m >= 3:      # a NaN row keeps t = 1 (formats/fp8.py) and its NaN code makes its group's b NaN
        assert torch.isnan(xab[:, 1, 2]).sum() == 1 and torch.isnan(xab[5 // 64, 1, 2])
    assert torch.equal(xab[:, 0, :], (t_ref * 512)[None, :].expand(k // 64, m))
    s_ref = xs.double() @ a.double().T
    assert ((s.double() - s_ref)[ok].norm() / s_ref[ok].norm()).item() < 1e-6
    # the rows against the spec's products: t·Σ_g ws·Σ q·q_w = Σ_g ws·(2⁹t·P' − 8Rt), P' = 2⁻⁹·Σ q·(q_w + 8)
    qw = torch.randint(-8, 8, (k,)).double()
    p8 = (q_ref.double() * (qw + 8)).reshape(m, k // 64, 64).sum(-1) / 512                       # [M, K/64]
    got = (p8 * xab[:, 0, :].t().double() + xab[:, 1, :].t().double()).sum(-1)
    exact = t_ref.double() * (q_ref.double() * qw).sum(-1)
    bound = xab[:, 1, :].t().double().abs().sum(-1) * 2.0 ** -23                 # b's one fp32 rounding per group
    assert ((got - exact).abs()[ok] <= bound[ok]).all()
    with pytest.raises(ValueError, match="group_size=64"):
        act_quant_e4m3(x, lam, a, group_size=128, out="xab")


def test_xab_reference_cpu_path_and_spec():
    """The CPU (no interpreter) path of out="xab" is the spec; the spec's rows are exact group sums of the codes."""
    from lowrank_gemm.kernels.act_e4m3 import act_quant_e4m3, e4m3_xab_ref
    torch.manual_seed(5)
    x = torch.randn(3, 256).bfloat16()
    lam = (torch.rand(256) + 0.5).bfloat16()
    q, xab, s = act_quant_e4m3(x, lam, torch.zeros(0, 256).bfloat16(), out="xab")
    q_ref, t_ref = quantize_act_e4m3(x.float() / lam.float())
    assert s is None and torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    r = q_ref.double().reshape(3, 4, 64).sum(-1).t()                                       # exact group sums
    assert torch.equal(xab, e4m3_xab_ref(q_ref, t_ref)) and torch.equal(xab[:, 1, :], (r.float() * -8) * t_ref)


@pytest.mark.parametrize("one_pass,lowrank,xab", [(True, True, False), (False, True, False), (True, False, False),
                                                  (True, True, True), (False, True, True)])
def test_aot_quantizer_kernels_compile_sm90(one_pass, lowrank, xab):
    """The interpreter runs Python scoping; the compiler does not: both quantizer kernels compile for sm_90 (a
    variable defined only inside a loop failed there, session 41), with IEEE divisions and the e4m3 conversion —
    the rows kernel in both its outputs (fp16 codes; e4m3 codes + xab rows)."""
    from lowrank_gemm.kernels.aot import compile_sm90
    sig = {"x_ptr": "*bf16", "stride_xm": "i32", "smooth_ptr": "*bf16", "q_ptr": "*fp8e4nv" if xab else "*fp16",
           "t_ptr": "*fp32", "a_ptr": "*bf16", "stride_ar": "i32", "s_ptr": "*fp32", "stride_sm": "i32", "M": "i32",
           "K": "i32", "R": "i32"}
    info = compile_sm90("lowrank_gemm.kernels.act_e4m3", "_e4m3_rows_kernel", sig,
                        dict(BLOCK_K=4096 if one_pass else 2048, RC=4, MANT=3, EMIN=-6, EMU_CVT=False,
                             ONE_PASS=one_pass, HAS_LOWRANK=lowrank, XAB=xab), num_warps=8)
    assert "div.rn.f32" in info.ptx and "cvt.rn.satfinite.e4m3x2.f32" in info.ptx
    sig2 = {"x_ptr": "*bf16", "stride_xm": "i32", "smooth_ptr": "*bf16", "rl_ptr": "*fp32", "q_ptr": "*fp8e4nv",
            "stride_qm": "i32", "t_ptr": "*fp32", "ap_ptr": "*fp32", "stride_aps": "i32", "M": "i32", "K": "i32",
            "SPLIT": "i32", "STEPS_PER_SLICE": "i32"}
    info2 = compile_sm90("lowrank_gemm.kernels.act_e4m3", "_act_e4m3_quant_kernel", sig2,
                         dict(G=64, BLOCK_M=64, SPLIT_P2=4, MANT=3, EMIN=-6, EMU_FMA=False, EMU_CVT=False), num_warps=4)
    assert "cvt.rn.satfinite.e4m3x2.f32" in info2.ptx


def test_reference_layer_matches_module_reference_path():
    from lowrank_gemm.nn.svdq import SVDQLinear
    from lowrank_gemm.quant.config import SVDQuantConfig
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 96)
    calib = torch.randn(64, 256)
    mod = SVDQLinear.from_linear(lin, SVDQuantConfig(rank=16, act_bits=8), calib)
    assert mod.act_bits == 8
    x = torch.randn(7, 256)
    ref = svdq_linear_ref(x, mod.qweight, mod.wscales, mod.smooth, mod.lora_down, mod.lora_up, mod.bias,
                          act_bits=8)
    assert _rel(mod(x), ref) < 1e-5
    # W4A8 is closer to the float layer than W4A4 on the same weights
    mod4 = SVDQLinear.from_linear(lin, SVDQuantConfig(rank=16), calib)
    exact = lin(x).double()
    assert _rel(mod(x), exact) < _rel(mod4(x), exact)


def test_act_bits_values():
    from lowrank_gemm.nn.svdq import SVDQLinear
    from lowrank_gemm.quant.config import SVDQuantConfig
    with pytest.raises(ValueError, match="act_bits must be 4, 8 or 16"):
        SVDQuantConfig(act_bits=6)
    with pytest.raises(ValueError, match="act_bits must be 4, 8 or 16"):
        SVDQLinear(64, 8, 4, 64, act_bits=2)
    with pytest.raises(ValueError, match="act_shift"):
        svdq_linear_ref(torch.randn(2, 64), *_ref_args(), act_shift=torch.zeros(64), act_bits=8)


def _ref_args():
    x, p = _layer(2, 8, 64, r=4)
    return p["qweight"], p["wscales"], p["smooth"], p["lora_down"], p["lora_up"]


def test_gemm_contract_accepts_token_scales_and_names_both_forms():
    k, n, m = 128, 16, 5
    qw = pack_int4(torch.randint(-8, 8, (n, k), dtype=torch.int8))
    ws = torch.rand(k // 64, n).bfloat16()
    x8 = torch.randn(m, k).to(torch.float8_e4m3fn)
    assert check_gemm_args(x8, torch.rand(m), qw, ws, None, None, None, None, 64, "int4_g64") == (m, n, k, 0)
    with pytest.raises(ValueError, match=r"per-token scale float32 \[M\] = \[5\]"):
        check_gemm_args(x8, torch.rand(m + 1), qw, ws, None, None, None, None, 64, "int4_g64")


def test_decode_xab_route_choice(monkeypatch):
    """Which quantizer output the W4A8 layer asks for: "xab" (the decode kernel's e4m3 path) with the switch on (the
    default), group 64, M ≤ the e4m3 tiles and a decode-routable N; otherwise the fp16 path to M = 64, then v2's A8
    route."""
    from lowrank_gemm.kernels.w4a4_gemm import A8_DECODE_XAB_DEFAULT, _a8_act_out, a8_decode_xab_enabled
    dev = torch.device("cuda")          # a device object only: nothing is launched
    monkeypatch.delenv("LOWRANK_GEMM_A8_DECODE_XAB", raising=False)
    assert A8_DECODE_XAB_DEFAULT and a8_decode_xab_enabled() and _a8_act_out("auto", 1, 28672, 64, dev) == "xab"
    monkeypatch.setenv("LOWRANK_GEMM_A8_DECODE_XAB", "1")
    assert [_a8_act_out("auto", m, 28672, 64, dev) for m in (1, 16, 17, 64, 65)] == ["xab"] * 2 + ["f16"] * 2 + ["e4m3"]
    assert _a8_act_out("auto", 1, 1000, 64, dev) == "e4m3"          # N % 16: no decode kernel
    assert _a8_act_out("auto", 1, 28672, 128, dev) == "f16"         # group sums exact only for 64
    assert _a8_act_out("v2", 1, 28672, 64, dev) == "e4m3" and _a8_act_out("decode", 4, 4096, 64, dev) == "xab"
    assert _a8_act_out("auto", 4, 4096, 64, torch.device("cpu")) == "e4m3"
    monkeypatch.setenv("LOWRANK_GEMM_A8_DECODE_XAB", "0")
    assert _a8_act_out("auto", 1, 28672, 64, dev) == "f16"


def test_layer_and_gemm_refuse_other_paths_clearly():
    x, p = _layer(4, 16, 128, r=4)
    with pytest.raises(ValueError, match="act_bits=8 .* on the v2 kernel"):
        w4a4_linear(x, act_bits=8, **p)                       # CPU tensors: no kernel to run
    with pytest.raises(ValueError, match="act_bits must be 4 or 8"):
        w4a4_linear(x, act_bits=16, **p)
    x8 = torch.randn(4, 128).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"per-token e4m3 activations \(W4A8\) run only on the v2 kernel"):
        w4a4_gemm(x8, torch.rand(4), p["qweight"], p["wscales"], impl="v1")


def test_gemm_reference_form():
    m, n, k = 3, 8, 128
    qw = torch.randint(-8, 8, (n, k), dtype=torch.int8)
    ws = torch.rand(k // 64, n).bfloat16()
    x8 = torch.randn(m, k).to(torch.float8_e4m3fn)
    t = torch.rand(m)
    want = (x8.double() * t.double()[:, None]) @ (qw.double() * ws.double().repeat_interleave(64, 0).T).T
    assert torch.allclose(w4a4_gemm_ref(x8, t, pack_int4(qw), ws), want, rtol=1e-12, atol=0)


def _aot(**kw):
    from lowrank_gemm.kernels.aot import compile_sm90
    from lowrank_gemm.kernels.gluon import skeleton as sk
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    sig, cx, cfg = w4.aot_signature_v2("int4_g64", **kw)
    return compile_sm90(w4.__name__, "w4a4_ws_kernel", sig, cx, num_warps=sk.DEFAULT_WARPS), cx, cfg


@pytest.mark.parametrize("kw", [dict(M=200, N=128, K=448), dict(M=77, N=256, K=512, rank=0, bias=False,
                                                                 col_scale=False)])
def test_aot_a8_kernel_ledger_and_one_ffma(kw):
    """sm_90: e4m3 wgmma, no activation rows in MAIN (the ledger without them equals the compiled size up to the
    warp-specialize capture area), and per group one FMA per accumulator element where the int4 route has two."""
    pytest.importorskip("triton.experimental.gluon")
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    info, cx, cfg = _aot(a8=True, trans=False, **kw)
    assert cx["A8"] and not cx["TRANS"] and cx["EXPANDERS"] == 0 and cx["INFLIGHT"] and cx["COOP"]
    assert info.has("wgmma.mma_async.sync.aligned", ".f32.e4m3.e4m3", "cp.async.bulk.tensor", "mbarrier.try_wait")
    led = w4.w4a4_ledger(cfg, fmt="int4_g64", has_lowrank=cx["HAS_LOWRANK"], n_out=kw["N"], scale_tma=True, f8=True,
                         raw_stages=cx["RAW_STAGES_N"], expanders=0, coop=True, ws_bits=32, a8=True)
    assert "MAIN.x_ab_rows" not in {t.name for t in led.terms}
    assert led.total() <= info.shared <= led.total() + 512, (led.table(), info.shared)
    base, cx4, _ = _aot(expanders=0, **dict(kw, M=-(-kw["M"] // 8) * 8))   # the int4 rows need M % 8 == 0; A8 none
    assert not cx4["A8"] and cx4["INFLIGHT"] == cx["INFLIGHT"]
    assert 2 * info.ptx.count("fma.rn.f32") == base.ptx.count("fma.rn.f32")


@pytest.mark.parametrize("kw", [dict(M=200, N=256, K=448), dict(M=77, N=128, K=512, rank=0, bias=False),
                                dict(M=200, N=256, K=704, inflight=4), dict(M=77, N=128, K=1024, inflight=6)])
def test_aot_a8_trans_kernel(kw):
    """trans (the kernel computes Yᵀ): no scale row in the ring (ledger = compiled size up to the capture area), no
    proxy fence and no shared-memory load in the K loops (the weight scales come from global memory), one FMA per
    element per group, the transposed TMA store, and no spill nor serialized wgmma (sm_90 ptxas) — at the default
    pairs and with bodies of four or six groups, where the folds must stay ahead of the refills (``_settled``:
    without it four groups spilled 2.7 KB per thread and serialized every wgmma, C7512)."""
    pytest.importorskip("triton.experimental.gluon")
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from _sm90 import ptxas_stats
    from test_gluon_skeleton import _ptx_loops
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    info, cx, cfg = _aot(a8=True, trans=True, col_scale=False, **kw)
    assert cx["TRANS"] and cx["HAS_COL_SCALE"] and cx["INFLIGHT"] == kw.get("inflight", 2) and cx["EPI_TMA"]
    led = w4.w4a4_ledger(cfg, fmt="int4_g64", has_lowrank=cx["HAS_LOWRANK"], n_out=kw["N"], scale_tma=True, f8=True,
                         raw_stages=cx["RAW_STAGES_N"], expanders=0, coop=True, ws_bits=16, a8=True, trans=True)
    names = {t.name for t in led.terms}
    assert "MAIN.x_ab_rows" not in names and "MAIN.w_scale_row" not in names
    assert led.total() <= info.shared <= led.total() + 512, (led.table(), info.shared)
    kloops = [body for _, body in _ptx_loops(info.ptx)
              if any("wgmma.mma_async" in x and "e4m3" in x for x in body)
              and not any("wgmma.mma_async" in x and "bf16" in x for x in body)
              and not any("cp.async.bulk.tensor.2d.global.shared" in x for x in body)]    # not the tile loops
    assert kloops
    for body in kloops:
        assert not any("fence.proxy.async" in x or x.strip().startswith("ld.shared") for x in body)
        n_mma = sum("wgmma.mma_async" in x for x in body)
        assert sum(x.strip().startswith("fma.rn.f32") for x in body) == n_mma // 2 * cfg.block_m * cfg.block_n // 128
    assert "cp.async.bulk.tensor.2d.global.shared" in info.ptx
    stats = ptxas_stats(info.ptx)
    if stats is not None:
        assert stats[1] == 0 and "serialized" not in stats[2], stats


def test_a8_trans_default_by_k(monkeypatch):
    pytest.importorskip("triton.experimental.gluon")
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    monkeypatch.delenv("LOWRANK_GEMM_V2_A8_TRANS", raising=False)
    assert w4.aot_signature_v2("int4_g64", M=200, N=128, K=4096, a8=True, col_scale=False)[1]["TRANS"]
    assert w4.aot_signature_v2("int4_g64", M=200, N=128, K=12288, a8=True, col_scale=False)[1]["TRANS"]
    assert not w4.aot_signature_v2("int4_g64", M=200, N=128, K=12352, a8=True, col_scale=False)[1]["TRANS"]
    assert not w4.aot_signature_v2("int4_g64", M=200, N=128, K=448, a8=True, col_scale=True)[1]["TRANS"]
    monkeypatch.setenv("LOWRANK_GEMM_V2_A8_TRANS", "1")
    assert w4.aot_signature_v2("int4_g64", M=200, N=128, K=12352, a8=True, col_scale=False)[1]["TRANS"]


def test_a8_depth_default_and_env(monkeypatch):
    """Groups per in-flight body on the A8 route: pairs with trans up to K = A8_TRANS_DEEP_K and four above, four
    without; the env knob picks another depth for both (1 = the int4 routes' four), and 0 — those routes' "off" —
    leaves the A8 route, always in flight, at its default."""
    pytest.importorskip("triton.experimental.gluon")
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    sig = dict(M=200, N=128, K=448, a8=True, col_scale=False)
    for env, trans_depth, plain_depth in (("", w4.A8_TRANS_DEPTH, w4.INFLIGHT_DEPTH), ("0", 2, 4), ("1", 4, 4),
                                          ("6", 6, 6)):
        monkeypatch.setenv("LOWRANK_GEMM_V2_INFLIGHT", env)
        assert w4.aot_signature_v2("int4_g64", trans=True, **sig)[1]["INFLIGHT"] == trans_depth
        assert w4.aot_signature_v2("int4_g64", trans=False, **sig)[1]["INFLIGHT"] == plain_depth
    assert w4.aot_signature_v2("int4_g64", trans=True, inflight=4, **sig)[1]["INFLIGHT"] == 4
    monkeypatch.delenv("LOWRANK_GEMM_V2_INFLIGHT")
    deep = dict(sig, K=w4.A8_TRANS_DEEP_K + 64)
    assert w4.aot_signature_v2("int4_g64", trans=True, **deep)[1]["INFLIGHT"] == w4.A8_TRANS_DEEP_DEPTH == 4
    edge = dict(sig, K=w4.A8_TRANS_DEEP_K)
    assert w4.aot_signature_v2("int4_g64", trans=True, **edge)[1]["INFLIGHT"] == w4.A8_TRANS_DEPTH == 2


def test_a8_launcher_refuses_other_routes():
    pytest.importorskip("triton.experimental.gluon")
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    with pytest.raises(ValueError, match="no-expander in-flight e4m3 route"):
        w4.aot_signature_v2("int4_g64", M=200, N=128, K=448, a8=True, expanders=2)
    with pytest.raises(ValueError, match="no-expander in-flight e4m3 route"):
        w4.aot_signature_v2("int4_g64", M=200, N=128, K=448, a8=True, inflight=False)
    with pytest.raises(ValueError, match="TMA'd w_scale rows"):
        w4.aot_signature_v2("int4_g64", M=200, N=124, K=448, a8=True, col_scale=False)
    with pytest.raises(ValueError, match="trans .* without col_scale"):
        w4.aot_signature_v2("int4_g64", M=200, N=128, K=448, a8=True, trans=True, col_scale=True)
    with pytest.raises(ValueError, match="trans .* per-token e4m3"):
        w4.aot_signature_v2("int4_g64", M=200, N=128, K=448, f8=True, expanders=0, trans=True, col_scale=False)


# ---- GPU ------------------------------------------------------------------------------------------------------------

@gpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("m,n,k,r", [(4608, 12288, 3072, 32), (4608, 3072, 12288, 32), (333, 1000, 1024, 32),
                                     (1, 4096, 4096, 32), (77, 256, 448, 0), (130, 384, 640, 5)])
@pytest.mark.parametrize("trans", ["0", "1", "1x4"])
def test_gpu_gemm_vs_float64_and_repeat(m, n, k, r, trans, monkeypatch):
    """v2 A8 on the quantizer's outputs (both orientations: LOWRANK_GEMM_V2_A8_TRANS; "1x4": trans with four groups
    per in-flight body, bit-identical to the default pairs since groups fold in order), fp32 out: rel err ≤ 1e-3 vs
    float64, NaN-poisoned output fully written (ragged M, N, K not a multiple of the in-flight depth), bit-identical
    reruns."""
    trans, depth = (trans.split("x") + [""])[:2]
    monkeypatch.setenv("LOWRANK_GEMM_V2_A8_TRANS", trans)
    monkeypatch.setenv("LOWRANK_GEMM_V2_INFLIGHT", depth)
    from lowrank_gemm.kernels.act_e4m3 import act_quant_e4m3
    x, p = _layer(m, n, k, r=r, dev="cuda")
    x8, t, s = act_quant_e4m3(x, p["smooth"], p["lora_down"])
    q_ref, t_ref = quantize_act_e4m3(x.float() / p["smooth"].float())
    assert torch.equal(x8.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(t, t_ref)
    up = p["lora_up"] if r else None
    y = w4a4_gemm(x8, t, p["qweight"], p["wscales"], s, up, p["bias"], out_dtype=torch.float32)
    ref = w4a4_gemm_ref(x8, t, p["qweight"], p["wscales"], s, up, p["bias"])
    if trans == "1":
        assert _rel(w4a4_gemm(x8, t, p["qweight"], p["wscales"], s, up, p["bias"]), ref) <= 5e-3   # bf16 out
    assert torch.isfinite(y).all() and _rel(y, ref) <= 1e-3
    for _ in range(2):
        assert torch.equal(y, w4a4_gemm(x8, t, p["qweight"], p["wscales"], s, up, p["bias"], out_dtype=torch.float32))
    # the op's output is torch.empty: the launcher it calls (the A8 route runs v2 only) writes into a NaN-poisoned one
    from lowrank_gemm.kernels.gluon.w4a4_ws import launch_w4a4_v2
    poisoned = torch.full((m, n), float("nan"), device="cuda")
    launch_w4a4_v2(x8, t, p["qweight"], p["wscales"], None, s, up, p["bias"], poisoned, "int4_g64", 64, f8=True)
    assert torch.equal(poisoned, y)
    if depth:
        monkeypatch.setenv("LOWRANK_GEMM_V2_INFLIGHT", "")
        assert torch.equal(y, w4a4_gemm(x8, t, p["qweight"], p["wscales"], s, up, p["bias"], out_dtype=torch.float32))


@gpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("m,n,k", [(4608, 3072, 3072), (64, 28672, 4096), (16, 28672, 4096), (1, 4096, 4096),
                                   (5, 1000, 1024), (130, 384, 640)])
def test_gpu_layer_and_module_vs_spec(m, n, k):
    """Both W4A8 routes (M ≤ 64 with N % 16 == 0: the decode kernel's fp16 path; else v2 A8) against the spec, and
    against each other (impl="v2" pins the A8 route)."""
    from lowrank_gemm.nn.svdq import SVDQLinear
    x, p = _layer(m, n, k, dev="cuda")
    ref = svdq_linear_ref(x, **p, act_bits=8)
    y = w4a4_linear(x, out_dtype=torch.float32, act_bits=8, **p)
    assert _rel(y, ref) <= 3e-3
    yb = w4a4_linear(x, act_bits=8, **p)
    assert yb.dtype == torch.bfloat16 and _rel(yb, ref) <= 5e-3
    mod = SVDQLinear(k, n, 32, 64, act_bits=8).cuda()
    for name in ("qweight", "wscales", "smooth", "lora_down", "lora_up"):
        setattr(mod, name, p[name])
    mod.bias = p["bias"]
    assert torch.equal(mod(x), yb)
    assert _rel(mod.forward_reference(x), ref) < 1e-2
    assert _rel(w4a4_linear(x, out_dtype=torch.float32, act_bits=8, impl="v2", **p), ref) <= 3e-3


@gpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("m,n", [(512, 3072), (16, 28672)])     # the v2 A8 route; the decode kernel's fp16 path
def test_gpu_graph_capture_and_nan_rows(m, n):
    from lowrank_gemm.bench.common import capture_graph
    x, p = _layer(m, n, 3072, dev="cuda")
    eager = w4a4_linear(x, act_bits=8, **p)
    _, g, out = capture_graph(lambda: w4a4_linear(x, act_bits=8, **p))
    x.copy_(x * 2)
    g.replay()
    assert torch.equal(out, w4a4_linear(x, act_bits=8, **p)) and not torch.equal(out, eager)
    x[3, 5] = float("nan")
    y = w4a4_linear(x, act_bits=8, **p)
    assert torch.isnan(y[3]).all() and torch.isfinite(y[torch.arange(m, device=y.device) != 3]).all()


@gpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("m,n,k", [(1, 28672, 4096), (16, 28672, 4096), (5, 1008, 1024), (3, 4096, 12288)])
def test_gpu_decode_xab_route(m, n, k, monkeypatch):
    """W4A8 on the decode kernel's e4m3 path (act_quant_e4m3(out="xab"); K = 12288 walks the row twice): the
    quantizer's codes and rows bit for bit against the spec, the GEMM ≤ 1e-3 from float64 on the same operands
    (fp32 out; the e4m3 wgmma multiplies arbitrary e4m3 codes here, not int4 values), bit-identical reruns, the
    layer against the spec and the fp16 path, CUDA-graph replay, a NaN row that stays in its row."""
    from lowrank_gemm.bench.common import capture_graph
    from lowrank_gemm.kernels.act_e4m3 import act_quant_e4m3, e4m3_xab_ref
    x, p = _layer(m, n, k, dev="cuda")
    x8, xab, s = act_quant_e4m3(x, p["smooth"], p["lora_down"], out="xab")
    q_ref, t_ref = quantize_act_e4m3(x.float() / p["smooth"].float())
    assert torch.equal(x8.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(xab, e4m3_xab_ref(q_ref, t_ref))
    y = w4a4_gemm(x8, xab, p["qweight"], p["wscales"], s, p["lora_up"], p["bias"], out_dtype=torch.float32,
                  impl="decode")
    ref_g = w4a4_gemm_ref(x8, t_ref, p["qweight"], p["wscales"], s, p["lora_up"], p["bias"])
    assert torch.isfinite(y).all() and _rel(y, ref_g) <= 1e-3
    assert torch.equal(y, w4a4_gemm(x8, xab, p["qweight"], p["wscales"], s, p["lora_up"], p["bias"],
                                    out_dtype=torch.float32, impl="decode"))
    ref = svdq_linear_ref(x, **p, act_bits=8)
    monkeypatch.setenv("LOWRANK_GEMM_A8_DECODE_XAB", "0")
    y16 = w4a4_linear(x, out_dtype=torch.float32, act_bits=8, **p)
    monkeypatch.setenv("LOWRANK_GEMM_A8_DECODE_XAB", "1")
    y8 = w4a4_linear(x, out_dtype=torch.float32, act_bits=8, **p)
    assert _rel(y8, ref) <= 3e-3 and _rel(y8, y16) <= 2e-3 and torch.equal(y8, y)
    eager = w4a4_linear(x, act_bits=8, **p)
    _, g, out = capture_graph(lambda: w4a4_linear(x, act_bits=8, **p))
    x.copy_(x * 2)
    g.replay()
    assert torch.equal(out, w4a4_linear(x, act_bits=8, **p)) and not torch.equal(out, eager)
    x[m - 1, 5] = float("nan")
    yn = w4a4_linear(x, act_bits=8, **p)
    assert torch.isnan(yn[m - 1]).all() and torch.isfinite(yn[:m - 1]).all()
