"""The W4A4 decode kernel (kernels/gluon/w4a4_decode.py): sm_90 compile checks and bad-input errors on the CPU;
correctness vs the float64 reference, repeat bit-identity and CUDA-graph replay on the GPU."""

import re

import pytest
import torch

from lowrank_gemm.kernels.gluon import w4a4_decode as d
from lowrank_gemm.kernels.gluon import w4a4_ws as w4
from lowrank_gemm.plan.smem import SmemError

MOD = "lowrank_gemm.kernels.gluon.w4a4_decode"


@pytest.mark.parametrize("fmt,cfg", [("int4_2l", None), ("int4_2l", dict(block_n=128, block_k=128, num_stages=6)),
                                     ("int4_g64", None), ("int4_g64", dict(block_n=64, block_k=128, num_stages=3))])
def test_sm90_ptx_register_a_wgmma_tma_and_ledger(fmt, cfg):
    """The int8 MMA path (int4_g64's f8 path has its own checks below)."""
    from lowrank_gemm.kernels.aot import compile_sm90
    config = d.default_decode_config(5, 64, fmt).replace(**cfg) if cfg else None
    sig, cx, c = d.aot_signature_decode(config, fmt=fmt, f8=False)
    info = compile_sm90(MOD, "w4a4_decode_kernel", sig, cx, num_warps=d.WARPS)
    # register A operand: the second wgmma operand is a register list, not a shared-memory descriptor
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n16k32\.s32\.s8\.s8 \{[^}]+\}, \{[^}]+\}", info.ptx)
    assert "cp.async.bulk.tensor.2d" in info.ptx and "cp.async.bulk.tensor.1d" in info.ptx
    assert "ld.local" not in info.ptx
    assert d.decode_ledger(c, 64, fmt).total() == info.shared


def _ptxas(ptx: str):
    """(registers, spill-store bytes, ptxas stderr) of ``ptx`` for sm_90a, or None without triton's ptxas."""
    import os
    import subprocess
    import tempfile
    import triton
    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(exe):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "k.ptx"), "w") as f:
            f.write(ptx)
        log = subprocess.run([exe, "-arch=sm_90a", "-v", os.path.join(tmp, "k.ptx"), "-o", os.path.join(tmp, "k.o")],
                             capture_output=True, text=True).stderr
    regs = [int(v) for v in re.findall(r"Used (\d+) registers", log)]
    spills = [int(v) for v in re.findall(r"(\d+) bytes spill stores", log)]
    return max(regs), max(spills or [0]), log


# (M, config overrides, group size): M ≤ 16 → 16-token tiles (the default 128×256×4 and other rings),
# M > 16 → 64-token tiles (64 weight rows: two fp32 partials beside acc), G = 128 (two 64-blocks chain per
# partial)
F8_CASES = [(5, None, 64), (5, dict(block_k=128, num_stages=6), 64),
            (5, dict(block_n=64, block_k=512, num_stages=3), 64), (40, None, 64), (16, None, 128)]


@pytest.mark.parametrize("M,cfg,gs", F8_CASES, ids=lambda v: str(v))
def test_sm90_f8_e4m3_register_a_wgmma_no_i2f_no_spills(M, cfg, gs):
    from lowrank_gemm.kernels.aot import compile_sm90
    config = d.default_decode_config(M, gs, "int4_g64", f8=True).replace(**cfg) if cfg else None
    sig, cx, c = d.aot_signature_decode(config, fmt="int4_g64", f8=True, M=M, K=1024, group_size=gs)
    assert cx["F8"] and sig["xscale_ptr"] == "*fp32"      # the a, b rows replace the 16-bit x scales
    info = compile_sm90(MOD, "w4a4_decode_kernel", sig, cx, num_warps=d.WARPS)
    bt = c.block_m
    # e4m3 wgmma with a REGISTER A operand ({..} list, not a descriptor) and the token tile as B
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{bt}k32\.f32\.e4m3\.e4m3 \{{[^}}]+\}}, \{{[^}}]+\}}",
                     info.ptx)
    assert ".s32.s8.s8" not in info.ptx and "cvt.rn.f32.s32" not in info.ptx     # no int8 MMA, no I2F
    assert "lop3.b32" in info.ptx and "0x08080808" in info.ptx                    # the offset-nibble LOP3
    assert "cp.async.bulk.tensor.2d" in info.ptx and "cp.async.bulk.tensor.1d" in info.ptx
    assert "st.shared" not in info.ptx               # no per-step token expansion into SMEM (int8 path: 8)
    assert "ld.local" not in info.ptx
    assert d.decode_ledger(c, gs, "int4_g64", f8=True).total() == info.shared
    rs = _ptxas(info.ptx)
    if rs is not None:
        regs, spills, log = rs
        assert spills == 0, f"ptxas spills {spills} B ({regs} registers)"
        # an accumulator read while its wgmma may be in flight makes ptxas serialize every wgmma
        assert "C7514" not in log and "serialized" not in log, log


def test_f8_ledger_itemizes_its_ring():
    c = d.default_decode_config(1, 64, "int4_g64", f8=True)
    names = {t.name for t in d.decode_ledger(c, 64, "int4_g64", f8=True).terms}
    assert "ring.x_e4m3" in names and "x_int8" not in names and "ring.x_packed" not in names
    names8 = {t.name for t in d.decode_ledger(c, 64, "int4_g64").terms}
    assert {"ring.x_packed", "x_int8"} <= names8
    # f8 means nothing for int4_2l (its tokens are int8 already)
    assert d.decode_ledger(c, 64, "int4_2l", f8=True).total() == d.decode_ledger(c, 64, "int4_2l").total()
    for m in (1, 16, 33, 64):
        c = d.default_decode_config(m, 64, "int4_g64", f8=True)
        assert d.CTAS_PER_SM * d.decode_ledger(c, 64, "int4_g64", f8=True).total() <= 228 * 1024


def test_f8_switch(monkeypatch):
    monkeypatch.delenv("LOWRANK_GEMM_DECODE_F8", raising=False)
    assert d.F8_DEFAULT is True and d.decode_f8_default()      # measured faster on the H200 (session 4)
    monkeypatch.setattr(d, "F8_DEFAULT", False)
    assert not d.decode_f8_default()
    monkeypatch.setattr(d, "F8_DEFAULT", True)
    monkeypatch.setenv("LOWRANK_GEMM_DECODE_F8", "0")
    assert not d.decode_f8_default()
    monkeypatch.setattr(d, "F8_DEFAULT", False)
    monkeypatch.setenv("LOWRANK_GEMM_DECODE_F8", "1")
    assert d.decode_f8_default()
    ops = w4.make_operands_v2("int4_g64", 3, 160, 512, 16, 64, device="cpu")
    assert d._args(**ops, config=None)[2]["F8"]                         # None → the env default
    assert not d._args(**ops, config=None, f8=False)[2]["F8"]
    assert not d._args(**_ops(), config=None)[2]["F8"]                  # int4_2l never takes it by default
    with pytest.raises(ValueError, match="f8=True"):
        d._args(**_ops(), config=None, f8=True)


def test_f8_algebra_matches_reference_cpu():
    """The kernel's arithmetic, emulated in float64 with the host's operands: offset nibbles as e4m3 bit patterns
    (0x00–0x0F = n'·2⁻⁹), per-group partial P' = Σ q_x·e4m3(n'), rows a, b read from xab as [2·K/G, M] rows
    2g, 2g + 1 (the kernel's indexing), acc = Σ_g fma(P', a, b)·ws."""
    import torch
    from lowrank_gemm.formats.int4 import unpack_int4
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    from lowrank_gemm.reference import w4a4_gemm_ref
    n = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(n.view(torch.float8_e4m3fn).double(), n.double() / 512)
    M, N, K, G = 5, 48, 384, 64
    ops = w4.make_operands_v2("int4_g64", M, N, K, 0, G, device="cpu", bias=False)
    x8, xab = expand_act_f8(ops["x_q"], ops["x_scale"], G)
    qw = unpack_int4(ops["w_q"]).to(torch.int16)
    wf8 = (qw + 8).to(torch.uint8).view(torch.float8_e4m3fn).double()         # what the LOP3 bytes mean
    rows = xab.reshape(2 * K // G, M).double()
    acc = torch.zeros(N, M, dtype=torch.float64)
    for g in range(K // G):
        ks = slice(g * G, (g + 1) * G)
        part = wf8[:, ks] @ x8.double()[:, ks].t()                             # [N, M]
        acc += (part * rows[2 * g] + rows[2 * g + 1]) * ops["w_scale"][g].double()[:, None]
    ref = w4a4_gemm_ref(ops["x_q"], ops["x_scale"], ops["w_q"], ops["w_scale"], group_size=G, fmt="int4_g64")
    assert torch.allclose(acc.t(), ref, rtol=1e-6, atol=1e-6)


def test_defaults_fit_several_ctas_per_sm():
    for m in (1, 16, 33, 64):
        c = d.default_decode_config(m)
        assert c.block_m >= min(m, 64) and c.block_m in (16, 32, 64)
        assert d.CTAS_PER_SM * d.decode_ledger(c).total() <= 228 * 1024


def _ops(M=3, N=160, K=512, rank=16):
    return w4.make_operands_v2("int4_2l", M, N, K, rank, 64, device="cpu")


@pytest.mark.parametrize("kw,match", [
    (dict(block_n=256), "block_n"),
    (dict(block_k=32), "multiple of 64"),
    (dict(num_stages=1), "num_stages"),
    (dict(num_warps=8, block_n=64), "num_warps"),
    (dict(num_warps=2), "num_warps"),
    (dict(num_stages=40), None),
])
def test_bad_configs_are_rejected_before_launch(kw, match):
    cfg = d.default_decode_config(3).replace(**kw)
    with pytest.raises((ValueError, SmemError), match=match):
        d.check_decode_config(cfg, 3, 160, 512, 64)


def test_bad_inputs():
    ops = _ops()
    with pytest.raises(ValueError, match="fmt must be one of"):
        d._args(**{**ops, "fmt": "int4_g32"}, config=None)
    with pytest.raises(ValueError, match="activations must be uint8"):   # 2l operands under the g64 contract
        d._args(**{**ops, "fmt": "int4_g64"}, config=None)
    with pytest.raises(ValueError, match="N must be a multiple of 16"):
        o = w4.make_operands_v2("int4_2l", 3, 152, 512, 16, 64, device="cpu")
        d._args(**o, config=None)
    with pytest.raises(ValueError, match="out must be"):
        d._args(**{**ops, "out": ops["out"][:, :8]}, config=None)


def test_auto_routing(monkeypatch):
    from lowrank_gemm.kernels import w4a4_gemm as g
    assert "decode" in g.IMPLS and g.AUTO_DECODE
    ops = _ops()
    assert g._use_decode("decode", ops["x_q"], 160, "int4_2l")
    assert not g._use_decode("auto", ops["x_q"], 160, "int4_2l")    # CPU tensors never take a GPU kernel
    assert not g._use_decode("v2", ops["x_q"], 160, "int4_2l")


# ---------------------------------------------------------------------------------------------- GPU
CASES = [dict(M=1, N=160, K=512, rank=16, bias=True, col_scale=True, cfg=None, fmt="int4_g64"),
         dict(M=7, N=4112, K=4096, rank=32, bias=True, col_scale=False, cfg=None, fmt="int4_g64"),
         dict(M=64, N=28672, K=4096, rank=32, bias=False, col_scale=True, cfg=None, fmt="int4_g64"),
         dict(M=1, N=160, K=512, rank=16, bias=True, col_scale=True, cfg=None),
         dict(M=5, N=336, K=1024, rank=32, bias=False, col_scale=False, cfg=dict(block_n=128, block_k=128, num_stages=6)),
         dict(M=16, N=272, K=192, rank=0, bias=True, col_scale=False, cfg=dict(block_k=64, num_stages=8)),
         dict(M=33, N=4112, K=4096, rank=32, bias=True, col_scale=True, cfg=None),
         dict(M=64, N=28672, K=4096, rank=32, bias=True, col_scale=False, cfg=dict(block_k=512, num_stages=3))]


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.get('fmt', 'int4_2l')}-M{c['M']}N{c['N']}K{c['K']}r{c['rank']}")
def test_decode_matches_reference_gpu(case):
    c = dict(case)
    cfg = c.pop("cfg")
    fmt = c.pop("fmt", "int4_2l")
    ops = w4.make_operands_v2(fmt, c["M"], c["N"], c["K"], c["rank"], 64, device="cuda", bias=c["bias"],
                              col_scale=c["col_scale"])
    config = d.default_decode_config(c["M"], 64, fmt).replace(**cfg) if cfg else None
    out = d.launch_w4a4_decode(**ops, config=config).clone()
    ref = w4.reference_v2(ops)
    assert torch.isfinite(out).all(), "unwritten (NaN-poisoned) outputs"
    err = float((out.double().cpu() - ref).norm() / ref.norm())
    assert err < 1e-2, err
    assert torch.equal(d.launch_w4a4_decode(**ops, config=config), out)


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_decode_graph_capture_and_op_routing_gpu():
    from lowrank_gemm.kernels.w4a4_gemm import w4a4_gemm
    ops = w4.make_operands_v2("int4_2l", 16, 4096, 4096, 32, 64, device="cuda")
    want = d.launch_w4a4_decode(**ops).clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        d.launch_w4a4_decode(**ops)
    ops["out"].fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(ops["out"], want)
    for impl in ("decode", "auto"):   # auto routes int4_2l M ≤ 64 here
        y = w4a4_gemm(ops["x_q"], ops["x_scale"], ops["w_q"], ops["w_scale"], ops["lowrank_act"], ops["lora_up"],
                      ops["bias"], w_mul=ops["w_mul"], fmt="int4_2l", impl=impl)
        assert torch.equal(y, want)


# ---- the e4m3 path (f8=True, int4_g64) on the GPU
F8_GPU_CASES = [dict(M=1, N=160, K=512, rank=16, bias=True, col_scale=True, gs=64, cfg=None),
                dict(M=5, N=4112, K=4096, rank=32, bias=True, col_scale=False, gs=64, cfg=None),
                dict(M=16, N=336, K=1024, rank=0, bias=False, col_scale=True, gs=64, cfg=None),
                dict(M=16, N=28672, K=4096, rank=32, bias=True, col_scale=False, gs=64, cfg=None),
                # ragged K: the last 256-wide step is half past K (groups past K/G must add exactly 0)
                dict(M=5, N=272, K=640, rank=16, bias=True, col_scale=False, gs=64, cfg=None),
                # K loop shorter than the ring
                dict(M=1, N=272, K=192, rank=0, bias=True, col_scale=False, gs=64, cfg=dict(block_k=64, num_stages=8)),
                dict(M=5, N=336, K=1024, rank=32, bias=False, col_scale=False, gs=64,
                     cfg=dict(block_k=128, num_stages=6)),
                dict(M=5, N=4112, K=4096, rank=16, bias=True, col_scale=False, gs=128, cfg=None),
                dict(M=40, N=4112, K=4096, rank=32, bias=True, col_scale=True, gs=64, cfg=None),
                dict(M=40, N=336, K=1024, rank=0, bias=False, col_scale=True, gs=64, cfg=None)]


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", F8_GPU_CASES, ids=lambda c: f"M{c['M']}N{c['N']}K{c['K']}r{c['rank']}g{c['gs']}"
                                                         + ("" if c["cfg"] is None else "-cfg"))
def test_decode_f8_matches_reference_and_int8_gpu(case):
    c = dict(case)
    cfg, gs = c.pop("cfg"), c.pop("gs")
    ops = w4.make_operands_v2("int4_g64", c["M"], c["N"], c["K"], c["rank"], gs, device="cuda", bias=c["bias"],
                              col_scale=c["col_scale"])
    config = d.default_decode_config(c["M"], gs, "int4_g64", f8=True).replace(**cfg) if cfg else None
    out = d.launch_w4a4_decode(**ops, config=config, f8=True).clone()
    torch.cuda.synchronize()
    ref = w4.reference_v2(ops)
    assert torch.isfinite(out).all(), f"unwritten (NaN-poisoned) outputs: {(~torch.isfinite(out)).sum().item()}"
    err = float((out.double().cpu() - ref).norm() / ref.norm())
    assert err < 1e-2, f"f8 vs float64 reference: rel err {err:.3e}"
    again = d.launch_w4a4_decode(**ops, config=config, f8=True)
    assert torch.equal(again, out), "f8 not bit-identical over repeats"
    # f8 vs the int8 path in fp32: both sum the same exact integers per group (int32 / exact fp32 partials),
    # they differ only in fp32 rounding of the rescale (and in the fp8 MMA's accumulation, if it were inexact)
    o32 = {**ops, "out": torch.full_like(ops["out"], float("nan"), dtype=torch.float32)}
    y8 = d.launch_w4a4_decode(**o32, config=config, f8=True).clone()
    o32["out"].fill_(float("nan"))
    cfg8 = d.default_decode_config(c["M"], gs, "int4_g64").replace(**cfg) if cfg else None
    yi = d.launch_w4a4_decode(**o32, config=cfg8, f8=False).clone()
    diff = float((y8.double() - yi.double()).norm() / yi.double().norm())
    assert diff < 1e-5, f"f8 vs int8 path (fp32 out): rel diff {diff:.3e}"


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_decode_f8_graph_capture_and_default_switch_gpu(monkeypatch):
    """The f8 launch (expand_act_f8 + kernel) replays from a CUDA graph; F8_DEFAULT / the env switch route
    int4_g64 through it (the op's impl='decode' included)."""
    from lowrank_gemm.kernels.w4a4_gemm import w4a4_gemm
    ops = w4.make_operands_v2("int4_g64", 16, 4096, 4096, 32, 64, device="cuda")
    want = d.launch_w4a4_decode(**ops, f8=True).clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        d.launch_w4a4_decode(**ops, f8=True)
    ops["out"].fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(ops["out"], want)
    monkeypatch.setenv("LOWRANK_GEMM_DECODE_F8", "1")
    assert torch.equal(d.launch_w4a4_decode(**ops), want)
    y = w4a4_gemm(ops["x_q"], ops["x_scale"], ops["w_q"], ops["w_scale"], ops["lowrank_act"], ops["lora_up"],
                  ops["bias"], fmt="int4_g64", impl="decode")
    assert torch.equal(y, want)
