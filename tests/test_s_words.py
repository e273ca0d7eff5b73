"""S handed over as stamped words (``LoraOptions.s_words``) in the in-grid S-producer launches, CPU interpreter and the
sm_90 compiler: the same output bits as the counter protocol (single adapter, bank mode, stacked bank mode), the epoch
counters moving on by (main tiles, producers) per launch and the words carrying the latest epoch, the fallback where
the epilogue does not hold the S rows, and the PTX (64-bit atomics and volatile loads, no reset exchange, no wait
on a counter)."""

import pytest
import torch

from lowrank_gemm.kernels import lora_gemm as LG
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.reference import lora_linear_ref

from test_lora_gemm import MAIN_FLAGS, MOD, main_signature, make, poisoned_workspaces, rel_err, REL_TOL  # noqa: F401
from test_multilora_bank import one_adapter_case, ids_of, run_bank
from test_multilora_gemm import assert_close, ref_of
from test_multilora_stack import mixed_ids, run_stack, stack_case


def _run(cfg, x, w, a, b, bias, **opts):
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype)
    with LG.lora_options(**opts):
        return LG.run_strategy("split", x, w, a, b, 0.6, bias, cfg, out=out)


def _pair(P, M, R, tiles):
    return LG._S_WORDS.pairs.get((torch.device("cpu"), 0, P, M, R, tiles))


@pytest.mark.parametrize("M, r, producers, swap", [(19, 40, 3, True), (1, 16, 4, True), (37, 8, 2, False),
                                                   (16, 16, 1, True)])
def test_words_match_the_counter_protocol(M, r, producers, swap, poisoned_workspaces):
    """Ragged M over two row blocks, 1–4 producers, with and without swap_ab (prefetch on, so the epilogue holds the
    S rows): the reference, the same bits as the counter protocol, three launches moving the counters on by
    (tiles, producers) each and leaving the third epoch in every word."""
    N, K = 150, 88
    x, w, a, b, bias = make(M, N, K, r, seed=M + r)
    cfg = KernelConfig(block_m=16, block_n=64 if swap else 32, block_k=16, block_r=64 if r > 16 else 16, group_m=1,
                       num_warps=4, num_stages=2, swap_ab=swap, s_producers=producers)
    old = _run(cfg, x, w, a, b, bias, prefetch=True, s_words=False)
    tiles = -(-M // 16) * -(-N // cfg.block_n)
    before = _pair(producers, M, r, tiles)
    start = before[1].clone() if before is not None else torch.zeros(2, dtype=torch.int64)
    ys = [_run(cfg, x, w, a, b, bias, prefetch=True, s_words=True) for _ in range(3)]
    assert rel_err(ys[0], lora_linear_ref(x, w, a, b, 0.6, bias)) < REL_TOL
    for y in ys:
        assert torch.equal(y, old), "the words path must give the counter protocol's bits"
    words, counters = _pair(producers, M, r, tiles)
    assert counters.tolist() == (start + 3 * torch.tensor([tiles, producers])).tolist()
    epoch = int(counters[1]) // producers
    assert bool(((words >> 32) == epoch).all()), "every word holds the latest launch's epoch"


def test_words_fall_back_where_the_epilogue_reads_s_itself(poisoned_workspaces):
    """Without prefetch a non-swap plan's epilogue reads S from memory: the launch keeps the counter protocol (no
    word pair is made) and its output."""
    M, N, K, r = 37, 150, 88, 8
    x, w, a, b, bias = make(M, N, K, r, seed=5)
    cfg = KernelConfig(block_m=16, block_n=32, block_k=16, block_r=16, group_m=1, num_warps=4, num_stages=2,
                       s_producers=2)
    assert not LG._s_words_ok(cfg, x, r, True, None)
    pairs = len(LG._S_WORDS.pairs)
    y = _run(cfg, x, w, a, b, bias, s_words=True)
    assert len(LG._S_WORDS.pairs) == pairs
    assert torch.equal(y, _run(cfg, x, w, a, b, bias, s_words=False))
    assert not LG._s_words_ok(cfg.replace(s_producers=5, swap_ab=True, block_n=64), x, r, True, None)


BANK_CFG = KernelConfig(block_m=16, block_n=64, block_k=16, block_r=16, group_m=2, num_warps=4, num_stages=2,
                        swap_ab=True, s_producers=2)


@pytest.mark.parametrize("M,N,K,r_max,rank", [(37, 70, 88, 16, 11), (5, 150, 72, 16, 16)])
def test_bank_mode_words(M, N, K, r_max, rank, poisoned_workspaces):
    """One-adapter bank mode on swap-AB tiles with two producers: the reference and the counter protocol's bits."""
    case = one_adapter_case(M, N, K, 4, r_max, ids_of(M, 2, M), seed=M, ranks=[r_max, 1, rank, 0])
    with LG.lora_options(s_words=False):
        old = run_bank(case, "split", BANK_CFG)
    with LG.lora_options(s_words=True):
        y = run_bank(case, "split", BANK_CFG)
        assert torch.equal(y, run_bank(case, "split", BANK_CFG))
    assert_close(y, ref_of(case))
    assert torch.equal(y, old)


@pytest.mark.parametrize("swap", [False, True])
def test_stacked_bank_mode_words(swap, poisoned_workspaces):
    """Stacked bank mode (two adapters in one rank-32 block; the stacked epilogue holds the S rows even without
    prefetch): the reference and the counter protocol's bits."""
    cfg = KernelConfig(block_m=16, block_n=64 if swap else 32, block_k=16, block_r=64, group_m=2, num_warps=4,
                       num_stages=2, swap_ab=swap, s_producers=3)
    M, N, K, r_max, d = 37, 70, 88, 16, 2
    case = stack_case(M, N, K, 6, r_max, mixed_ids(M, [1, 3], M + d), seed=M, ranks=[r_max, 1, 7, r_max, 0, 5])
    with LG.lora_options(s_words=False):
        old = run_stack(case, "split", cfg, d)
    with LG.lora_options(s_words=True):
        y = run_stack(case, "split", cfg, d)
    assert_close(y, ref_of(case))
    assert torch.equal(y, old)


def test_words_ptx():
    """The sm_90 compile of a words launch: 64-bit atomics (the epoch counters) and volatile 64-bit loads of the
    words; no exchange (nothing is reset) and no acquire wait on a counter."""
    from lowrank_gemm.kernels.aot import compile_sm90
    c = KernelConfig(block_m=16, block_n=64, block_k=256, block_r=16, group_m=1, num_warps=4, num_stages=5,
                     swap_ab=True, s_producers=4)
    consts = dict(MAIN_FLAGS, HAS_BIAS=True, SWAP_AB=True, EPI_PREFETCH=True, S_PRODUCERS=4, S_WORDS=True)
    sig = main_signature(c.block_m, c.block_n, c.block_k, c.block_r)
    sig.update(s_ptr="*i64", cnt_ptr="*i64")
    info = compile_sm90(MOD, "lora_main_kernel", sig,
                        dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, BLOCK_R=c.block_r,
                             GROUP_M=c.group_m, LOWRANK=2, PARTIAL=False, R_CHUNKS=1, **consts),
                        num_warps=c.num_warps, num_stages=c.num_stages)
    atoms = [ln for ln in info.ptx.splitlines() if "atom." in ln]
    assert atoms and all(".add." in ln and "64" in ln for ln in atoms), atoms
    assert not any("exch" in ln for ln in atoms)
    assert "ld.volatile.global" in info.ptx and "acquire" not in info.ptx
    assert info.has("wgmma", "cp.async.bulk.tensor")


@pytest.mark.parametrize("stack", [0, 2])
def test_words_compile_in_bank_modes(stack):
    """The bank and stacked bank launches with S words compile for sm_90 (the 64-bit epoch atomics in the PTX)."""
    from lowrank_gemm.kernels.aot import compile_sm90
    sig = main_signature(16, 64, 128, 64 if stack else 16)
    sig.update(s_ptr="*i64", cnt_ptr="*i64", ids_ptr="*i32", ranks_ptr="*i32", scales_ptr="*fp32", x_ptr="*bf16",
               bank_a_ptr="*bf16", L="i32", R_MAX="i32", stride_xm="i32", stride_al="i32", stride_ar="i32",
               stride_bl="i32")
    consts = dict(MAIN_FLAGS, HAS_BIAS=True, SWAP_AB=True, EPI_PREFETCH=not stack, S_PRODUCERS=2, S_WORDS=True,
                  BANK=True, ID_BLOCK=16, B_CLEAN=False, STACK_D=stack, STACK_R=16, B_VEC=False)
    info = compile_sm90(MOD, "lora_main_kernel", sig,
                        dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, BLOCK_R=64 if stack else 16, GROUP_M=1, LOWRANK=2,
                             PARTIAL=False, R_CHUNKS=1, **consts),
                        num_warps=4, num_stages=3)
    atoms = [ln for ln in info.ptx.splitlines() if "atom." in ln]
    assert atoms and all("64" in ln and "exch" not in ln for ln in atoms), atoms


def test_epochs_wrap_at_2_to_the_32(poisoned_workspaces):
    """Stamps hold the epoch modulo 2^32 (the counters are int64 and never reset): launches whose epochs cross 2^32
    still find their words (a full 64-bit compare would spin forever there)."""
    M, N, K, r, P = 3, 150, 88, 16, 2
    x, w, a, b, bias = make(M, N, K, r, seed=9)
    cfg = KernelConfig(block_m=16, block_n=64, block_k=16, block_r=16, group_m=1, num_warps=4, num_stages=2,
                       swap_ab=True, s_producers=P)
    old = _run(cfg, x, w, a, b, bias, s_words=False)
    tiles = -(-N // 64)
    words, counters = LG._S_WORDS.get(torch.device("cpu"), P, M, r, tiles)
    counters.copy_(torch.tensor([tiles * (2**32 - 2), P * (2**32 - 2)]))
    for epoch in (2**32 - 1, 2**32, 2**32 + 1):
        assert torch.equal(_run(cfg, x, w, a, b, bias, s_words=True), old)
        assert bool((((words >> 32) & 0xFFFFFFFF) == epoch % 2**32).all())


def test_pairs_first_needed_in_a_capture_come_from_the_spare(monkeypatch):
    """A pair first asked for inside a CUDA-graph capture is carved, zeroed and 16-word aligned, from the spare set
    aside by an earlier call outside any capture, and kept (replays count on); once the spare is used up a capture
    gets a fresh pair per call that is not kept, and the next call outside a capture sets a new spare aside."""
    sw, dev = LG._SWords(), torch.device("cpu")
    monkeypatch.setattr(LG, "S_WORDS_SPARE", 64)
    eager = sw.get(dev, 2, 3, 5, 7)
    assert sw.get(dev, 2, 3, 5, 7) is eager and sw.spare[dev][1] == 0
    spare = sw.spare[dev][0]
    monkeypatch.setattr(LG, "_capturing", lambda d: True)
    words, counters = sw.get(dev, 1, 2, 9, 4)       # 18 words → 32 handed out, the counters 16 more
    assert words.shape == (1, 2, 9) and words.data_ptr() == spare.data_ptr()
    assert counters.data_ptr() == spare.data_ptr() + 32 * 8 and sw.spare[dev][1] == 48
    assert not words.any() and not counters.any()
    assert sw.get(dev, 1, 2, 9, 4)[0] is words
    fresh = sw.get(dev, 1, 4, 4, 4)                  # 16 + 2 words do not fit in the 16 left
    assert dev not in sw.spare and fresh[0].shape == (1, 4, 4)
    assert sw.get(dev, 1, 4, 4, 4)[0] is not fresh[0], "a pair made inside a capture is not kept"
    monkeypatch.setattr(LG, "_capturing", lambda d: False)
    sw.get(dev, 1, 4, 4, 4)
    assert sw.spare[dev][1] == 0 and sw.spare[dev][0].data_ptr() != spare.data_ptr()
