"""The LoRA family's SMEM ledger: each term, and the total against Triton's compiled ``shared``.

Tolerance vs the compiler: 1 KiB. Triton 3.6 allocates exactly one buffer per stage per TMA load
plus 8-byte mbarriers, and reuses pipeline memory for the epilogue's operand tiles (liveness), so
the ledger is exact today; the slack covers alignment padding of a future allocator change. A
ledger that counts one stage too many (≥ 8 KiB for the smallest tile here) fails the check —
``test_ledger_check_can_fail`` proves it.
"""

import pytest

from lowrank_gemm.kernels import _lora_kernels as K_
from lowrank_gemm.kernels._lora_kernels import smem_ledger
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.plan.smem import SM90_SMEM_LIMIT

from test_lora_gemm import compile_main, compile_persistent, compile_streamk

TOL_BYTES = 1024
CFG = KernelConfig(block_m=64, block_n=128, block_k=128, block_r=16, num_warps=4, num_stages=4)


def test_kloop_terms():
    L = smem_ledger(CFG, 16, "kloop")
    assert L.term("main X tile").total(1) == 4 * 64 * 128 * 2
    assert L.term("main W tile").total(1) == 4 * 128 * 128 * 2
    assert L.term("lowrank A tile").total(1) == 4 * 16 * 128 * 2
    assert L.term("TMA barriers").total(1) == 4 * 2 * 8          # A load is its own TMA group
    assert L.term("epilogue B/S tiles extra").total(1) == 0     # fits inside the freed pipeline
    assert L.total() == 4 * (64 + 128 + 16) * 128 * 2 + 64


def test_streamk_terms_are_kloops():
    # same K loop (X, W, A tiles, A its own TMA group) and epilogue operands; the partial/reduce
    # path goes through global memory (no SMEM term)
    assert smem_ledger(CFG, 16, "streamk").terms == smem_ledger(CFG, 16, "kloop").terms


def test_split_and_base_terms():
    L = smem_ledger(CFG, 16, "split")
    with pytest.raises(KeyError):
        L.term("lowrank A tile")
    assert L.term("TMA barriers").total(1) == 4 * 8
    base = smem_ledger(CFG, 16, "merged")
    assert base.total() == 4 * (64 + 128) * 128 * 2 + 32
    with pytest.raises(KeyError):
        base.term("epilogue B/S tiles extra")


def test_epilogue_extra_only_beyond_pipeline():
    # one shallow stage of a tiny K tile: the B [128, 128] + S [64, 128] tiles outgrow it
    c = KernelConfig(block_m=64, block_n=128, block_k=16, block_r=128, num_stages=1)
    L = smem_ledger(c, 16, "split")
    pipeline = (64 + 128) * 16 * 2
    assert L.term("epilogue B/S tiles extra").bytes_each == (128 * 128 + 64 * 128) * 2 - pipeline


def test_persistent_s_phase_extra():
    c = CFG.replace(block_n=16, block_r=64)          # S-phase X+A tiles larger than X+W
    L = smem_ledger(c, 16, "persistent_static")
    assert L.term("S-phase pipeline extra").bytes_each == 4 * (64 - 16) * 128 * 2
    assert smem_ledger(CFG, 16, "persistent_static").term("S-phase pipeline extra").bytes_each == 0


def test_persistent_epilogue_buffers_extra():
    # the compiler multi-buffers the persistent epilogue's loads: S fp32 [BM, BR] × (st − 1), B [BR, BN] × st
    c = CFG.replace(block_m=128, block_n=128, block_k=64, block_r=64, num_stages=4)
    L = smem_ledger(c, 16, "persistent_static")
    epi = 3 * 128 * 64 * 4 + 4 * 64 * 128 * 2
    assert L.term("epilogue S/B buffers extra").bytes_each == epi - 4 * (128 + 128) * 64 * 2
    assert L.total() == epi + 4 * 8

    def extra(cfg):
        return smem_ledger(cfg, 16, "persistent_static").term("epilogue S/B buffers extra").bytes_each
    assert extra(c.replace(block_r=16)) == 0          # rank 16: both buffers fit inside the freed K pipelines
    # 256x128 r64, 4 stages: 256 KiB — rejected before launch (on the H200 it failed with OutOfResources, session 16)
    big = c.replace(block_m=256, num_warps=8)
    assert smem_ledger(big, 16, "persistent_static").total() == 262144 + 32
    assert not smem_ledger(big, 16, "persistent_static").fits()
    # epi_stages=1: one buffer each, shared with the K pipelines; 2: one S, two B
    assert smem_ledger(big.replace(epi_stages=1), 16, "persistent_static").total() == 196608 + 32
    assert extra(c.replace(epi_stages=2)) == 0
    with pytest.raises(KeyError):      # the other kernels' epilogue tiles are not this term
        smem_ledger(c, 16, "split").term("epilogue S/B buffers extra")


def test_limit_and_fp8_bits():
    too_deep = CFG.replace(num_stages=6)
    assert not smem_ledger(too_deep, 16, "kloop").fits()
    assert smem_ledger(too_deep, 8, "kloop").total() < smem_ledger(too_deep, 16, "kloop").total()
    assert smem_ledger(CFG, 16, "kloop").limit == SM90_SMEM_LIMIT


COMPILED = [
    ("kloop", CFG, lambda c: compile_main(c, K_.LOWRANK_KLOOP)),
    ("kloop", CFG.replace(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3),
     lambda c: compile_main(c, K_.LOWRANK_KLOOP)),
    ("split", CFG.replace(block_m=128, block_k=64, block_r=64, num_stages=3),
     lambda c: compile_main(c, K_.LOWRANK_GLOBAL)),
    ("merged", CFG.replace(num_stages=5), lambda c: compile_main(c, K_.LOWRANK_NONE)),
    ("persistent_dynamic", CFG.replace(block_m=128, block_k=64, num_stages=3),
     lambda c: compile_persistent(c, True)),
    # rank 64: the epilogue's multi-buffered S/B loads outgrow the K pipelines (the session-16 probe's tiles)
    ("persistent_static", CFG.replace(block_m=128, block_n=256, block_k=64, block_r=64, num_warps=8, num_stages=4),
     lambda c: compile_persistent(c, False)),
    ("persistent_static", CFG.replace(block_m=128, block_n=128, block_k=64, block_r=64, num_stages=3),
     lambda c: compile_persistent(c, False)),
    ("persistent_static", CFG.replace(block_m=256, block_n=128, block_k=64, block_r=16, num_warps=8, num_stages=4),
     lambda c: compile_persistent(c, False)),
    # epi_stages=1: one S and one B buffer, inside the K pipelines again (256x128 r64 4 stages fits: 196 640 B)
    ("persistent_static", CFG.replace(block_m=256, block_n=128, block_k=64, block_r=64, num_warps=8, num_stages=4,
                                      epi_stages=1), lambda c: compile_persistent(c, False)),
    ("persistent_dynamic",
     CFG.replace(block_m=128, block_n=128, block_k=64, block_r=64, num_stages=4, epi_stages=2),
     lambda c: compile_persistent(c, True)),
    ("streamk", CFG, compile_streamk),
    ("streamk", CFG.replace(block_n=32, num_stages=6), compile_streamk),
    ("streamk", CFG.replace(block_n=64, block_r=64, num_stages=2), compile_streamk),
    # swap_ab (decode-sized M): 16-token X tiles, A tiles of 64 rank rows on the S wgmma's M
    ("kloop", CFG.replace(block_m=16, block_n=128, block_k=64, block_r=64, num_stages=6, swap_ab=True),
     lambda c: compile_main(c, K_.LOWRANK_KLOOP, SWAP_AB=True)),
    ("split", CFG.replace(block_m=16, block_n=64, block_k=256, block_r=64, num_stages=5, swap_ab=True),
     lambda c: compile_main(c, K_.LOWRANK_GLOBAL, SWAP_AB=True, PDL=True)),
    # 32-token X tiles, the rules' 17–32-token plans (wide N: 128 weight rows × 64-wide K steps; else 64 × 256);
    # at r16 and at r64, the widest rank they serve
    ("split", CFG.replace(block_m=32, block_n=128, block_k=64, block_r=16, num_stages=6, swap_ab=True),
     lambda c: compile_main(c, K_.LOWRANK_GLOBAL, SWAP_AB=True, PDL=True)),
    ("split", CFG.replace(block_m=32, block_n=64, block_k=256, block_r=64, num_stages=4, swap_ab=True),
     lambda c: compile_main(c, K_.LOWRANK_GLOBAL, SWAP_AB=True, PDL=True)),
]


@pytest.mark.parametrize("strategy, cfg, compile_", COMPILED, ids=[f"{s}-{i}" for i, (s, _, _) in enumerate(COMPILED)])
def test_ledger_matches_compiled_shared(strategy, cfg, compile_):
    info = compile_(cfg)
    predicted = smem_ledger(cfg, 16, strategy).total()
    assert abs(predicted - info.shared) <= TOL_BYTES, (
        f"ledger {predicted} B vs compiled {info.shared} B\n{smem_ledger(cfg, 16, strategy).table()}")


def test_ledger_check_can_fail():
    info = compile_main(CFG, K_.LOWRANK_KLOOP)
    wrong = smem_ledger(CFG.replace(num_stages=5), 16, "kloop").total()   # one stage too many
    assert abs(wrong - info.shared) > TOL_BYTES
