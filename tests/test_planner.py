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
@pytest.mark.parametrize("KN", [(4096, 28672), (4096, 4096), (8192, 8192), (4096, 1024), (4096, 6144), (14336, 4096),
                                (3584, 18944), (18944, 3584)])
@pytest.mark.parametrize("r", [8, 16, 64, 128])
def test_heuristic_gpu_configs_are_feasible(M, KN, r):
    K, N = KN
    strategy, cfg = heuristic_lora(M, N, K, r, 16, gpu=True, sms=H200_SMS)
    assert strategy in LORA_STRATEGIES
    assert can_implement(strategy, (M, N, K, r), cfg), can_implement(strategy, (M, N, K, r), cfg).reason
    assert cfg.num_stages >= 2


def test_heuristic_rules():
    s, c = heuristic_lora(64, 4096, 4096, 16, 16, gpu=True, sms=H200_SMS)
    assert (s, c.block_m, c.block_n, c.split_k) == ("kloop", 64, 32, 1)       # 4096²'s tuned tile
    s, c = heuristic_lora(64, 28672, 4096, 16, 16, gpu=True, sms=H200_SMS)
    assert s == "kloop" and c.split_k == 1
    s, c = heuristic_lora(4096, 8192, 8192, 16, 16, gpu=True, sms=H200_SMS)
    assert s == "persistent_static" and c.block_n == 256 and c.num_warps == 8
    s, _ = heuristic_lora(64, 4096, 4096, 128, 16, gpu=True, sms=H200_SMS)
    assert s == "split"                                  # rank 128 would spill S in kloop


def test_heuristic_decode_one_wave_and_split_block_r():
    # N=28672: 224 tiles of 128 would be 1.7 waves on 132 SMs → 112 tiles of 256, one wave
    s, c = heuristic_lora(64, 28672, 4096, 16, 16, gpu=True, sms=H200_SMS)
    assert (s, c.block_m, c.block_n, c.split_k) == ("kloop", 64, 256, 1) and c.num_stages >= 4
    s, c = heuristic_lora(256, 28672, 4096, 16, 16, gpu=True, sms=H200_SMS)
    assert (s, c.block_m, c.block_n, c.num_warps) == ("persistent_static", 128, 256, 8)
    s, c = heuristic_lora(1024, 4096, 4096, 64, 16, gpu=True, sms=H200_SMS)
    assert s == "split" and c.block_r == P.SPLIT_BLOCK_R      # rank walked in chunks: no spills


def test_decode_m_64x64_where_64x32_takes_two_rounds():
    """16 < M ≤ 64 under 0.7 of a wave of 64×64 tiles: 64×64 where 64×32 tiles would take two rounds (N=5632, K=2048:
    88 against 176 tiles; H100 s58h, one process: 1.12× cuBLAS against 64×32×256's 1.39×), 64×32 where they take one
    (N=4096: 128 tiles; the H200 table's 4096² tile), split 2 in the launch under half a wave (N=1024)."""
    for N in (5632, 5120, 4352):
        s, c = heuristic_lora(64, N, 2048, 16, 16, gpu=True, sms=H200_SMS)
        assert (s, c.block_m, c.block_n, c.block_k, c.split_k) == ("kloop", 64, 64, 128, 1), N
    s, c = heuristic_lora(64, 5632, 2048, 16, 16, gpu=True, sms=H200_SMS)
    assert c.num_stages == 6                                  # the tuned winner of s58h: kloop 64x64x128 w4 s6
    for N, split in ((4096, 1), (4224, 1), (1024, 2)):
        s, c = heuristic_lora(64, N, 4096, 16, 16, gpu=True, sms=H200_SMS)
        assert (s, c.block_n, c.block_k, c.split_k) == ("kloop", 32, 256, split), N


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


def test_entry_serves_its_bucket_and_grids_like_it(monkeypatch):
    """A tuned entry plans the M between buckets only where its grid there matches the bucket's M or runs ≥ 2 waves
    (probes/s20/call1): elsewhere the rules plan, e.g. M=512 on the M=1024 entry's half wave of 4096² tiles."""
    wide = KernelConfig(block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8)
    assert P.entry_serves(1024, 4096, "persistent_static", wide, H200_SMS)           # the bucket's own M
    assert not P.entry_serves(512, 4096, "persistent_static", wide, H200_SMS)        # 64 CTAs, not 128
    assert not P.entry_serves(768, 8192, "persistent_static", wide, H200_SMS)        # 1.45 waves, not 1.94
    assert P.entry_serves(512, 28672, "persistent_static", wide, H200_SMS)           # 448 CTAs: ≥ 2 waves
    assert P.entry_serves(8192, 4096, "split", wide, H200_SMS)                       # past the last bucket
    kl = KernelConfig(block_m=64, block_n=128, block_k=128, split_k=2, split_mode="fixup")
    assert P.entry_serves(200, 4096, "kloop", kl, H200_SMS)                          # 4 row tiles, as at 256
    assert not P.entry_serves(128, 4096, "kloop", kl, H200_SMS)
    assert P.entry_serves(130, 4096, "persistent_static", kl.replace(block_m=128), H200_SMS)   # split ignored
    # through plan_lora: the M=256 entry plans M=256 and M=200, the rules plan M=128 (on the GPU's SM count)
    entry = KernelConfig(block_m=64, block_n=128, block_k=128, block_r=16, num_stages=3)
    table = {tuned_key(256, 4096, 4096, 16, torch.bfloat16): {"strategy": "kloop", "config": entry.to_dict()}}
    monkeypatch.setattr(P, "tuned_file", lambda family, dev: P.TUNED_DIR / f"{family}_h200.json")
    monkeypatch.setattr(P, "load_tuned", lambda path: table)
    import lowrank_gemm.kernels.schedule as S
    monkeypatch.setattr(S, "num_sms", lambda dev: H200_SMS)
    P.clear_plan_cache()
    try:
        assert plan_lora(256, 4096, 4096, 16, torch.bfloat16, "cpu") == ("kloop", entry)
        assert plan_lora(200, 4096, 4096, 16, torch.bfloat16, "cpu") == ("kloop", entry)
        assert plan_lora(128, 4096, 4096, 16, torch.bfloat16, "cpu")[1] != entry
    finally:
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


# ---------------------------------------------------------------------------- session 5: wave-aware split

def test_wave_split_fills_the_partial_wave_only():
    ws = P.wave_split
    assert ws(32, 64, H200_SMS) == 4          # K=N=4096, M=256, 128×256 tiles: 32 → 128 CTAs, one launch
    assert ws(64, 64, H200_SMS) == 2          # 8192², M=256: 64 tiles
    assert ws(224, 64, H200_SMS) == 4         # N=28672, M=256: 132 whole + 92 × 4 pieces (1.9 vs 2 tile-times)
    assert ws(128, 64, H200_SMS) == 1         # M=1024, K=N=4096: 0.97 of a wave already
    assert ws(512, 64, H200_SMS) == 1 and ws(1024, 128, H200_SMS) == 1    # last wave ≥ 88 % full
    assert ws(32, 8, H200_SMS) == 2           # ≥ 4 K tiles per piece
    for tiles, k_tiles in ((32, 32), (64, 64), (16, 32), (120, 64)):   # below a wave: split_k_for's rule
        assert ws(tiles, k_tiles, H200_SMS) == split_k_for(tiles, k_tiles, H200_SMS)


def test_heuristic_mid_m_measured_tiles():
    """probes/s17/families (untuned Llama-3-8B projections): no split-K on 128×256 tiles (M=256, N=6144 split 8 in
    one launch read 3.6× cuBLAS, 128×128 unsplit 1.25×); 128×128 split 2 by the reduce kernel only under half a wave."""
    s, c = heuristic_lora(256, 6144, 4096, 16, 16, gpu=True, sms=H200_SMS, strategy="split")
    assert (s, c.block_m, c.block_n, c.split_k) == ("split", 128, 128, 1)
    for M, K, N in ((256, 4096, 1024), (256, 14336, 4096), (1024, 4096, 1024), (256, 4096, 4096)):
        s, c = heuristic_lora(M, N, K, 16, 16, gpu=True, sms=H200_SMS, strategy="split")
        assert (s, c.block_n, c.split_k, c.split_mode) == ("split", 128, 2, "reduce"), (M, K, N)
    for M, K, N in ((256, 4096, 14336), (4096, 4096, 6144), (4096, 4096, 1024), (1024, 3584, 3584)):
        s, c = heuristic_lora(M, N, K, 16, 16, gpu=True, sms=H200_SMS, strategy="split")
        assert (s, c.block_n, c.num_warps, c.split_k) == ("split", 256, 8, 1), (M, K, N)
    # 1–1.5 waves of 128×256 tiles: 128×128 finish in fewer waves (M=256, N=18944: 148 tiles, 1.59× vs 1.37×;
    # M=1024, N=6144: 192 tiles, 1.17× vs 1.07×); from 1.5 waves on the wide tile again (M=1024, N=18944: 592)
    for M, K, N in ((256, 3584, 18944), (1024, 4096, 6144)):
        s, c = heuristic_lora(M, N, K, 16, 16, gpu=True, sms=H200_SMS, strategy="split")
        assert (s, c.block_n, c.num_warps, c.split_k) == ("split", 128, 4, 1), (M, K, N)
    assert heuristic_lora(1024, 18944, 3584, 16, 16, gpu=True, sms=H200_SMS)[1].block_n == 256
    # a free strategy at 64 < M ≤ 1024, unsplit: persistent_static where its S tasks (one per row block) add no round
    # of tiles (probes/s18/down); split where they would (M=1024, 14336→4096: 128 tiles + 8 tasks > 132 SMs), where
    # K is split, at M = 4096, and at rank 128
    for M, K, N in ((256, 4096, 6144), (256, 4096, 14336), (1024, 18944, 3584), (1024, 4096, 6144),
                    (256, 28672, 8192)):
        for r in (16, 64):
            s, c = heuristic_lora(M, N, K, r, 16, gpu=True, sms=H200_SMS)
            assert (s, c.split_k, c.block_r) == ("persistent_static", 1, r), (M, K, N, r)
    for M, K, N, r in ((1024, 14336, 4096, 64), (1024, 4096, 1024, 64), (4096, 4096, 6144, 64), (256, 4096, 6144, 128),
                       (256, 4096, 1024, 128)):
        assert heuristic_lora(M, N, K, r, 16, gpu=True, sms=H200_SMS)[0] == "split", (M, K, N, r)
    # at most a wave of 64-row tiles at 64 < M ≤ 256, strategy free (probes/s20/call2): persistent_static on the
    # width that puts the most tiles + S tasks in one wave — best or within 1.3 % at all 20 probed points
    for M, K, N, r, bn in ((256, 4096, 4096, 64, 128), (128, 4096, 4096, 16, 64), (256, 4096, 2048, 16, 64),
                           (256, 14336, 4096, 64, 128), (128, 8192, 8192, 64, 128), (192, 5120, 5120, 16, 128),
                           (128, 4096, 1024, 64, 64)):
        s, c = heuristic_lora(M, N, K, r, 16, gpu=True, sms=H200_SMS)
        assert (s, c.block_m, c.block_n, c.split_k, c.block_r) == ("persistent_static", 64, bn, 1, r), (M, K, N, r)
        assert P.one_wave_persistent_tile(M, N, H200_SMS) == bn
        assert can_implement(s, (M, N, K, r), c)
    assert P.one_wave_persistent_tile(256, 6144, H200_SMS) is None            # 4·48 + 4 > 132
    assert P.one_wave_persistent_tile(64, 4096, H200_SMS) is None             # M ≤ 64: the decode rules
    assert heuristic_lora(256, 4096, 4096, 128, 16, gpu=True, sms=H200_SMS)[0] == "split"   # rank 128: not fused
    # pinned kloop keeps its one-launch rule (probes/s18/narrow, s19/call1): the tile and in-launch split that put
    # the most CTAs in one wave
    for M, K, N, r, bn, split in ((256, 4096, 1024, 16, 64, 2), (256, 8192, 1024, 64, 64, 2),
                                  (128, 4096, 2048, 16, 64, 2), (256, 4096, 2048, 64, 128, 2),
                                  (128, 4096, 4096, 16, 128, 2), (256, 4096, 4096, 64, 128, 1)):
        s, c = heuristic_lora(M, N, K, r, 16, gpu=True, sms=H200_SMS, strategy="kloop")
        assert (s, c.block_m, c.block_n, c.split_k) == ("kloop", 64, bn, split), (M, K, N, r)
        assert c.split_k == 1 or c.split_mode == "fixup"
        assert can_implement(s, (M, N, K, r), c)
    # 64×128 was measured at K ≤ 4096, and unsplit on a full wave at K=8192 (probes/s20/call1: 8192² M=128 0.98×);
    # past a wave (N=6144) or at M=1024 the other rules
    assert P.one_wave_kloop_tile(256, 2048, 8192, H200_SMS) is None       # 64 CTAs: half a wave
    assert P.one_wave_kloop_tile(128, 8192, 8192, H200_SMS) == (64, 128, 128, 4, 1, "fixup")
    assert P.one_wave_kloop_tile(256, 6144, 4096, H200_SMS) is None and P.one_wave_kloop_tile(1024, 1024, 4096, 132) is None
    assert heuristic_lora(256, 1024, 4096, 16, 16, gpu=True, sms=H200_SMS, strategy="split")[0] == "split"
    for M, K, N in ((1024, 4096, 14336), (4096, 4096, 14336), (1024, 4096, 28672), (1024, 8192, 8192)):
        assert heuristic_lora(M, N, K, 16, 16, gpu=True, sms=H200_SMS)[0] == "persistent_static", (M, K, N)
    # 16 < M ≤ 64: the widest N tile with about a wave of tiles, split only for tiny N (or 64×64 at long K)
    got = {N: heuristic_lora(64, N, 4096, 16, 16, gpu=True, sms=H200_SMS)[1] for N in (28672, 14336, 6144, 4096, 1024)}
    assert {N: (c.block_n, c.split_k) for N, c in got.items()} == {
        28672: (256, 1), 14336: (128, 1), 6144: (64, 1), 4096: (32, 1), 1024: (32, 2)}
    # rank 64 on the 64×32 tile: block_k 128 (×256's [64, 256] A tile left 2 stages: 1.86–2.14× against 1.25–1.32×
    # on three untuned shapes, probes/s20/call4/probes/m64_r64)
    for N, K in ((4096, 4096), (3072, 3072), (4096, 2048), (1024, 4096)):
        c16 = heuristic_lora(64, N, K, 16, 16, gpu=True, sms=H200_SMS)[1]
        c64 = heuristic_lora(64, N, K, 64, 16, gpu=True, sms=H200_SMS)[1]
        assert (c16.block_n, c16.block_k, c64.block_n, c64.block_k) == (32, 256, 32, 128), (N, K)
        assert c64.num_stages >= 4 and c64.split_k == c16.split_k
    c = heuristic_lora(64, 4096, 14336, 16, 16, gpu=True, sms=H200_SMS)[1]
    assert (c.block_n, c.split_k, c.split_mode) == (64, 2, "fixup")
    # never more pieces than K has (≥ 4 K tiles each), and rank 128 never persistent (measured at ≤ 64 only)
    s, c = heuristic_lora(64, 200, 128, 16, 16, gpu=True, sms=H200_SMS)
    assert c.split_k == 1 and can_implement(s, (64, 200, 128, 16), c)
    assert heuristic_lora(1024, 8192, 8192, 128, 16, gpu=True, sms=H200_SMS)[0] == "split"
    # an env split mode, or a pinned persistent strategy, keeps the older rules
    s, c = heuristic_lora(256, 4096, 4096, 16, 16, gpu=True, sms=H200_SMS, split_mode="reduce")
    assert (c.block_n, c.split_k, c.split_mode) == (256, 4, "reduce")
    s, c = heuristic_lora(256, 4096, 4096, 16, 16, gpu=True, sms=H200_SMS, strategy="persistent_static")
    assert (c.block_n, c.split_k) == (256, 1)


def _probe():
    import importlib.util
    import sys
    sys.path.insert(0, str(P.TUNED_DIR.parents[3] / "scripts"))
    spec = importlib.util.spec_from_file_location("probe_lora", P.TUNED_DIR.parents[3] / "scripts" / "probe_lora.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    return probe


def test_issue2_candidates_feasible_and_short():
    probe = _probe()
    tiles = set()
    for M, K, N, r in probe.ISSUE2_POINTS:
        cands = probe.issue2_specs(M, N, K, r, H200_SMS)
        assert 3 <= len(cands) <= 10 and cands[0][0].startswith("heur")
        assert len({(s, c) for _, s, c in cands}) == len(cands)
        for label, s, c in cands:
            assert can_implement(s, (M, N, K, r), c), (M, N, K, r, s, c)
            # the probe's own candidates are one main launch; the heuristic's mid-M 128×128 split 2 reduces
            # (session 17: it beat the one-launch fixup on every measured untuned shape)
            assert c.split_k == 1 or c.split_mode == "fixup" or label.startswith("heur")
            tiles.add((s, c.block_m, c.block_n, c.block_k, c.block_r, c.num_warps, c.num_stages))
    assert len(tiles) <= 40
    sets = probe._option_sets("split", 64)
    assert sets["off"] == {"prefetch": False, "pdl": False, "down_full_rank": False}
    assert set(sets) == {"off", "on-prefetch", "on-pdl", "on-down_full_rank"}
    assert set(probe._option_sets("kloop", 16)) == {"off", "on-prefetch"}


def test_swap_candidates_feasible_and_short():
    probe = _probe()
    for M, K, N, r in probe.SWAP_POINTS:
        cands = probe.swap_specs(M, N, K, r, H200_SMS)
        assert 5 <= len(cands) <= 10 and len({(s, c) for _, s, c in cands}) == len(cands)
        for _, s, c in cands:
            assert s in ("kloop", "split") and c.swap_ab and can_implement(s, (M, N, K, r), c), (M, N, K, r, c)
            assert c.split_k == 1 or c.split_mode == "fixup"
            assert c.block_m == (16 if M <= 16 else 64)


def test_issue2_winners_keep_better_entries():
    probe = _probe()
    base = {"M": 256, "N": 4096, "K": 4096, "r": 16}
    cfg = KernelConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=4, split_k=4,
                       split_mode="fixup").to_dict()
    rows = [dict(base, strategy="cublas", kind="baseline", options="off", graph_us=19.0),
            dict(base, strategy="auto", kind="today", options="off", graph_us=27.0),
            dict(base, strategy="auto", kind="today", options=probe.OPTIONS_ON, graph_us=26.0),
            dict(base, strategy="kloop", kind="candidate", options=probe.OPTIONS_ON, graph_us=19.5, config=cfg,
                 label="kloop 128x256"),
            dict(base, strategy="split", kind="candidate (failed with options)", options=probe.OPTIONS_ON,
                 error="boom", config=cfg, label="split"),
            dict(base, strategy="split", kind="candidate", options="off", graph_us=21.0, config=cfg, label="split")]
    key = tuned_key(256, 4096, 4096, 16, torch.bfloat16)
    up, rep = probe.issue2_winners(rows, {key: {}})
    assert up[key]["strategy"] == "kloop" and up[key]["x_cublas"] == round(19.5 / 19.0, 3)
    assert up[key]["options"] == probe.OPTIONS_ON and rep[0]["pinned"] and rep[0]["had_entry"]
    slower = [dict(r, graph_us=30.0) if r.get("kind") == "candidate" else r for r in rows]
    up, rep = probe.issue2_winners(slower, {key: {}})
    assert not up and not rep[0]["pinned"] and rep[0]["final_x"] == round(26.0 / 19.0, 3)
    assert "| 256 | 4096 | 4096 | 16 |" in probe.issue2_md({}, rows, rep, [])


def test_issue2_parent_resumes_after_a_dead_child(monkeypatch, tmp_path):
    """A child that dies inside a point costs that point only; the next child starts after it."""
    import json
    probe = _probe()                 # puts scripts/ on sys.path
    import _childproc
    starts = []
    row = lambda i: probe.ROW_PREFIX + json.dumps(dict(
        M=probe.ISSUE2_POINTS[i][0], K=probe.ISSUE2_POINTS[i][1], N=probe.ISSUE2_POINTS[i][2],
        r=probe.ISSUE2_POINTS[i][3], label="cublas", strategy="cublas", kind="baseline", options="off",
        graph_us=10.0))

    def fake_run_child(cmd, env, limit, row_prefix=None):
        start = int(cmd[cmd.index("--start") + 1])
        starts.append(start)
        if start == 0:       # point 0 done, point 1 dies half way
            out = "\n".join(["POINT 0", row(0), "DONE 0", "POINT 1", row(1)])
            return None, out, {}, [json.loads(row(0)[len(probe.ROW_PREFIX):]), json.loads(row(1)[len(probe.ROW_PREFIX):])]
        out = "\n".join(["POINT 2", row(2), "DONE 2"])      # then the deadline
        return None, out, {}, [json.loads(row(2)[len(probe.ROW_PREFIX):])]
    monkeypatch.setattr(_childproc, "run_child", fake_run_child)
    monkeypatch.setattr(probe, "device_meta", lambda *a: {"device": "test"})
    tuned = tmp_path / "lora_h200.json"
    tuned.write_text(json.dumps({"version": 1, "lora": {"k": {"strategy": "kloop", "config": {}}}}))
    args = type("A", (), dict(budget_s=60.0, grace_s=1.0, out=tmp_path / "out", write_tuned=None,
                              warm_s=0.0, warm_workers=0))()
    assert probe.issue2_main(args, tuned_path=tuned) == 0
    assert starts == [0, 2]
    out = json.loads((tmp_path / "out" / "probe_lora_issue2.json").read_text())
    assert out["failed"][0]["point"] == list(probe.ISSUE2_POINTS[1]) and len(out["rows"]) == 3
    table = json.loads((tmp_path / "out" / "lora_h200.json").read_text())
    assert table["lora"]["k"]["strategy"] == "kloop"                  # existing entries kept


def test_issue2_point_flow_on_the_interpreter(monkeypatch):
    """The child's whole per-point flow (checks, option A/B, rank-0 row, retries) on tiny fp16 CPU
    inputs under the interpreter, with a stand-in timer: what the device run executes, minus speed."""
    probe = _probe()
    from lowrank_gemm.bench.common import Timing
    from lowrank_gemm.kernels import lora_gemm as LG

    def tiny_sets(M, N, K, r, dtype, device):
        g = torch.Generator().manual_seed(0)
        m, n, k = min(M, 20), 40, 64
        x = torch.randn(m, k, generator=g).to(dtype)
        w = (torch.randn(n, k, generator=g) / 8).to(dtype)
        a = (torch.randn(r, k, generator=g) / 8).to(dtype)
        b = torch.randn(n, r, generator=g).to(dtype)
        return [(x, w, a, b, (probe.SCALE * b).contiguous())]
    calls = []

    def fake_time(fn, sets):
        calls.append(fn)
        fn(*sets[0])
        return Timing(10.0 + len(calls), 0.0, 0.0)
    tiny = lambda s, split: KernelConfig(block_m=16, block_n=32, block_k=16, block_r=16, group_m=1, num_warps=4,
                                         num_stages=2, split_k=split, split_mode="fixup" if split > 1 else "reduce")
    monkeypatch.setattr(probe, "make_sets", tiny_sets)
    monkeypatch.setattr(probe, "time_graph", fake_time)
    monkeypatch.setattr(probe, "issue2_specs", lambda M, N, K, r, sms: [
        ("heur kloop tiny", "kloop", tiny("kloop", 2)), ("split tiny", "split", tiny("split", 2)),
        ("bad", "kloop", tiny("kloop", 1).replace(block_r=16, block_n=16))])
    real_run = LG.run_strategy
    monkeypatch.setattr(LG, "run_strategy", lambda s, *a, **k: (
        torch.zeros(a[0].shape[0], a[1].shape[0], dtype=a[0].dtype) if a[-1].block_n == 16 else real_run(s, *a, **k)))
    rows = []
    probe.issue2_point(256, 4096, 4096, 16, 132, rows.append, device="cpu", dtype=torch.float16)
    kinds = [r["kind"] for r in rows]
    assert kinds[:3] == ["baseline", "today", "today"] and kinds.count("rank0") == 1
    cand = [r for r in rows if r["kind"].startswith("candidate")]
    assert [r["label"] for r in cand][:2] == ["heur kloop tiny", "split tiny"]
    assert all(r.get("graph_us") and r["rel_err"] < 1e-2 and r["bit_identical"] for r in cand[:2])
    bad = [r for r in cand if r["label"].startswith("bad")]
    assert "wrong" in bad[0]["error"] and bad[0]["kind"] == "candidate (failed with options)"
    assert "retry, options off" in bad[1]["label"] and "wrong" in bad[1]["error"]     # retried once, off
    ab = [r for r in rows if r["kind"] == "ab"]
    assert {r["options"] for r in ab} >= {"off"} and all(r.get("graph_us") for r in ab)
    assert all(r.get("x_cublas") for r in rows if r.get("graph_us"))


def test_heuristic_decode_size_split_is_swap_ab():
    """M ≤ 16 on a GPU: split + swap_ab in the H200 winners' tiles (wide N: 128 rows × 64-wide K steps, two CTAs
    per SM; narrower N: 64 × 256); M = 64, r > 64, 8-bit inputs or a pinned kloop keep the unswapped plans."""
    s, c = heuristic_lora(1, 28672, 4096, 16, 16, gpu=True, sms=H200_SMS)
    assert (s, c.swap_ab, c.block_m, c.block_n, c.block_k, c.num_stages) == ("split", True, 16, 128, 64, 6)
    s, c = heuristic_lora(16, 8192, 8192, 64, 16, gpu=True, sms=H200_SMS)
    assert (s, c.swap_ab, c.block_n, c.block_k, c.num_stages, c.block_r) == ("split", True, 64, 256, 5, 64)
    assert can_implement(s, (16, 8192, 8192, 64), c)
    for M, r, bits, pin in ((64, 16, 16, None), (1, 128, 16, None), (1, 16, 8, None), (1, 16, 16, "kloop")):
        s, c = heuristic_lora(M, 4096, 4096, r, bits, gpu=True, sms=H200_SMS, strategy=pin)
        assert not c.swap_ab, (M, r, bits, pin)


def test_17_to_32_tokens_swap_onto_32_token_tiles():
    """16 < M ≤ 32 (16-bit, r ≤ 64, the ranks measured): split + swap_ab on 32-token tiles, the tiles the
    decode-rows probe timed, in place of a 64-row tile that is at least half TMA zero fill — also where the M = 64
    bucket holds an unswapped entry; r > 64, 8-bit inputs and M = 33 keep the unswapped plans."""
    for M, r in ((17, 16), (24, 16), (32, 16), (17, 24), (24, 64), (32, 64)):
        s, c = heuristic_lora(M, 5120, 5120, r, 16, gpu=True, sms=H200_SMS)
        assert (s, c.swap_ab, c.block_m, c.block_n, c.block_k, c.num_stages) == ("split", True, 32, 64, 256, 4)
        assert c.block_r == {16: 16, 24: 32, 64: 64}[r] and can_implement(s, (M, 5120, 5120, r), c)
    for M, r, bits in ((33, 16, 16), (32, 128, 16), (32, 16, 8), (24, 65, 16), (17, 96, 16)):
        s, c = heuristic_lora(M, 5120, 5120, r, bits, gpu=True, sms=H200_SMS)
        assert not c.swap_ab and c.block_m == 64, (M, r, bits)
    kloop = KernelConfig(block_m=64, block_n=128, block_k=64, block_r=16, num_warps=4, num_stages=6)
    assert P.swaps_past_bucket(32, 16, 16, kloop) and P.swaps_past_bucket(17, 8, 16, kloop)
    assert P.swaps_past_bucket(17, 64, 16, kloop) and not P.swaps_past_bucket(17, 65, 16, kloop)
    assert heuristic_lora(16, 5120, 5120, 64, 16, gpu=True, sms=H200_SMS)[1].swap_ab     # M ≤ 16: r ≤ 64 as before
    assert not P.swaps_past_bucket(33, 16, 16, kloop) and not P.swaps_past_bucket(16, 16, 16, kloop)
    assert not P.swaps_past_bucket(32, 128, 16, kloop) and not P.swaps_past_bucket(32, 16, 8, kloop)
    assert not P.swaps_past_bucket(32, 16, 16, kloop.replace(block_n=64, swap_ab=True, block_m=16))


def test_a_bucket_entry_gives_way_to_the_swap_plan_at_32_tokens(tmp_path):
    """The M = 64 bucket's unswapped entry serves M = 48 and M = 64 but not M = 32 (the rules' swap plan then); an
    exact-M entry is kept whatever it is."""
    entry = {"strategy": "kloop", "config": KernelConfig(block_m=64, block_n=128, block_k=64, block_r=16, num_warps=4,
                                                         num_stages=6).to_dict()}
    path = tmp_path / "lora_x.json"
    path.write_text(json.dumps({"version": 1, "lora": {P.tuned_key(64, 28672, 4096, 16, torch.bfloat16): entry}}))
    P.clear_plan_cache()
    for M in (48, 64):
        assert P.table_plan(path, M, 28672, 4096, 16, torch.bfloat16, 16, H200_SMS)[0] == "kloop"
    assert P.table_plan(path, 32, 28672, 4096, 16, torch.bfloat16, 16, H200_SMS) is None
    path.write_text(json.dumps({"version": 1, "lora": {P.tuned_key(32, 28672, 4096, 16, torch.bfloat16, exact=True):
                                                       entry}}))
    P.clear_plan_cache()
    assert P.table_plan(path, 32, 28672, 4096, 16, torch.bfloat16, 16, H200_SMS)[0] == "kloop"


def test_every_committed_lora_entry_passes_the_ledger():
    """A tuned entry the ledger rejects is skipped silently at plan time (heuristic instead), so the committed table
    must pass it: session 16's persistent r64 entries were checked against the corrected epilogue term."""
    table = json.loads((P.TUNED_DIR / "lora_h200.json").read_text())["lora"]
    assert table
    for key, entry in table.items():
        m, n, k, r = (int(p[1:]) for p in key.split("_")[:4])
        ok = can_implement(entry["strategy"], (m, n, k, r), KernelConfig.from_dict(entry["config"]))
        assert ok, f"{key}: {ok.reason}"


def test_unseen_shape_probe_candidates_and_committed_winners(tmp_path):
    """scripts/probe_lora_unseen.py: every candidate passes can_implement (the probe filters, so check none is lost
    where the families must exist), and its committed runs rebuilt from the saved rows give exactly the entries the
    tuned table holds for those shapes — the table says what was measured."""
    import argparse
    import sys
    root = P.TUNED_DIR.parents[3]
    sys.path.insert(0, str(root / "scripts"))
    import probe_lora_unseen as pu
    for M, K, N, r in ((256, 4096, 6144, 16), (64, 4096, 1024, 64), (1024, 14336, 4096, 16), (16, 4096, 14336, 64)):
        labels = [lb for lb, _, _ in pu.candidates(M, N, K, r)]
        assert len(labels) >= 3 and len(set(labels)) == len(labels), (M, K, N, r, labels)
    # the committed runs (s17/families, s18/first held-out, s18/narrow, s19's M = 128 / 256 points), replayed in
    # order into an empty table, give exactly the entries the shipped table holds for them (a later run's winner
    # replaces an earlier one's; only points at their bucket's own M pin: s19's M = 128 rows are left out)
    shipped = json.loads((P.TUNED_DIR / "lora_h200.json").read_text())
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"meta": {}, "lora": {}}))
    sizes = []
    for run in ("s17/families", "s18/first", "s18/narrow", "s19/call1/lora_narrow", "s19/call2/heldout",
                "s20/call2/heldout/ps64", "s20/call2/heldout/m256", "s20/call4/probes/m256_repin"):
        saved = json.loads((root / f"benchmarks/results/h200/probes/{run}/probe_lora_unseen.json").read_text())
        pu.report(saved["rows"], saved["meta"], saved["skipped"],
                  argparse.Namespace(out=tmp_path, margin=0.03, write_tuned=table))
        sizes.append(len(json.loads((tmp_path / "lora_h200_updates.json").read_text())))
    got = json.loads(table.read_text())["lora"]
    # s18/narrow re-pinned two s17 cells (M=256, 4096→1024); s20 replaced seven (persistent on 64-row tiles)
    assert sizes == [23, 11, 7, 3, 1, 4, 2, 2] and len(got) == 44
    assert got["m256_n4096_k4096_r16_bfloat16"]["config"]["block_n"] == 128      # M=256's winner, not M=128's
    assert got["m256_n4096_k4096_r16_bfloat16"]["config"]["split_k"] == 1
    assert got["m256_n4096_k4096_r64_bfloat16"]["strategy"] == "persistent_static"
    assert all(shipped["lora"][k] == v for k, v in got.items())
    assert all(v["strategy"] not in ("torch_unfused", "kcat") for v in got.values())
    # narrow N: one-launch candidates and kcat, which never enters the table (unpacked weights would keep a copy)
    labels = [lb for lb, _, _ in pu.candidates(256, 1024, 4096, 64)]
    assert {"kl_128x64_fx4", "kl_64x64_fx2", "sp_128x64_fx4", "kcat"} <= set(labels)
    saved = json.loads((root / "benchmarks/results/h200/probes/s18/first/probe_lora_unseen.json").read_text())
    point = [x for x in saved["rows"] if (x["M"], x["N"], x["K"], x["r"]) == (256, 18944, 3584, 16)]
    fastest = dict(point[-1], label="kcat", strategy="kcat", graph_us=1.0)
    table.write_text(json.dumps({"meta": {}, "lora": {}}))
    pu.report(point + [fastest], saved["meta"], [], argparse.Namespace(out=tmp_path, margin=0.03, write_tuned=table))
    assert all(v["strategy"] != "kcat" for v in json.loads(table.read_text())["lora"].values())
