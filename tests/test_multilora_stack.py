"""Stacked bank mode: a batch of a few adapters on the single-adapter kernels (``lora_gemm.run_bank(stack_d=D)``),
CPU interpreter.

The caller's hint (``max_adapters`` = 2 … 4) routes a batch of M ≤ 64 rows to the LoRA table's kloop / split plan of
rank D·r_max: every program serves the batch's D largest valid ids as one stacked rank (A rows gathered from the
bank, S masked per row to its own adapter, one stacked B tile). The hint is trusted for speed only: rows of more
adapters than D must come out exact, as must base-only rows, ranks below r_max with NaN past them, fewer adapters
than D, and each launch variant the plans use (whole tiles, swap-AB with its prefetched epilogue, in-grid S
producers).
"""

import pytest
import torch

from lowrank_gemm.kernels import lora_gemm as LG
from lowrank_gemm.kernels import multilora_gemm as mg
from lowrank_gemm.plan.config import KernelConfig

from test_lora_gemm import poisoned_workspaces  # noqa: F401  (fixture)
from test_multilora_gemm import DT, assert_base_rows_equal, assert_close, clean, make_case, ref_of

CFG = KernelConfig(block_m=16, block_n=32, block_k=16, block_r=64, group_m=2, num_warps=4, num_stages=2)

VARIANTS = {
    "kloop": ("kloop", CFG),
    "kloop swap-AB": ("kloop", CFG.replace(block_n=64, swap_ab=True)),
    "split": ("split", CFG),
    "split swap-AB": ("split", CFG.replace(block_n=64, swap_ab=True)),
    "split S producers": ("split", CFG.replace(s_producers=3)),
    "split swap-AB S producers": ("split", CFG.replace(block_n=64, swap_ab=True, s_producers=2)),
}


def stack_case(M, N, K, L, r_max, ids, seed=0, ranks=None, bias=True):
    case = make_case(M, N, K, L, r_max, ranks=ranks, seed=seed, bias=bias)
    case["adapter_ids"] = torch.as_tensor(ids, dtype=torch.int32)
    return case


def run_stack(case, strategy, cfg, d, **kw):
    M, N = case["x"].shape[0], case["weight"].shape[0]
    out = torch.full((M, N), float("nan"), dtype=DT)
    return LG.run_bank(strategy, cfg, case["x"], case["weight"], case["bank_a"], case["bank_b"], case["ranks"],
                       case["scales"], case["adapter_ids"], case["bias"], out=out, stack_d=d, **kw)


def mixed_ids(M, adapters, seed, base_frac=0.25):
    """M ids drawn from ``adapters`` (each present at least once when M allows), some rows −1 (at least one when M
    allows)."""
    g = torch.Generator().manual_seed(seed)
    adapters = torch.as_tensor(adapters, dtype=torch.int32)
    ids = adapters[torch.randint(0, len(adapters), (M,), generator=g)]
    ids[: min(M, len(adapters))] = adapters[: min(M, len(adapters))]
    ids = torch.where(torch.rand(M, generator=g) < base_frac, -1, ids)
    ids[: min(M, len(adapters))] = adapters[: min(M, len(adapters))]
    if M > len(adapters):
        ids[len(adapters)] = -1
    return ids[torch.randperm(M, generator=g)].to(torch.int32)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("M,N,K,r_max,d,adapters", [(37, 70, 88, 16, 4, [0, 2, 3, 5]), (5, 150, 72, 16, 2, [4, 1]),
                                                    (64, 33, 48, 32, 2, [1, 3]), (16, 40, 40, 16, 4, [2, 5])])
def test_stacked_matches_reference(variant, M, N, K, r_max, d, adapters, poisoned_workspaces):
    """D adapters (or fewer: the last case holds two of four) of mixed ranks, NaN past each rank (b_clean=False),
    base-only rows: the reference, −1 rows equal the base product, bit-identical on repeat."""
    strategy, cfg = VARIANTS[variant]
    case = stack_case(M, N, K, 6, r_max, mixed_ids(M, adapters, M + d), seed=M,
                      ranks=[r_max, 1, 7, r_max, 0, 5][:6])
    y = run_stack(case, strategy, cfg, d)
    assert_close(y, ref_of(case))
    base = run_stack(case, strategy, cfg, d, has_lora=False)
    rows = case["adapter_ids"] == -1
    assert_base_rows_equal(y[rows], base[rows], variant)
    assert torch.equal(y, run_stack(case, strategy, cfg, d)), "repeat not bit-identical"


@pytest.mark.parametrize("variant", ["kloop", "split", "split swap-AB S producers", "kloop swap-AB"])
def test_more_adapters_than_the_hint_stay_exact(variant, poisoned_workspaces):
    """Five adapters where the caller promised at most two: the two largest ids are served stacked, rows of the other
    three (the smallest ids, spread over several row blocks) go through the slow exact path."""
    strategy, cfg = VARIANTS[variant]
    M, N, K = 37, 70, 88
    case = stack_case(M, N, K, 6, 16, mixed_ids(M, [0, 1, 2, 4, 5], 3), seed=11, ranks=[16, 9, 4, 13, 16, 2])
    assert_close(run_stack(case, strategy, cfg, 2), ref_of(case))


@pytest.mark.parametrize("strategy", ["kloop", "split"])
def test_stacked_all_rows_base_only_and_out_of_range(strategy, poisoned_workspaces):
    case = stack_case(20, 70, 48, 3, 16, torch.full((20,), -1), seed=2)
    y = run_stack(case, strategy, CFG, 4)
    assert_close(y, ref_of(case))
    assert_base_rows_equal(y, run_stack(case, strategy, CFG, 4, has_lora=False), strategy)
    ids = mixed_ids(16, [0, 2], 3)
    ids[2], ids[9] = 7, -5                     # L = 3: 7 and −5 are not adapters
    case = stack_case(16, 40, 32, 3, 16, ids, seed=4)
    y = run_stack(case, strategy, CFG, 2)
    case["adapter_ids"] = torch.where((ids >= 0) & (ids < 3), ids, -1)
    assert_close(y, ref_of(case))


@pytest.mark.parametrize("variant", ["kloop", "split swap-AB S producers"])
def test_clean_bank_stacked_equals_masked(variant, poisoned_workspaces):
    """b_clean (AdapterBank: zero past each rank) gives the same bits as the rank-masked dirty path on the same
    values, and the reference."""
    strategy, cfg = VARIANTS[variant]
    case = stack_case(37, 70, 88, 5, 16, mixed_ids(37, [0, 1, 3, 4], 9), seed=12, ranks=[16, 13, 5, 16, 3])
    case["bank_a"], case["bank_b"] = clean(case)
    y = run_stack(case, strategy, cfg, 4, b_clean=True)
    assert_close(y, ref_of(case))
    assert torch.equal(y, run_stack(case, strategy, cfg, 4))


def test_scattered_b_takes_the_scalar_gather(poisoned_workspaces):
    """A bank_b whose rank stride is not 1 cannot use the 16-B vector gather (B_VEC): still exact."""
    case = stack_case(24, 40, 32, 4, 16, mixed_ids(24, [0, 1, 3], 5), seed=8, ranks=[16, 8, 3, 12])
    b = case["bank_b"]
    case["bank_b"] = b.transpose(1, 2).contiguous().transpose(1, 2)
    assert not LG._stack_b_vec(case["bank_b"]) and LG._stack_b_vec(b)
    assert_close(run_stack(case, "kloop", CFG, 4), ref_of(case))


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("d,adapters,r_max,block_r", [(4, [0, 2, 3, 5], 16, 16), (8, [0, 1, 2, 3, 5, 6, 7], 16, 32),
                                                      (16, [1, 3, 5, 7, 9, 11, 12, 13, 14], 16, 64),
                                                      (8, [2, 4, 6, 8, 9], 32, 64)])
def test_stacked_rank_in_chunks(d, adapters, r_max, block_r, swap, poisoned_workspaces):
    """A stacked rank above the plan's block_r (split, no S producers): the epilogue walks it in block_r chunks, D > 4
    picks its ids in one pass (adapter_rows.stack_order); mixed ranks with NaN past them, −1 rows equal the base
    product, a wrong hint (more adapters than D) stays exact."""
    cfg = CFG.replace(block_r=block_r, **({"block_n": 64, "swap_ab": True} if swap else {}))
    M, N, K = 37, 70, 88
    ranks = [r_max, 1, 7, r_max, 0, 5, 3, r_max, 2, 9, 4, 6, 8, r_max, 11, 1][:16]
    case = stack_case(M, N, K, 16, r_max, mixed_ids(M, adapters, d), seed=d, ranks=[min(v, r_max) for v in ranks])
    y = run_stack(case, "split", cfg, d)
    assert_close(y, ref_of(case))
    base = run_stack(case, "split", cfg, d, has_lora=False)
    rows = case["adapter_ids"] == -1
    assert_base_rows_equal(y[rows], base[rows], "chunks")
    assert torch.equal(y, run_stack(case, "split", cfg, d)), "repeat not bit-identical"
    assert_close(run_stack(case, "split", cfg, max(2, d // 4)), ref_of(case))      # hint too small: stragglers


def test_stack_wide_plan_is_opt_in(monkeypatch):
    """D·r_max above 64 is routed only with LOWRANK_GEMM_ML_STACK_WIDE=1 (not measured yet): then the rank-64 plan
    as split, S producers dropped, up to 16 adapters and a stacked rank of 256."""
    dev, bf = torch.device("cpu"), torch.bfloat16
    assert LG.stack_plan(16, 4096, 4096, 16, 16, bf, dev) is None
    monkeypatch.setenv("LOWRANK_GEMM_ML_STACK_WIDE", "1")
    strategy, cfg, d = LG.stack_plan(16, 4096, 4096, 16, 16, bf, dev)
    assert (strategy, d, cfg.s_producers, cfg.split_k) == ("split", 16, 0, 1)
    assert LG.stack_plan(16, 4096, 4096, 64, 4, bf, dev)[2] == 4
    assert LG.stack_plan(16, 4096, 4096, 64, 5, bf, dev) is None          # 8 × 64 > 256
    assert LG.stack_plan(16, 4096, 4096, 16, 17, bf, dev) is None         # 32 adapters > 16


def test_run_bank_rejects_plans_stacking_cannot_run():
    case = stack_case(16, 40, 32, 3, 16, mixed_ids(16, [0, 1], 1), seed=1)
    for strategy, cfg in (("persistent_static", CFG), ("kloop", CFG.replace(split_k=2, split_mode="fixup")),
                          ("kloop", CFG.replace(block_r=16)), ("split", CFG.replace(block_r=16, s_producers=2))):
        with pytest.raises(ValueError, match="stacked bank mode"):
            run_stack(case, strategy, cfg, 2)


def test_stack_plan_scope():
    """2–4 adapters of r_max 16/32 (D·r_max ≤ 64) at M ≤ 64, on kloop / split plans of whole tiles that hold the
    stacked rank; nothing else."""
    dev, bf = torch.device("cpu"), torch.bfloat16
    got = LG.stack_plan(16, 4096, 4096, 16, 3, bf, dev)
    assert got is not None and got[2] == 4 and got[0] in LG.STACK_STRATEGIES
    assert got[1].split_k == 1 and got[1].block_r >= 64
    assert LG.stack_plan(64, 4096, 4096, 32, 2, bf, dev)[2] == 2
    for args in ((16, 4096, 4096, 16, 1), (16, 4096, 4096, 16, 5), (16, 4096, 4096, 32, 3),
                 (16, 4096, 4096, 8, 2), (16, 4096, 4096, 24, 2), (65, 4096, 4096, 16, 2),
                 (16, 4096, 4100, 16, 2)):
        assert LG.stack_plan(*args, bf, dev) is None, args


def test_stack_plan_moves_narrow_kloop_tiles_to_split(monkeypatch):
    """Where the LoRA table's kloop plan has an N tile narrower than the stacked rank (every program would gather
    more A rows than W rows each K step), stacked mode runs split on the same output tile, K steps of 256, the
    deepest pipeline the ledger fits (H200: N = K = 4096, M = 64, four r16 adapters, 19.3 → 17.8 µs)."""
    kloop = KernelConfig(block_m=64, block_n=32, block_k=128, block_r=64, group_m=1, num_warps=4, num_stages=5)
    monkeypatch.setattr(LG, "bank_plan", lambda *a: ("kloop", kloop))
    strategy, cfg, d = LG.stack_plan(64, 4096, 4096, 16, 4, torch.bfloat16, torch.device("cpu"))
    assert (strategy, d) == ("split", 4)
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_stages) == (64, 32, 256, 4)
    assert LG.stack_plan(64, 4096, 4096, 16, 2, torch.bfloat16, torch.device("cpu"))[0] == "kloop"   # 32 rows
    wide = kloop.replace(block_n=128)
    monkeypatch.setattr(LG, "bank_plan", lambda *a: ("kloop", wide))
    assert LG.stack_plan(64, 4096, 4096, 16, 4, torch.bfloat16, torch.device("cpu"))[:2] == ("kloop", wide)


def test_multi_lora_gemm_routes_few_adapter_batches(monkeypatch):
    """max_adapters 2–4 runs stacked bank mode; more adapters, the switch and an explicit plan keep the multi-LoRA
    kernels, with the same result."""
    seen = []
    real = LG.run_bank
    monkeypatch.setattr(mg, "run_bank", lambda *a, **k: seen.append(k.get("stack_d")) or real(*a, **k))
    case = stack_case(24, 48, 64, 5, 16, mixed_ids(24, [0, 1, 4], 5), seed=6)

    def call(adapters, **kw):
        n = len(seen)
        y = mg.multi_lora_gemm(**case, adapters=adapters, **kw)
        return y, seen[-1] if len(seen) > n else None

    y, d = call(3)
    assert d == 4
    assert_close(y, ref_of(case))
    y2, d = call(2)                 # a wrong hint: still exact
    assert d == 2
    assert_close(y2, ref_of(case))
    y_multi, d = call(16)
    assert d is None
    torch.testing.assert_close(y, y_multi, atol=2e-2, rtol=1e-2)
    assert call(3, plan=mg.heuristic_plan(24, 48, 64, 16, 5, "gather", 4))[1] is None
    monkeypatch.setenv("LOWRANK_GEMM_ML_STACK", "0")
    assert call(3)[1] is None
    monkeypatch.setenv("LOWRANK_GEMM_ML_BANK", "0")
    assert call(3)[1] is None


BANK_SIG = {"ids_ptr": "*i32", "ranks_ptr": "*i32", "scales_ptr": "*fp32", "x_ptr": "*bf16", "bank_a_ptr": "*bf16",
            "L": "i32", "R_MAX": "i32", "stride_xm": "i32", "stride_al": "i32", "stride_ar": "i32", "stride_bl": "i32"}
# what a launch specializes (16-B aligned pointers, sizes and strides a multiple of 16): without it ptxas sees
# other address arithmetic and reports spills the launched kernel does not have (session 21)
BANK_ALIGNED = ("b_ptr", "bias_ptr", "y_ptr", "s_ptr", "N", "K", "R", "stride_bn", "stride_ym", "stride_sm",
                "stride_sk", "bank_a_ptr", "stride_al", "stride_ar", "stride_bl", "x_ptr", "stride_xm")


@pytest.mark.parametrize("plan", ["28672 M16 kloop swap", "4096 M64 split", "4096 M16 split swap, rank chunks"])
def test_aot_stacked_main_kernel(plan):
    """sm_90, three stacked plans as routed on the H200 (N = 28672 M = 16: the table's rank-64 kloop swap plan; N = 4096
    M = 64: split 64×32×256; N = 4096 M = 16, 16 adapters: the opt-in rank chunks): the K loop stays wgmma on TMA
    tiles of X and W, a kloop plan gathers A by cp.async, ptxas reports no spill, and the shared memory is no more
    than the one-adapter bank kernel's at the same plan (which the SMEM ledger admitted)."""
    from test_lora_gemm import MAIN_FLAGS, MOD, main_signature
    from lowrank_gemm.kernels.aot import compile_sm90
    from _sm90 import ptxas_stats
    cfg, lowrank, flags, stack, chunks = {
        "28672 M16 kloop swap": (KernelConfig(block_m=16, block_n=128, block_k=128, block_r=64, num_stages=4), 1,
                                 dict(SWAP_AB=True, EPI_PREFETCH=True), dict(STACK_D=4, STACK_R=16), 1),
        "4096 M64 split": (KernelConfig(block_m=64, block_n=32, block_k=256, block_r=64, num_stages=4), 2,
                           dict(PDL=True), dict(STACK_D=4, STACK_R=16), 1),
        "4096 M16 split swap, rank chunks": (KernelConfig(block_m=16, block_n=64, block_k=256, block_r=64,
                                                          num_stages=5), 2, dict(SWAP_AB=True, PDL=True),
                                             dict(STACK_D=16, STACK_R=16), 4),
    }[plan]
    sig = dict(main_signature(cfg.block_m, cfg.block_n, cfg.block_k, cfg.block_r), **BANK_SIG)
    consts = dict(MAIN_FLAGS, HAS_BIAS=True, **flags)

    def compile_(**extra):
        return compile_sm90(MOD, "lora_main_kernel", sig,
                            dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, BLOCK_R=cfg.block_r,
                                 GROUP_M=1, LOWRANK=lowrank, PARTIAL=False, BANK=True, ID_BLOCK=64,
                                 **{**consts, "R_CHUNKS": chunks, **extra}),
                            aligned=[a for a in BANK_ALIGNED if a in sig], num_warps=4, num_stages=cfg.num_stages)
    stacked = compile_(**stack, B_VEC=True)
    assert stacked.has("wgmma.mma_async", "cp.async.bulk.tensor")
    if lowrank == 1:
        assert "cp.async.cg.shared.global" in stacked.ptx          # the gathered A rows
    stats = ptxas_stats(stacked.ptx)
    if stats is not None:
        assert stats[1] == 0, f"{plan}: {stats[1]} B of spill stores"
    one = compile_(**({"EPI_PREFETCH": False} if chunks > 1 else {}), **{"R_CHUNKS": 1})
    assert stacked.shared <= one.shared, (stacked.shared, one.shared)
