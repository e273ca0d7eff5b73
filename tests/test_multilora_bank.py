"""One-adapter multi-LoRA batches on the single-adapter kernels (bank mode, ``lora_gemm.run_bank``), CPU interpreter.

The caller's hint (``max_adapters=1``) routes a batch of M ≤ 256 rows to the LoRA table's split / kloop / persistent
plans, which pick the adapter on the device. The hint is trusted for speed only: rows of other adapters must still
come out exact, as must base-only rows, ranks below r_max with garbage past them, and every launch variant the plans
use (whole tiles, FIXUP split-K, swap-AB with its prefetched epilogue, in-grid S producers, static and dynamic
persistent schedules).
"""

import pytest
import torch

from lowrank_gemm.kernels import lora_gemm as LG
from lowrank_gemm.kernels import multilora_gemm as mg
from lowrank_gemm.plan.config import KernelConfig

from test_lora_gemm import poisoned_workspaces  # noqa: F401  (fixture)
from test_multilora_gemm import DT, assert_base_rows_equal, assert_close, clean, make_case, ref_of

CFG = KernelConfig(block_m=16, block_n=32, block_k=16, block_r=16, group_m=2, num_warps=4, num_stages=2)

VARIANTS = {
    "kloop": ("kloop", CFG),
    "kloop fixup": ("kloop", CFG.replace(split_k=3, split_mode="fixup")),
    "kloop swap-AB": ("kloop", CFG.replace(block_n=64, block_r=64, swap_ab=True)),
    "split": ("split", CFG),
    "split fixup": ("split", CFG.replace(split_k=2, split_mode="fixup")),
    "split swap-AB": ("split", CFG.replace(block_n=64, swap_ab=True)),
    "split S producers": ("split", CFG.replace(s_producers=3)),
    "split swap-AB S producers": ("split", CFG.replace(block_n=64, swap_ab=True, s_producers=2)),
    "persistent_static": ("persistent_static", CFG),
    "persistent_dynamic": ("persistent_dynamic", CFG),
}


def one_adapter_case(M, N, K, L, r_max, ids, seed=0, ranks=None, bias=True):
    case = make_case(M, N, K, L, r_max, ranks=ranks, seed=seed, bias=bias)
    case["adapter_ids"] = torch.as_tensor(ids, dtype=torch.int32)
    return case


def run_bank(case, strategy, cfg, **kw):
    """Dirty banks (NaN past each rank) run with b_clean=False; :func:`test_clean_bank_keeps_the_rank_exact` runs
    the b_clean=True masks."""
    M, N = case["x"].shape[0], case["weight"].shape[0]
    out = torch.full((M, N), float("nan"), dtype=DT)
    return LG.run_bank(strategy, cfg, case["x"], case["weight"], case["bank_a"], case["bank_b"], case["ranks"],
                       case["scales"], case["adapter_ids"], case["bias"], out=out, **kw)


def ids_of(M, hold, seed, others=()):
    """M ids: adapter ``hold`` with some −1 rows, plus the (row, id) pairs of ``others``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.where(torch.rand(M, generator=g) < 0.3, -1, hold).to(torch.int32)
    for row, i in others:
        ids[row] = i
    return ids


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("M,N,K,r_max,rank", [(37, 70, 88, 16, 11), (5, 150, 72, 40, 40), (64, 33, 48, 8, 3),
                                              (200, 40, 32, 16, 16)])
def test_one_adapter_matches_reference(variant, M, N, K, r_max, rank, poisoned_workspaces):
    strategy, cfg = VARIANTS[variant]
    cfg = cfg.replace(block_r=max(cfg.block_r, mg.rank_block(r_max)))
    case = one_adapter_case(M, N, K, 4, r_max, ids_of(M, 2, M), seed=M, ranks=[r_max, 1, rank, 0])
    y = run_bank(case, strategy, cfg)
    assert_close(y, ref_of(case))
    base = run_bank(case, strategy, cfg, has_lora=False)
    rows = case["adapter_ids"] == -1
    assert_base_rows_equal(y[rows], base[rows], variant)
    assert torch.equal(y, run_bank(case, strategy, cfg)), "repeat not bit-identical"


@pytest.mark.parametrize("variant", ["kloop", "kloop fixup", "split", "split S producers", "split swap-AB",
                                     "persistent_static", "persistent_dynamic"])
def test_wrong_hint_stays_exact(variant, poisoned_workspaces):
    """Three adapters where the caller promised one: rows of the two the kernel does not serve (one of them in
    several row blocks, one block holding three adapters) go through the slow exact path."""
    strategy, cfg = VARIANTS[variant]
    M, N, K = 37, 70, 88
    ids = ids_of(M, 3, 7, others=[(0, 1), (5, 1), (20, 0), (36, 1)])
    case = one_adapter_case(M, N, K, 5, 16, ids, seed=11, ranks=[16, 9, 4, 13, 16])
    assert_close(run_bank(case, strategy, cfg), ref_of(case))


@pytest.mark.parametrize("strategy", ["kloop", "split", "persistent_static"])
def test_all_rows_base_only(strategy, poisoned_workspaces):
    case = one_adapter_case(20, 70, 48, 3, 16, torch.full((20,), -1), seed=2)
    y = run_bank(case, strategy, CFG)
    assert_close(y, ref_of(case))
    assert_base_rows_equal(y, run_bank(case, strategy, CFG, has_lora=False), strategy)


def test_out_of_range_ids_read_as_base_only(poisoned_workspaces):
    ids = ids_of(16, 1, 3, others=[(2, 7), (9, -5)])       # L = 3: 7 and −5 are not adapters
    case = one_adapter_case(16, 40, 32, 3, 16, ids, seed=4)
    y = run_bank(case, "kloop", CFG)
    case["adapter_ids"] = torch.where((ids >= 0) & (ids < 3), ids, -1)
    assert_close(y, ref_of(case))


def test_multi_lora_gemm_routes_one_adapter_batches(monkeypatch):
    """max_adapters=1 at M ≤ BANK_MAX_M runs bank mode (through the LoRA planner's plan), otherwise the multi-LoRA
    kernels; the switch, a larger M, a bank that is not contiguous and an explicit plan all keep them."""
    seen = []
    real = LG.run_bank
    monkeypatch.setattr(mg, "run_bank", lambda *a, **k: seen.append(a[:2]) or real(*a, **k))
    case = one_adapter_case(24, 48, 64, 4, 16, ids_of(24, 1, 5), seed=6)

    def call(**kw):
        n = len(seen)
        y = mg.multi_lora_gemm(**{**case, **kw.pop("case", {})}, adapters=kw.pop("adapters", 1), **kw)
        return y, len(seen) > n

    y, routed = call()
    assert routed and seen[-1][0] in LG.BANK_STRATEGIES
    assert_close(y, ref_of(case))
    y_multi, routed = call(adapters=16)         # 2–4 adapters take stacked bank mode (test_multilora_stack.py)
    assert not routed
    torch.testing.assert_close(y, y_multi, atol=2e-2, rtol=1e-2)
    assert call(plan=mg.heuristic_plan(24, 48, 64, 16, 4, "gather", 4))[1] is False
    assert call(case=dict(bank_a=case["bank_a"].transpose(1, 2).contiguous().transpose(1, 2)))[1] is False
    shifted = torch.empty(case["bank_a"].numel() + 1, dtype=DT)[1:].view(case["bank_a"].shape)
    shifted.copy_(case["bank_a"])                   # contiguous, but its base is 2 B off a 16-B boundary: no TMA
    assert call(case=dict(bank_a=shifted))[1] is False
    monkeypatch.setenv("LOWRANK_GEMM_ML_BANK", "0")
    assert call()[1] is False
    monkeypatch.delenv("LOWRANK_GEMM_ML_BANK")
    big = one_adapter_case(LG.BANK_MAX_M + 1, 48, 64, 4, 16, ids_of(LG.BANK_MAX_M + 1, 1, 5), seed=6)
    n = len(seen)
    mg.multi_lora_gemm(**big, adapters=1)
    assert len(seen) == n


def test_bank_plan_scope():
    """Bank mode takes split / kloop / persistent plans (no two-launch reduce), M ≤ BANK_MAX_M, 16-B aligned K
    rows."""
    dev = torch.device("cpu")
    assert LG.bank_plan(LG.BANK_MAX_M + 1, 4096, 4096, 16, torch.bfloat16, dev) is None
    assert LG.bank_plan(16, 4096, 4100, 16, torch.bfloat16, dev) is None       # 8200-B rows: not 16-B aligned
    got = LG.bank_plan(16, 4096, 4096, 16, torch.bfloat16, dev)
    assert got is not None and got[0] in LG.BANK_STRATEGIES
    assert got[1].split_k == 1 or got[1].split_mode == "fixup"


def test_aot_bank_main_kernel_keeps_wgmma_tma_and_smem():
    """sm_90, the H200 table's M=64 4096² r16 plan (kloop 64×32×256, 4 stages, 229 KB): the bank-mode main kernel
    still runs its K loop as wgmma on TMA tiles (the A rows come from the bank by TMA at the picked slot), and the
    straggler path after the loop adds no shared memory (it reuses the dead pipeline buffers), so every plan the
    SMEM ledger admits stays launchable in bank mode."""
    from test_lora_gemm import MAIN_FLAGS, MOD, compile_main, main_signature
    from lowrank_gemm.kernels.aot import compile_sm90
    c = KernelConfig(block_m=64, block_n=32, block_k=256, block_r=16, num_warps=4, num_stages=4)
    sig = dict(main_signature(c.block_m, c.block_n, c.block_k, c.block_r))
    sig.update({"ids_ptr": "*i32", "ranks_ptr": "*i32", "scales_ptr": "*fp32", "x_ptr": "*bf16",
                "bank_a_ptr": "*bf16", "L": "i32", "R_MAX": "i32", "stride_xm": "i32", "stride_al": "i32",
                "stride_ar": "i32", "stride_bl": "i32"})
    bank = compile_sm90(MOD, "lora_main_kernel", sig,
                        dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, BLOCK_R=c.block_r,
                             GROUP_M=c.group_m, LOWRANK=1, PARTIAL=False, R_CHUNKS=1, HAS_BIAS=True, BANK=True,
                             ID_BLOCK=64, **MAIN_FLAGS),
                        num_warps=c.num_warps, num_stages=c.num_stages)
    assert bank.has("wgmma.mma_async", "cp.async.bulk.tensor")
    assert bank.shared == compile_main(c, 1).shared


@pytest.mark.parametrize("variant", ["kloop", "split", "split swap-AB S producers", "persistent_static",
                                     "kloop fixup"])
def test_clean_bank_keeps_the_rank_exact(variant, poisoned_workspaces):
    """b_clean (AdapterBank: A and B zero past each rank): loads keep the launch's R_MAX masks and the rank only
    zeroes S; ranks below R_MAX come out exact and bit-equal to the rank-masked loads."""
    strategy, cfg = VARIANTS[variant]
    M, N, K = 37, 70, 88
    case = one_adapter_case(M, N, K, 4, 32, ids_of(M, 1, 9), seed=12, ranks=[32, 13, 5, 32])
    a, b = clean(case)
    case["bank_a"], case["bank_b"] = a, b
    y = run_bank(case, strategy, cfg.replace(block_r=32), b_clean=True)
    assert_close(y, ref_of(case))
    assert torch.equal(y, run_bank(case, strategy, cfg.replace(block_r=32), b_clean=False))
