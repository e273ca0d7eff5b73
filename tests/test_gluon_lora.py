"""CPU checks of the LoRA v2 kernel (kernels/gluon/lora_ws.py): AOT sm_90 PTX, SMEM ledger, ring protocol,
planning and clear errors. Gluon does not run in the interpreter: numerics and hangs are covered by
tests/test_gluon_lora_gpu.py and scripts/probe_lora_v2.py (child processes with timeouts)."""

import re

import pytest
import torch

from lowrank_gemm.kernels.gluon import lora_ws as L
from lowrank_gemm.kernels.gluon import skeleton as sk
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.plan.smem import SM90_SMEM_LIMIT, SmemError

from test_gluon_skeleton import WS_CAPTURE_SLACK, _defined_in, _ptx_loops

MOD = "lowrank_gemm.kernels.gluon.lora_ws"
_PTX: dict = {}


def _compile(**case):
    from lowrank_gemm.kernels.aot import compile_sm90
    key = repr(sorted((k, repr(v)) for k, v in case.items()))
    if key not in _PTX:
        sig, cx, cfg = L.aot_signature_v2(**case)
        _PTX[key] = (compile_sm90(MOD, "lora_ws_kernel", sig, cx, num_warps=L.CONSUMER_WARPS), cx, cfg)
    return _PTX[key]


COOP_128x256 = KernelConfig(block_m=128, block_n=256, block_k=64, block_r=16, num_warps=8, num_stages=2)
COOP_256x128 = KernelConfig(block_m=256, block_n=128, block_k=64, block_r=16, num_warps=8, num_stages=2)

AOT_CASES = [
    dict(shrink="fused"),
    dict(shrink="pre"),
    dict(shrink="fused", rank=64),
    dict(shrink="pre", rank=64, M=200),
    dict(shrink="fused", M=64),                        # decode tiles 64×128, deepest ring
    dict(shrink="fused", N=165, rank=5, bias=False),   # N % 8 ≠ 0: masked st.global epilogue, B padded to r8
    dict(shrink="fused", dtype=torch.float16),
    dict(shrink="fused", debug=True),
    dict(shrink="fused", config=KernelConfig(block_m=64, block_n=256, block_k=64, block_r=16, num_warps=4,
                                             num_stages=4)),
    # COOP (num_warps 8: both consumers on one tile, 64 / 128 rows each; stores from registers)
    dict(shrink="fused", M=200, config=COOP_128x256),
    dict(shrink="pre", M=200, rank=64, config=COOP_128x256),
    dict(shrink="pre", M=300, config=COOP_256x128),
    dict(shrink="fused", M=200, config=COOP_128x256, debug=True),
]


@pytest.mark.parametrize("case", AOT_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()
                                                                   if k != "config") or "default")
def test_aot_compile_ptx_and_ledger(case):
    info, cx, cfg = _compile(**case)
    dt = "f16" if case.get("dtype") == torch.float16 else "bf16"
    assert info.has(f".f32.{dt}.{dt}"), "16-bit wgmma with fp32 accumulation"
    assert info.has(f"wgmma.mma_async.sync.aligned.m64n{cfg.block_n}k16"), "main product wgmma over the full BN"
    if cx["FUSED"]:
        assert info.has(f"wgmma.mma_async.sync.aligned.m64n{cfg.block_r}k16"), "shrink wgmma (N = BLOCK_R)"
    assert info.has("cp.async.bulk.tensor.2d.shared::cluster.global", "mbarrier.try_wait", "setmaxnreg")
    if cx["EPI_TMA"]:
        assert "cp.async.bulk.tensor.2d.global.shared" in info.ptx, "TMA store epilogue"
    else:
        assert "st.global" in info.ptx and "cp.async.bulk.tensor.2d.global.shared" not in info.ptx
    led = L.lora_v2_ledger(cfg, fused=cx["FUSED"], epi_tma=cx["EPI_TMA"])
    print(led.table(), "\ncompiled shared:", info.shared)
    assert led.total() <= info.shared <= led.total() + WS_CAPTURE_SLACK, (led.table(), info.shared)
    assert info.shared <= SM90_SMEM_LIMIT


def test_role_registers_in_ptx():
    """The role table's worker registers are what setmaxnreg sets, and the three warpgroups fit the file."""
    info, _, _ = _compile(shrink="fused")
    regs = {int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", info.ptx)}
    for role in L.LORA_ROLES[1:]:
        assert role.regs in regs, (role, regs)
    assert re.search(r"\.reqntid 384", info.ptx), "3 warpgroups (consumer0, loader's, consumer1)"
    # the default (consumer0) partition settles at ≤ the remainder; Triton gives it 240 here
    assert L.LORA_CONSUMER_REGS == 240 and 240 in regs
    assert 240 + 240 + 24 <= sk.REGISTER_BUDGET


@pytest.mark.parametrize("coop", [False, True], ids=["pingpong", "coop"])
@pytest.mark.parametrize("shrink,in_flight", [("fused", 2), ("pre", 1)])
def test_consumer_k_loop_releases_inside_the_loop(shrink, in_flight, coop):
    """Session-1 bug class (loop-carried slot aliasing): the consumer K loop's MAIN.empty arrive address
    must be computed inside the loop; fused keeps one step (two wgmma groups) in flight."""
    info, _, _ = _compile(shrink=shrink, K=1024, **(dict(M=200, config=COOP_128x256) if coop else {}))
    loops = _ptx_loops(info.ptx)
    kloops = [body for _, body in loops if any(f"wgmma.wait_group.sync.aligned {in_flight};" in x for x in body)]
    assert len(kloops) == 2, f"one K loop per consumer, found {len(kloops)}"
    for body in kloops:
        assert sum("wgmma.mma_async" in x for x in body) >= 1
        arrives = [re.search(r"mbarrier\.arrive\.shared::cta\.b64 _, \[(%r\d+)\]", x) for x in body]
        regs = [m.group(1) for m in arrives if m]
        assert regs, "the K loop releases MAIN slots"
        for r in regs:
            assert _defined_in(r, body), f"MAIN release address {r} is loop-invariant: every release hits one slot"
        assert not any(re.search(r"ld\.global", x) for x in body), "no global loads in the K loop"


# ---------------------------------------------------------------------------------------------
# Ring protocol on the host (same arithmetic as the kernel's states).
@pytest.mark.parametrize("n_tiles,k_tiles,stages", [(1, 1, 3), (2, 5, 3), (5, 2, 4), (7, 3, 2), (3, 64, 7)])
def test_consumers_partition_both_rings(n_tiles, k_tiles, stages):
    from test_gluon_skeleton import _PyState
    seen, lr_seen = {}, {}
    for c in range(sk.NUM_CONSUMERS):
        st = _PyState(0, sk.CONSUMER_START_PHASE, stages).advance(c * k_tiles)
        lr = _PyState(0, sk.CONSUMER_START_PHASE, L.LOWRANK_STAGES).advance(c)
        for t in range(c, n_tiles, 2):
            for kk in range(k_tiles):
                seen[t * k_tiles + kk] = (st.index, st.phase)
                st = st.next()
            st = st.advance(k_tiles)
            assert lr.index == c, "LOWRANK slot c belongs to consumer c"
            lr_seen[t] = (lr.index, lr.phase)
            lr = lr.advance(2)
    uses = list(range(n_tiles * k_tiles))
    assert [seen[u] for u in uses] == sk.expected_states_host(uses, stages, producer=False)
    assert [lr_seen[t] for t in range(n_tiles)] == sk.expected_states_host(list(range(n_tiles)),
                                                                           L.LOWRANK_STAGES, producer=False)


@pytest.mark.parametrize("tiles,sms,want", [(224, 132, 112), (1, 132, 1), (131, 132, 131), (133, 132, 67),
                                            (267, 132, 89), (2048, 132, 128), (448, 132, 112)])
def test_balanced_grid(tiles, sms, want):
    g = L.balanced_grid(tiles, sms)
    assert g == want
    waves = -(-tiles // g)
    assert waves == -(-tiles // min(tiles, sms)), "same makespan as one program per SM"


# ---------------------------------------------------------------------------------------------
# Planning and errors.
def test_plan_default_tiles_and_stages():
    c = L.plan_lora_v2(64, 28672, 4096, 16)
    assert (c.block_m, c.block_n, c.block_k, c.block_r) == (64, 128, 64, 16) and c.num_stages == 7
    c = L.plan_lora_v2(4096, 8192, 8192, 16, fused=False)
    assert (c.block_m, c.block_n) == (128, 128) and c.num_stages == 4
    c = L.plan_lora_v2(4096, 4096, 4096, 64, fused=False)
    assert c.block_r == 64 and c.num_stages == 3


def test_shrink_mode(monkeypatch):
    monkeypatch.delenv("LOWRANK_GEMM_LORA_V2_SHRINK", raising=False)
    assert L.shrink_mode(64) == "fused" and L.shrink_mode(4096) == "pre"
    assert L.shrink_mode(4096, "fused") == "fused"
    monkeypatch.setenv("LOWRANK_GEMM_LORA_V2_SHRINK", "pre")
    assert L.shrink_mode(64) == "pre"
    with pytest.raises(ValueError, match="shrink must be one of"):
        L.shrink_mode(64, "both")


def test_can_implement_and_clear_errors():
    shape = dict(M=256, N=4096, K=4096, rank=16)
    assert L.can_implement_v2(None, shape)
    assert not L.can_implement_v2(None, dict(shape, rank=0))
    assert not L.can_implement_v2(None, dict(shape, dtype=torch.float32))
    big = KernelConfig(block_m=128, block_n=256, block_k=64, block_r=16, num_warps=4, num_stages=2)
    assert not L.can_implement_v2(big, shape)
    with pytest.raises(ValueError, match="registers/thread"):
        L._check_config(big, 16, True, True)
    with pytest.raises(ValueError, match="block_r"):
        L._check_config(KernelConfig(block_r=16, num_warps=4, num_stages=2), 33, True, True)
    with pytest.raises(ValueError, match="num_warps"):
        L._check_config(KernelConfig(block_r=16, num_warps=2, num_stages=2), 16, True, True)
    with pytest.raises(SmemError, match="limit"):
        L._check_config(KernelConfig(block_m=128, block_n=128, block_k=128, block_r=16, num_warps=4, num_stages=8),
                        16, True, True)


def test_input_errors_say_expected_vs_got():
    ops = L.make_operands_v2(20, 24, 40, 4, device="cpu")
    with pytest.raises(ValueError, match=r"lora_b must be \[N, r\]"):
        L.kernel_args_v2(**dict(ops, lora_b=ops["lora_b"][:, :3]))
    with pytest.raises(TypeError, match="weight must have x's dtype"):
        L.kernel_args_v2(**dict(ops, weight=ops["weight"].half()))
    with pytest.raises(ValueError, match=r"out must be \[M, N\]"):
        L.kernel_args_v2(**dict(ops, out=torch.empty(20, 25, dtype=torch.bfloat16)))
    with pytest.raises(ValueError, match="K ≥ 1"):
        L.kernel_args_v2(**L.make_operands_v2(4, 8, 0, 2, device="cpu"))


def test_ragged_k_and_rank_are_padded_for_tma():
    """K % 8 ≠ 0 (row pitch not 16 B) and r % 8 ≠ 0 go through zero-padded copies; the descriptors see
    16-byte pitches. The padding adds zeros to both dot products, so the result is unchanged."""
    ops = L.make_operands_v2(33, 40, 70, 5, device="cpu")
    _, args, cx, cfg, _, _ = L.kernel_args_v2(**ops)
    x_desc, w_desc, a_desc, b_desc = args[:4]
    assert x_desc.shape[1] == 72 and w_desc.shape[1] == 72 and a_desc.shape[1] == 72
    assert b_desc.shape[1] == 8 and cx["BLOCK_R"] == 16 and cx["FUSED"]
    assert not cx["EPI_TMA"] or 40 % 8 == 0


def test_auto_picks_v2_only_where_measured_faster(monkeypatch):
    """lora_linear(strategy="auto") hands the shape to the Gluon v2 only inside the measured bucket of
    plan/tuned/lora_v2_h200.json (M 33..64, N ≥ 16384, K 4096, r ≤ 16); LOWRANK_GEMM_LORA_V2=0 turns it off."""
    import torch
    from lowrank_gemm.kernels import lora_gemm as lg
    from lowrank_gemm.plan.tuned import TUNED_DIR
    monkeypatch.setattr(lg, "tuned_file", lambda family, device: TUNED_DIR / f"{family}_h200.json")
    dev = torch.device("cpu")
    assert lg._v2_choice(64, 28672, 4096, 16, dev) == "fused"
    assert lg._v2_choice(48, 28672, 4096, 8, dev) == "fused"
    for shape in ((16, 28672, 4096, 16), (128, 28672, 4096, 16), (64, 4096, 4096, 16), (64, 28672, 8192, 16),
                  (64, 28672, 4096, 64), (64, 28672, 4096, 0)):
        assert lg._v2_choice(*shape, dev) is None, shape
    monkeypatch.setenv("LOWRANK_GEMM_LORA_V2", "0")
    assert lg._v2_choice(64, 28672, 4096, 16, dev) is None


# ---------------------------------------------------------------------------------------------
# COOP: both consumers on one tile.
def test_coop_barriers_count_both_consumers():
    """COOP's MAIN and LOWRANK empty barriers complete on two arrivals (each consumer reads every slot); the
    ping-pong kernel's on one. One LOWRANK slot in COOP, two in ping-pong (the ledger's terms)."""
    counts = {}
    for coop in (False, True):
        info, _, cfg = _compile(shrink="pre", M=200, **(dict(config=COOP_128x256) if coop else {}))
        counts[coop] = sorted({int(v) for v in re.findall(r"mbarrier\.init\.shared(?:::cta)?\.b64 \[[^]]+\], (\d+);",
                                                           info.ptx)})
        led = {t.name: t.stages for t in L.lora_v2_ledger(cfg, fused=False).terms}
        assert led["lowrank.lora_b"] == (1 if coop else 2) == L.lowrank_stages(cfg)
        assert ("epilogue.out" in led) is not coop, "COOP stores from registers"
    assert counts[False] == [1] and counts[True] == [1, 2], counts


def test_coop_plan_and_errors():
    assert L.is_coop(COOP_128x256) and not L.is_coop(COOP_128x256.replace(num_warps=4))
    c = L.plan_lora_v2(256, 28672, 4096, 16, config=COOP_128x256, fused=False)
    assert c.num_stages == 4 and c.lowrank_stages == 1     # 48 KB a stage beside one 12 KB S + B slot
    c = L.plan_lora_v2(256, 28672, 4096, 64, config=COOP_128x256, fused=False)
    assert c.num_stages == 3 and c.block_r == 64
    assert L.can_implement_v2(COOP_128x256, dict(M=256, N=28672, K=4096, rank=16, shrink="pre"))
    with pytest.raises(ValueError, match="COOP"):
        L._check_config(COOP_128x256.replace(block_m=64), 16, True, False)
    with pytest.raises(ValueError, match="registers/thread"):     # 128 rows × 256 per consumer
        L._check_config(COOP_256x128.replace(block_n=256, num_stages=2), 16, False, False)
    ops = L.make_operands_v2(96, 160, 384, 16, device="cpu")
    _, _, cx, cfg, _, _ = L.kernel_args_v2(**ops, config=COOP_128x256, shrink="pre", debug=True)
    assert cx["COOP"] and not cx["EPI_TMA"] and cx["DEBUG"] and cfg.lowrank_stages == 1


def test_v2_table_entries_with_tiles_and_exact_n(monkeypatch, tmp_path):
    """An entry may pin its tiles (``config``: the COOP schedule it was measured with) and one N exactly (``n``);
    ``r_min`` bounds the rank from below. Other shapes stay on v1."""
    import json
    import torch
    from lowrank_gemm.kernels import lora_gemm as lg
    table = tmp_path / "lora_v2_test.json"
    table.write_text(json.dumps({"version": 1, "entries": [
        {"m_min": 129, "m_max": 256, "n": 28672, "k": 4096, "r_min": 9, "r_max": 64, "shrink": "pre",
         "config": COOP_128x256.to_dict()}]}))
    monkeypatch.setattr(lg, "tuned_file", lambda family, device: table)
    dev = torch.device("cpu")
    e = lg._v2_entry(256, 28672, 4096, 16, dev)
    assert e["shrink"] == "pre" and e["config"] == COOP_128x256 and L.is_coop(e["config"])
    assert lg._v2_choice(200, 28672, 4096, 64, dev) == "pre"
    for shape in ((256, 28673, 4096, 16), (128, 28672, 4096, 16), (257, 28672, 4096, 16), (256, 28672, 4096, 8),
                  (256, 28672, 8192, 16), (256, 28672, 4096, 65)):
        assert lg._v2_entry(*shape, dev) is None, shape


def test_v2_table_extends_and_refuses_bad_files(monkeypatch, tmp_path):
    """An H100's own v2 table ``extends`` the H200's: its entries first (they win where buckets overlap), the
    H200's still apply elsewhere. Another version, an entry missing a bucket field or an unknown shrink mode is a
    ValueError naming the file — never a silent fall back to v1."""
    import json
    import torch
    from lowrank_gemm.kernels import lora_gemm as lg
    base = tmp_path / "lora_v2_base.json"
    base.write_text(json.dumps({"version": 1, "entries": [
        {"m_min": 33, "m_max": 64, "n_min": 16384, "k": 4096, "r_max": 16, "shrink": "fused"}]}))
    own = tmp_path / "lora_v2_own.json"
    own.write_text(json.dumps({"version": 1, "extends": base.name, "entries": [
        {"m_min": 129, "m_max": 256, "n": 28672, "k": 4096, "r_max": 64, "shrink": "pre",
         "config": COOP_128x256.to_dict()},
        {"m_min": 64, "m_max": 64, "n": 28672, "k": 4096, "r_max": 16, "shrink": "pre"}]}))
    monkeypatch.setattr(lg, "tuned_file", lambda family, device: own)
    dev = torch.device("cpu")
    assert lg._v2_entry(256, 28672, 4096, 64, dev)["config"] == COOP_128x256
    assert lg._v2_choice(64, 28672, 4096, 16, dev) == "pre"          # own entry over the base's "fused"
    assert lg._v2_choice(48, 28672, 4096, 16, dev) == "fused"        # the base's, where own has none
    assert lg._v2_choice(512, 28672, 4096, 16, dev) is None
    for i, (data, match) in enumerate((
            ({"version": 2, "entries": []}, "version 2"),
            ({"entries": []}, "version None"),
            ({"version": 1, "entries": [{"m_min": 1, "m_max": 8, "k": 4096, "r_max": 16, "shrink": "pre"}]},
             "entry 0 lacks n or n_min"),
            ({"version": 1, "entries": [{"m_min": 1, "n": 8, "k": 4096, "r_max": 16, "shrink": "pre"}]},
             "lacks m_max"),
            ({"version": 1, "entries": [{"m_min": 1, "m_max": 8, "n": 8, "k": 4096, "r_max": 16,
                                         "shrink": "split"}]}, "shrink 'split'"))):
        bad = tmp_path / f"lora_v2_bad{i}.json"
        bad.write_text(json.dumps(data))
        monkeypatch.setattr(lg, "tuned_file", lambda family, device, bad=bad: bad)
        with pytest.raises(ValueError, match=match):
            lg._v2_entry(64, 28672, 4096, 16, dev)


@pytest.mark.parametrize("n_tiles,k_tiles,stages", [(1, 1, 3), (3, 1, 2), (5, 2, 4), (4, 7, 3), (6, 3, 4), (2, 64, 4)])
def test_coop_protocol_model(n_tiles, k_tiles, stages):
    """The COOP schedule under random interleavings with real mbarrier parity semantics: never a deadlock or a slot
    read while it holds another use, whichever role lags; with empty barriers counting one consumer (not both)
    the loader refills slots the slower consumer has not read — the model catches it."""
    from lowrank_gemm.kernels.gluon.protocol_model import simulate_coop
    for seed in range(8):
        for slow in (None, {"consumer1": 0.1}, {"consumer0": 0.1}, {"loader": 0.1}, {"tma": 0.05}):
            r = simulate_coop(n_tiles, k_tiles, stages, seed=seed, slow=slow)
            assert r.ok, (seed, slow, r.why)
    broken = [simulate_coop(n_tiles + 3, k_tiles, stages, releasers=1, seed=s, slow={"consumer1": 0.1})
              for s in range(8)]
    assert not all(r.ok for r in broken), "a one-arrival empty barrier must be caught"
