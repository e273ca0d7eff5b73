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
    from lowrank_gemm.kernels.aot import compile_sm90
    config = d.default_decode_config(5, 64, fmt).replace(**cfg) if cfg else None
    sig, cx, c = d.aot_signature_decode(config, fmt=fmt)
    info = compile_sm90(MOD, "w4a4_decode_kernel", sig, cx, num_warps=d.WARPS)
    # register A operand: the second wgmma operand is a register list, not a shared-memory descriptor
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n16k32\.s32\.s8\.s8 \{[^}]+\}, \{[^}]+\}", info.ptx)
    assert "cp.async.bulk.tensor.2d" in info.ptx and "cp.async.bulk.tensor.1d" in info.ptx
    assert "ld.local" not in info.ptx
    assert d.decode_ledger(c, 64, fmt).total() == info.shared


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
