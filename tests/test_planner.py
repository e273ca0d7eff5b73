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
    monkeypatch.setattr(P, "_gpu_table_name", lambda dev: "h200")
    monkeypatch.setattr(P, "load_tuned", lambda name: table)
    P.clear_plan_cache()
    assert plan_lora(50, 4096, 4096, 16, torch.bfloat16, "cpu") == ("concat", hit_cfg)
    s, c = plan_lora(1, 4096, 4096, 16, torch.bfloat16, "cpu")   # split_k 128 > 64 K tiles: skipped
    assert c.split_k != 128
    P.clear_plan_cache()


def test_committed_table_is_valid():
    data = json.loads((P.TUNED_DIR / "h200.json").read_text())
    assert data["version"] >= 1
    for key, entry in data["lora"].items():
        assert entry["strategy"] in LORA_STRATEGIES, key
        KernelConfig.from_dict(entry["config"])
