"""The four-consumer W4A4 kernel (gluon/w4a4_quad.py) on the CPU: role registers, the SMEM ledger term by term and
against the compiled kernel, the PTX of its K loop (e4m3 wgmma, two FMAs per element, one fenced release per
group, one TMA expect per slot), ptxas without spills, and the route / refusal rules. GPU numerics: the
``int4_g64_quad`` cases of tests/test_gluon_gpu.py."""

import os
import subprocess

import pytest
import torch
from test_gluon_skeleton import WS_CAPTURE_SLACK, _ptx_loops, _unfenced_releases

from lowrank_gemm.kernels.gluon import w4a4_quad as Q
from lowrank_gemm.plan.smem import SM90_SMEM_LIMIT, Scope

MOD = "lowrank_gemm.kernels.gluon.w4a4_quad"
_CACHE = {}


def _compile(**kw):
    from lowrank_gemm.kernels.aot import compile_sm90
    key = repr(sorted((k, repr(v)) for k, v in kw.items()))
    if key not in _CACHE:
        sig, cx, cfg = Q.aot_signature_quad(**kw)
        _CACHE[key] = (compile_sm90(MOD, "w4a4_quad_kernel", sig, cx, num_warps=4), cx, cfg)
    return _CACHE[key]


def test_roles_fit_the_register_file():
    """Five warpgroups start at 96 registers a thread; setmaxnreg moves registers between them, never more than
    the 5 × 96 a thread index holds in all, in multiples of 8."""
    roles = Q.QUAD_ROLES
    assert [r.name for r in roles][:2] == ["consumer00", "loader"] and len(roles) == 1 + Q.QUAD_CONSUMERS
    workers = sum(r.regs for r in roles[1:])
    default = 5 * Q._INITIAL_REGS - workers
    assert Q._INITIAL_REGS == 96 and all(r.regs % 8 == 0 for r in roles[1:]) and default % 8 == 0
    assert default >= Q._CONSUMER_REGS >= 104, "each consumer needs acc + partial + its rows (~100 registers)"


def test_ledger_terms_per_cta_and_per_consumer():
    """MAIN and LOWRANK slots hold the CTA tile's operands once for all four consumers; only the staging tile of
    the TMA-store epilogue is per consumer. A term counted per consumer by mistake shows up here."""
    cfg = Q.plan_quad(rank=32)
    led = Q.quad_ledger(cfg, rank=32)
    s, lr = cfg.num_stages, cfg.lowrank_stages
    want = {"main.x_e4m3": (128 * 64, s), "main.w_e4m3": (128 * 64, s), "main.x_ab_rows": (2 * 128 * 4, s),
            "main.w_scale_row": (128 * 4, s), "lowrank.s_fp32": (128 * 32 * 4, lr),
            "lowrank.lora_up": (128 * 32 * 2, lr), "epilogue.out": (64 * 64 * 2, 1)}
    for name, (each, stages) in want.items():
        t = led.term(name)
        assert (t.bytes_each, t.stages) == (each, stages), name
        assert t.scope is (Scope.PER_CONSUMER if name == "epilogue.out" else Scope.CTA), name
    assert led.term("epilogue.out").total(led.consumers) == 4 * 64 * 64 * 2
    assert led.total() <= SM90_SMEM_LIMIT and s == 8 and lr == 2
    # no rank: no LOWRANK operands, the freed bytes do not buy a ninth MAIN slot (the planner's cap is 8)
    assert {t.name for t in Q.quad_ledger(Q.plan_quad(rank=0), rank=0).terms}.isdisjoint({"lowrank.s_fp32",
                                                                                        "lowrank.lora_up"})
    # fp32 output or N % 8 ≠ 0: the consumers store from registers, no staging tiles
    assert "epilogue.out" not in {t.name for t in Q.quad_ledger(cfg, rank=32, out_dtype=torch.float32).terms}
    assert "epilogue.out" not in {t.name for t in Q.quad_ledger(cfg, rank=32, n_out=261).terms}


AOT_CASES = [dict(), dict(rank=0, bias=False, col_scale=False), dict(rank=64, M=136, N=200, K=640),
             dict(out_dtype=torch.float32), dict(rank=16, N=1024, K=192)]


@pytest.mark.parametrize("case", AOT_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_aot_ptx_and_ledger(case):
    info, cx, cfg = _compile(**case)
    assert info.has("wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3"), "e4m3 wgmma on 64×64 consumer tiles"
    assert info.has("cp.async.bulk.tensor", "mbarrier.try_wait")
    assert f"setmaxnreg.inc.sync.aligned.u32 \t{Q._CONSUMER_REGS};" in info.ptx
    assert f"setmaxnreg.dec.sync.aligned.u32 \t{Q._LOADER_REGS};" in info.ptx
    if cx["HAS_LOWRANK"]:
        assert info.has("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"), "s·lora_upᵀ per consumer"
    assert ("cp.async.bulk.tensor.2d.global.shared" in info.ptx) == cx["EPI_TMA"]
    led = Q.quad_ledger(cfg, rank=case.get("rank", 32), out_dtype=case.get("out_dtype", torch.bfloat16),
                        n_out=case.get("N", 384))
    assert led.total() <= info.shared <= led.total() + WS_CAPTURE_SLACK, (led.table(), info.shared)
    assert info.shared <= SM90_SMEM_LIMIT


def test_k_loop_ptx():
    """Each consumer's K loop: one group per iteration — two k32 e4m3 wgmma, two FMAs per element of its 64×64
    tile (32 per thread), one release of the slot behind the proxy fence that covers its row loads (session 24's
    race), and the loader's one expect covers all five TMA copies of a slot."""
    info, cx, cfg = _compile()
    loops = [body for _, body in _ptx_loops(info.ptx)
             if sum("wgmma.mma_async" in x and "e4m3" in x for x in body) == 2
             and not any("bf16.bf16" in x for x in body)]
    assert len(loops) >= 4, "one K loop per consumer"
    for body in sorted(loops, key=len)[:4]:
        assert sum(x.strip().startswith("fma.rn.f32") for x in body) == 2 * 64 * 64 // 128
        assert sum("mbarrier.arrive" in x for x in body) == 1
        assert not _unfenced_releases(body), "a MAIN slot released after unfenced row loads"
    slot = 128 * 64 + 128 * 64 + 2 * 128 * 4 + 128 * 4
    assert f"{slot}" in info.ptx, "one expect of x, w, the xab rows and the w_scale row"


def test_ptxas_no_spill(tmp_path):
    import triton
    info, _, _ = _compile()
    ptx = tmp_path / "quad.ptx"
    ptx.write_text(info.ptx)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(ptx), "-o", str(tmp_path / "quad.cubin")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "0 bytes spill stores, 0 bytes spill loads" in r.stderr + r.stdout, r.stderr[-2000:]


def test_supported_and_route(monkeypatch):
    assert Q.quad_supported(4608, 12288, 3072, 32, 64, "int4_g64") is None
    assert "group 64" in Q.quad_supported(4608, 12288, 3072, 32, 128, "int4_g64")
    assert "M, N % 8" in Q.quad_supported(4605, 12288, 3072, 32, 64, "int4_g64")
    assert "int4_g64" in Q.quad_supported(4608, 12288, 3072, 32, 64, "int4_2l")
    assert "ranks ≤ 64" in Q.quad_supported(4608, 12288, 3072, 96, 64, "int4_g64")
    x = torch.zeros(4608, 3072 // 2, dtype=torch.uint8)
    w = torch.zeros(12288, 3072 // 2, dtype=torch.uint8)
    s = torch.zeros(4608, 32)
    open_ = dict(config=None, debug=False, grid=None, scale_tma=None, f8=None, paired=None, expanders=None,
                 inflight=None, coop=None, ws_f32=None, ws_perm=None, raw_stages=None)
    monkeypatch.delenv("LOWRANK_GEMM_V2_F8_EXPANDERS", raising=False)
    monkeypatch.delenv("LOWRANK_GEMM_V2_F8", raising=False)
    assert Q.quad_route(x, w, s, "int4_g64", 64, open_)
    assert not Q.quad_route(x[:64], w, s[:64], "int4_g64", 64, open_), "below W8_MIN_M: the two-expander kernel"
    assert not Q.quad_route(x, w, s, "int4_g64", 64, dict(open_, inflight=4)), "a pinned option of another kernel"
    assert not Q.quad_route(x, w, s, "int4_g64", 64, dict(open_, expanders=2))
    assert Q.quad_route(x, w, s, "int4_g64", 64, dict(open_, expanders=0, f8=True))
    assert not Q.quad_route(x, w, s, "int4_g64", 128, open_)
    monkeypatch.setenv("LOWRANK_GEMM_V2_QUAD", "0")
    assert not Q.quad_default()
    monkeypatch.setenv("LOWRANK_GEMM_V2_QUAD", "1")
    assert Q.quad_default()


@pytest.mark.parametrize("case,match", [
    (dict(group_size=128), "group 64 only"),
    (dict(M=100), r"M, N % 8 == 0"),
    (dict(rank=96), "ranks ≤ 64"),
])
def test_launcher_refuses_with_the_reason(case, match):
    """Problems the kernel does not run are refused before anything launches, naming what was expected (the v2
    launcher with ``quad=True`` goes through the same checks)."""
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    kw = dict(dict(M=256, N=384, K=512, rank=32, group_size=64), **case)
    ops = w4.make_operands_v2("int4_g64", kw["M"], kw["N"], kw["K"], kw["rank"], kw["group_size"], device="cpu")
    with pytest.raises(ValueError, match=match):
        w4.launch_w4a4_v2(**ops, quad=True)


def test_launcher_checks_the_output_buffer():
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    ops = w4.make_operands_v2("int4_g64", 256, 384, 512, 32, 64, device="cpu")
    ops["out"] = ops["out"][:, :200]
    with pytest.raises(ValueError, match="out must be contiguous"):
        w4.launch_w4a4_v2(**ops, quad=True)
