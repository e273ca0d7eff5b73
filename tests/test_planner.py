"""Planner: knobs, feasibility filter, tuned table, pinning."""

import json

import pytest
import torch

from lowrank_gemm.plan import planner as P
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.plan.planner import (LORA_STRATEGIES, block_r_for, can_implement, heuristic_lora,
                                       m_bucket, pinned, plan_lora, r_bucket, split_k_for, tuned_key)

H200_SMS = 132


def test_block_r():
    assert [block_r_for(r) for r in (1, 8, 16, 17, 64, 65, 128, 300)] == [16, 16, 16, 32, 64, 128, 128, 128]


def test_split_k_fills_the_machine_only_when_needed():
    # K=N=4096, M=64 with 64×128 tiles: 32 tiles on 132 SMs → split
    assert split_k_for(32, 32, H200_SMS) == 4
    assert split_k_for(224, 32, H200_SMS) == 1          # N=28672: already > 1 wave
    assert split_k_for(4, 8, H200_SMS) == 2              # keeps ≥ 4 K tiles per split
    assert split_k_for(1, 1000, H200_SMS, max_split=8) == 8


def test_buckets_and_key():
    assert [m_bucket(m) for m in (1, 2, 16, 17, 64, 200, 1024, 9999)] == [1, 16, 16, 64, 64, 256, 1024, 4096]
    assert [r_bucket(r) for r in (1, 16, 17, 64, 100, 128)] == [16, 16, 64, 64, 128, 128]
    assert tuned_key(64, 28672, 4096, 16, torch.bfloat16) == "m64_n28672_k4096_r16_bfloat16"


@pytest.mark.parametrize("M", [1, 16, 64, 256, 1024, 4096])
@pytest.mark.parametrize("KN", [(4096, 28672), (4096, 4096), (8192, 8192)])
@pytest.mark.parametrize("r", [8, 16, 64, 128])
def test_heuristic_gpu_configs_are_feasible(M, KN, r):
    K, N = KN
    strategy, cfg = heuristic_lora(M, N, K, r, 16, gpu=True, sms=H200_SMS)
    assert strategy in LORA_STRATEGIES
    assert can_implement(strategy, (M, N, K, r), cfg), can_implement(strategy, (M, N, K, r), cfg).reason
    assert cfg.num_stages >= 2


def test_heuristic_rules():
    s, c = heuristic_lora(64, 4096, 4096, 16, 16, gpu=True, sms=H200_SMS)
    assert s == "kloop" and c.split_k > 1 and c.block_m == 64
    s, c = heuristic_lora(64, 28672, 4096, 16, 16, gpu=True, sms=H200_SMS)
    assert s == "kloop" and c.split_k == 1
    s, c = heuristic_lora(4096, 8192, 8192, 16, 16, gpu=True, sms=H200_SMS)
    assert s == "split" and c.block_n == 256 and c.num_warps == 8
    s, _ = heuristic_lora(64, 4096, 4096, 128, 16, gpu=True, sms=H200_SMS)
    assert s == "split"                                  # rank 128 would spill S in kloop


def test_heuristic_decode_one_wave_and_split_block_r():
    # N=28672: 224 tiles of 128 would be 1.7 waves on 132 SMs → 112 tiles of 256, one wave
    s, c = heuristic_lora(64, 28672, 4096, 16, 16, gpu=True, sms=H200_SMS)
    assert (s, c.block_m, c.block_n, c.split_k) == ("kloop", 64, 256, 1) and c.num_stages >= 4
    s, c = heuristic_lora(256, 28672, 4096, 16, 16, gpu=True, sms=H200_SMS)
    assert (s, c.block_m, c.block_n, c.num_warps) == ("split", 128, 256, 8)
    s, c = heuristic_lora(1024, 4096, 4096, 64, 16, gpu=True, sms=H200_SMS)
    assert s == "split" and c.block_r == P.SPLIT_BLOCK_R      # rank walked in chunks: no spills


def test_probe_candidates_are_short_feasible_and_reused(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("probe_lora", P.TUNED_DIR.parents[3] / "scripts" / "probe_lora.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    tiles = set()
    for M, K, N, r in probe.points(quick=False):
        cands = probe.candidates(M, N, K, r, H200_SMS)
        n_sk = sum(s == "streamk" for _, s, _ in cands)      # own quota of ≤ 3 (streamk_specs)
        assert 2 <= len(cands) - n_sk <= probe.MAX_CANDIDATES and n_sk <= 3
        assert len({(s, c) for _, s, c in cands}) == len(cands)
        for _, s, c in cands:
            assert can_implement(s, (M, N, K, r), c), (M, N, K, r, s, c)
            tiles.add((s, c.block_m, c.block_n, c.block_k, c.block_r, c.num_warps, c.num_stages))
    assert len(tiles) <= 45                  # compiles are shared across (K, N); 5 streamk tiles
    rows = [{"M": 64, "N": 4096, "K": 4096, "r": 16, "strategy": "cublas", "graph_us": 14.0},
            {"M": 64, "N": 4096, "K": 4096, "r": 16, "strategy": "kloop", "graph_us": 12.0,
             "config": KernelConfig(block_m=64).to_dict()},
            {"M": 64, "N": 4096, "K": 4096, "r": 16, "strategy": "split", "graph_us": 13.0,
             "config": KernelConfig().to_dict()},
            {"M": 64, "N": 4096, "K": 4096, "r": 16, "strategy": "persistent_static", "graph_us": 1.0,
             "config": KernelConfig().to_dict()}]
    table = probe.winners(rows, allow_persistent=False)
    hit = table[tuned_key(64, 4096, 4096, 16, torch.bfloat16)]
    assert hit["strategy"] == "kloop" and hit["x_cublas"] == round(12 / 14, 3)
    assert KernelConfig.from_dict(hit["config"]).block_m == 64


def test_can_implement_reasons():
    c = KernelConfig(block_r=16)
    assert "rank 40 > block_r 16" in can_implement("kloop", (8, 8, 64, 40), c).reason
    assert can_implement("split", (8, 8, 64, 40), c)
    assert "does not split K" in can_implement("persistent_static", (8, 8, 256, 8), c.replace(split_k=2)).reason
    assert "split_k 8 > 2 K tiles" in can_implement("kloop", (8, 8, 128, 8), c.replace(split_k=8)).reason
    big = KernelConfig(block_m=128, block_n=256, block_k=128, num_stages=4)
    r = can_implement("kloop", (8, 8, 4096, 8), big)
    assert not r and "shared memory" in r.reason and "SMEM ledger" in r.reason
    assert "unknown strategy" in can_implement("fast", (1, 1, 1, 1), c).reason


def test_plan_on_cpu_is_feasible_and_small():
    for M, N, K, r in [(1, 8, 16, 1), (37, 70, 88, 8), (100, 100, 100, 128)]:
        s, c = plan_lora(M, N, K, r, torch.float16, "cpu")
        assert can_implement(s, (M, N, K, r), c)
        assert c.block_m <= 32


def test_pinned_is_scoped():
    cfg = KernelConfig(block_m=16, block_n=16, block_k=16)
    with pinned(strategy="concat", config=cfg):
        assert plan_lora(8, 8, 16, 4, torch.float16, "cpu") == ("concat", cfg)
        with pinned(strategy="split"):
            assert plan_lora(8, 8, 16, 4, torch.float16, "cpu")[0] == "split"
        assert plan_lora(8, 8, 16, 4, torch.float16, "cpu")[0] == "concat"
    assert P.current_pin() is None
    with pinned(strategy="kloop", config=cfg):
        with pytest.raises(ValueError, match="pinned config cannot run kloop"):
            plan_lora(8, 8, 16, 40, torch.float16, "cpu")


def test_tuned_table_hit_and_infeasible_entry_ignored(monkeypatch):
    hit_cfg = KernelConfig(block_m=64, block_n=64, block_k=64, num_stages=3, split_k=2)
    table = {tuned_key(64, 4096, 4096, 16, torch.bfloat16): {"strategy": "concat", "config": hit_cfg.to_dict()},
             tuned_key(1, 4096, 4096, 16, torch.bfloat16):
                 {"strategy": "kloop", "config": KernelConfig(block_r=16, split_k=128).to_dict()}}
    monkeypatch.setattr(P, "tuned_file", lambda family, dev: P.TUNED_DIR / f"{family}_h200.json")
    monkeypatch.setattr(P, "load_tuned", lambda path: table)
    P.clear_plan_cache()
    assert plan_lora(50, 4096, 4096, 16, torch.bfloat16, "cpu") == ("concat", hit_cfg)
    s, c = plan_lora(1, 4096, 4096, 16, torch.bfloat16, "cpu")   # split_k 128 > 64 K tiles: skipped
    assert c.split_k != 128
    P.clear_plan_cache()


def test_committed_table_is_valid():
    data = json.loads((P.TUNED_DIR / "lora_h200.json").read_text())
    assert data["version"] >= 1
    for key, entry in data["lora"].items():
        assert entry["strategy"] in LORA_STRATEGIES, key
        KernelConfig.from_dict(entry["config"])


def test_streamk_is_a_candidate_never_a_default():
    c = KernelConfig(block_m=64, block_n=128, block_k=128, block_r=16, num_stages=4)
    assert can_implement("streamk", (1, 4096, 4096, 16), c)
    assert "does not split K" in can_implement("streamk", (1, 4096, 4096, 16), c.replace(split_k=2)).reason
    assert "rank 40 > block_r 16" in can_implement("streamk", (1, 4096, 4096, 40), c).reason
    for M in (1, 16, 64, 256, 1024, 4096):
        for K, N in ((4096, 28672), (4096, 4096), (8192, 8192)):
            for r in (8, 16, 64, 128):
                assert heuristic_lora(M, N, K, r, 16, gpu=True, sms=H200_SMS)[0] != "streamk"
    s, cfg = heuristic_lora(1, 4096, 4096, 16, 16, gpu=True, sms=H200_SMS, strategy="streamk")
    assert s == "streamk" and cfg.split_k == 1 and can_implement(s, (1, 4096, 4096, 16), cfg)
    import importlib.util
    spec = importlib.util.spec_from_file_location("probe_lora", P.TUNED_DIR.parents[3] / "scripts" / "probe_lora.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    rows = [{"M": 1, "N": 4096, "K": 4096, "r": 16, "strategy": "cublas", "graph_us": 15.0},
            {"M": 1, "N": 4096, "K": 4096, "r": 16, "strategy": "kloop", "graph_us": 18.0,
             "config": KernelConfig(block_m=64).to_dict()},
            {"M": 1, "N": 4096, "K": 4096, "r": 16, "strategy": "streamk", "graph_us": 12.0,
             "config": c.to_dict()}]
    key = tuned_key(1, 4096, 4096, 16, torch.bfloat16)
    assert probe.winners(rows, False)[key]["strategy"] == "kloop"          # opt-in only
    assert probe.winners(rows, False, allow_streamk=True)[key]["strategy"] == "streamk"
    cands = probe.candidates(1, 4096, 4096, 16, H200_SMS)
    assert sum(s == "streamk" for _, s, _ in cands) >= 2
    assert not any(s == "streamk" for _, s, _ in probe.candidates(1024, 4096, 4096, 16, H200_SMS))
