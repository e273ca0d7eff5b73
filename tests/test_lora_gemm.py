"""Single-adapter LoRA GEMM vs the float64 spec, on CPU under Triton's interpreter (fp16: the
interpreter's bf16 ``tl.dot`` is wrong) — plus op semantics, bad input and sm_90 PTX checks.

Tolerance: fp16 inputs, fp32 accumulation, fp16 output: the rounding of y alone is ~2^-11
relative, S is rounded to fp16 before S·Bᵀ as an unfused fp16 run would; 2e-3 of ‖ref‖ leaves
~4× margin over the torch fp16 error on the same data (checked in ``test_tolerance_is_meaningful``).
"""


import pytest
import torch
from hypothesis import given, settings, strategies as st

from _lora import AtenOps
from lowrank_gemm.kernels import lora_gemm as LG
from lowrank_gemm.kernels.lora_gemm import lora_linear, run_strategy
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.plan.planner import block_r_for, can_implement, pinned
from lowrank_gemm.reference import lora_linear_ref

REL_TOL = 2e-3
KERNEL_STRATEGIES = ("kloop", "split", "concat", "streams", "merged", "persistent_static",
                     "persistent_dynamic", "streamk", "kcat")
SPLIT_K_OK = ("kloop", "split", "concat", "streams", "merged")


def make(M, N, K, r, dtype=torch.float16, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype)
    a = (torch.randn(r, K, generator=g) / K ** 0.5).to(dtype)
    b = torch.randn(N, r, generator=g).to(dtype)
    bb = torch.randn(N, generator=g).to(dtype) if bias else None
    return x, w, a, b, bb


def rel_err(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


def cfg_for(r, split_k=1, bm=16, bn=32, bk=16, group_m=2):
    return KernelConfig(block_m=bm, block_n=bn, block_k=bk, block_r=block_r_for(r), group_m=group_m,
                        num_warps=4, num_stages=2, split_k=split_k)


@pytest.fixture
def poisoned_workspaces(monkeypatch):
    """Every fp32 scratch buffer (split-K partials, S) starts as NaN: a read of an unwritten
    element poisons the result."""
    real = LG._empty_f32

    def nan_empty(device, *shape):
        return real(device, *shape).fill_(float("nan"))
    monkeypatch.setattr(LG, "_empty_f32", nan_empty)


def run_poisoned(strategy, x, w, a, b, scale, bias, cfg):
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype)
    assert can_implement(strategy, (x.shape[0], w.shape[0], x.shape[1], a.shape[0]), cfg)
    LG.clear_weight_cache()
    return run_strategy(strategy, x, w, a, b, scale, bias, cfg, out=out)


# ---------------------------------------------------------------------------- every strategy

@pytest.mark.parametrize("strategy", KERNEL_STRATEGIES)
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("with_bias", [True, False])
def test_strategy_matches_reference(strategy, split_k, with_bias, poisoned_workspaces):
    if split_k > 1 and strategy not in SPLIT_K_OK:
        pytest.skip("persistent / stream-K strategies do not take split_k")
    M, N, K, r = 37, 70, 88, 8             # ragged against 16×32×16 tiles, 3 M-blocks
    x, w, a, b, bias = make(M, N, K, r, bias=with_bias)
    y = run_poisoned(strategy, x, w, a, b, 0.7, bias, cfg_for(r, split_k))
    assert not y.isnan().any()
    assert rel_err(y, lora_linear_ref(x, w, a, b, 0.7, bias)) < REL_TOL


@pytest.mark.parametrize("strategy, split_k, split_mode", [
    ("kloop", 1, "reduce"), ("kloop", 3, "fixup"), ("kloop", 2, "reduce"),
    ("split", 1, "reduce"), ("split", 3, "fixup"), ("split", 2, "reduce"), ("merged", 3, "fixup"),
    ("concat", 2, "reduce"), ("streams", 1, "reduce")])
def test_swap_ab_matches_reference(strategy, split_k, split_mode, poisoned_workspaces):
    """swap_ab (W·Xᵀ in the K loop, decode-sized M): ragged M, N and K against 16-token × 64-row tiles,
    rank 40 (kloop: one 64-row S wgmma tile with 24 zero-filled ranks; split: three BR chunks), bias;
    split-K in both modes."""
    M, N, K, r = 19, 150, 88, 40
    x, w, a, b, bias = make(M, N, K, r, seed=3)
    cfg = cfg_for(16, split_k, bm=16, bn=64, bk=16).replace(swap_ab=True, split_mode=split_mode,
                                                            block_r=64 if strategy == "kloop" else 16)
    y = run_poisoned(strategy, x, w, a, b, 0.6, bias, cfg)
    assert not y.isnan().any()
    assert rel_err(y, lora_linear_ref(x, w, a, b, 0.6, bias)) < REL_TOL


@pytest.mark.parametrize("M", [17, 30, 45])
def test_swap_ab_on_32_token_tiles_matches_reference(M, poisoned_workspaces):
    """split + swap_ab on 32-token tiles (the tokens on the wgmma's N; the rules' plan at 17–32 tokens, r ≤ 64) —
    ragged M in one or two token tiles, N and K ragged, rank 24 over two BR chunks, bias."""
    N, K, r = 150, 88, 24
    x, w, a, b, bias = make(M, N, K, r, seed=M)
    cfg = cfg_for(16, bm=32, bn=64, bk=16).replace(swap_ab=True)
    y = run_poisoned("split", x, w, a, b, 0.6, bias, cfg)
    assert not y.isnan().any()
    assert rel_err(y, lora_linear_ref(x, w, a, b, 0.6, bias)) < REL_TOL


@pytest.mark.parametrize("M, r, swap, producers", [(19, 40, True, 3), (1, 16, True, 4), (37, 8, False, 2)])
def test_in_grid_s_producers_match_reference(M, r, swap, producers, poisoned_workspaces):
    """split with s_producers (one launch: S's K slices from the head of the main grid, the main tiles wait for
    them after their K loop): ragged M over two row blocks, rank in one block, bias, with and without swap_ab;
    bit-identical repeats and both counters back at zero."""
    from _lora import tickets_zero
    N, K = 150, 88
    x, w, a, b, bias = make(M, N, K, r, seed=M + r)
    cfg = cfg_for(r, bm=16, bn=64 if swap else 32, bk=16).replace(swap_ab=swap, s_producers=producers)
    ys = [run_poisoned("split", x, w, a, b, 0.6, bias, cfg) for _ in range(2)]
    assert not ys[0].isnan().any() and torch.equal(ys[0], ys[1])
    assert rel_err(ys[0], lora_linear_ref(x, w, a, b, 0.6, bias)) < REL_TOL
    assert tickets_zero()


@pytest.mark.parametrize("strategy, cfg, needle", [
    ("split", dict(s_producers=2, split_k=2), "split_k 1"),
    ("kloop", dict(s_producers=2, block_r=64), "split option"),
    ("split", dict(s_producers=2, block_r=16), "rank ≤ block_r"),
])
def test_s_producers_infeasible_configs_say_why(strategy, cfg, needle):
    feas = can_implement(strategy, (4, 256, 64, 40), cfg_for(16).replace(**cfg))
    assert not feas and needle in feas.reason


@pytest.mark.parametrize("strategy, cfg, needle", [
    ("kloop", dict(block_n=64), "block_r ≥ 64"),
    ("streamk", dict(block_n=64), "swap_ab is a lora_main_kernel option"),
    ("split", dict(block_n=32), "block_n ≥ 64"),
    ("split", dict(block_n=64, num_warps=8), "16·num_warps"),
])
def test_swap_ab_infeasible_configs_say_why(strategy, cfg, needle):
    c = cfg_for(16).replace(swap_ab=True, **cfg)
    feas = can_implement(strategy, (4, 256, 64, 16), c)
    assert not feas and needle in feas.reason


@pytest.mark.parametrize("r", [1, 8, 16, 64, 128])
@pytest.mark.parametrize("strategy", ["kloop", "split", "concat", "persistent_dynamic", "streamk"])
def test_ranks(strategy, r, poisoned_workspaces):
    M, N, K = 21, 40, 48
    x, w, a, b, bias = make(M, N, K, r, seed=r)
    y = run_poisoned(strategy, x, w, a, b, 1.3, bias, cfg_for(r, bm=16, bn=16, bk=16))
    assert rel_err(y, lora_linear_ref(x, w, a, b, 1.3, bias)) < REL_TOL


def test_split_rank_above_block_r_loops_over_chunks(poisoned_workspaces):
    # split / concat read S from memory, so any rank works: rank 40 in 16-wide chunks
    x, w, a, b, bias = make(20, 33, 32, 40)
    cfg = cfg_for(16, split_k=2)
    ref = lora_linear_ref(x, w, a, b, 0.5, bias)
    for strategy in ("split", "concat", "streams"):
        assert rel_err(run_poisoned(strategy, x, w, a, b, 0.5, bias, cfg), ref) < REL_TOL
    assert not can_implement("kloop", (20, 33, 32, 40), cfg)


# ---------------------------------------------------------------------------- stream-K

@pytest.mark.parametrize("M, N, K, grid, what", [
    (10, 20, 96, 4, "one tile cut into 4 segments (6 K steps over 4 programs)"),
    (37, 70, 32, 4, "9 tiles × 2 K steps: a program ends a tile, does a whole one, starts another"),
    (37, 70, 88, 7, "ragged; grid not dividing the work"),
    (5, 33, 200, 3, "few programs, long ranges"),
    (20, 40, 48, 64, "grid clamped to the 12 work units: every tile cut into K-step segments"),
])
def test_streamk_segments_and_result(M, N, K, grid, what, monkeypatch, poisoned_workspaces):
    monkeypatch.setattr(LG, "streamk_grid", lambda tiles, k_tiles, dev: max(1, min(grid, tiles * k_tiles)))
    cfg = cfg_for(8)
    tiles, k_tiles = -(-M // cfg.block_m) * -(-N // cfg.block_n), -(-K // cfg.block_k)
    p = LG.streamk_grid(tiles, k_tiles, None)
    segs = LG.streamk_segments(tiles, k_tiles, p)
    total = tiles * k_tiles
    for t, ss in enumerate(segs):       # each tile's K steps covered once, in order, owners ascending
        assert [s[1] for s in ss] == [0] + [s[2] for s in ss[:-1]] and ss[-1][2] == k_tiles, what
        assert [s[0] for s in ss] == list(range(ss[0][0], ss[0][0] + len(ss)))
        # the kernel's owner formula (first/last unit of the tile) agrees with the host split
        own = lambda u: ((u + 1) * p - 1) // total
        assert own(t * k_tiles) == ss[0][0] and own(t * k_tiles + k_tiles - 1) == ss[-1][0]
    x, w, a, b, bias = make(M, N, K, 8, seed=M + K)
    y1 = run_poisoned("streamk", x, w, a, b, 0.7, bias, cfg)
    y2 = run_poisoned("streamk", x, w, a, b, 0.7, bias, cfg)
    assert not y1.isnan().any(), what
    assert torch.equal(y1, y2), what
    assert rel_err(y1, lora_linear_ref(x, w, a, b, 0.7, bias)) < REL_TOL, what


def test_persistent_static_strides_over_tiles():
    # one M-block: the static grid (4 programs on CPU) stays narrower than the 6 tasks
    x, w, a, b, bias = make(9, 90, 32, 4)
    y = run_poisoned("persistent_static", x, w, a, b, 0.9, bias, cfg_for(4, bm=16, bn=16))
    assert LG._static_grid(1, 6, 2, x.device) == 4
    assert rel_err(y, lora_linear_ref(x, w, a, b, 0.9, bias)) < REL_TOL


@pytest.mark.parametrize("dynamic", [False, True])
def test_persistent_epi_stages_one_is_the_same_result(dynamic):
    # KernelConfig.epi_stages only changes how deep the compiler pipelines the epilogue's rank loop: same values
    x, w, a, b, bias = make(37, 70, 48, 12)
    strategy = "persistent_dynamic" if dynamic else "persistent_static"
    ys = [run_poisoned(strategy, x, w, a, b, 0.6, bias, cfg_for(4, bm=16, bn=32).replace(epi_stages=e)) for e in (0, 1)]
    assert torch.equal(ys[0], ys[1])
    assert rel_err(ys[1], lora_linear_ref(x, w, a, b, 0.6, bias)) < REL_TOL


@pytest.mark.parametrize("strategy", ["flat", "persistent_static", "persistent_dynamic"])
@pytest.mark.parametrize("M, N", [(37, 72), (50, 40), (9, 70)])
@pytest.mark.parametrize("pieces", [2, 4])
def test_y_by_tma_is_the_same_result(strategy, M, N, pieces, monkeypatch):
    """Session 52 candidate: Y stored by TMA in column pieces (``Y_TMA_STRATEGIES``, ``Y_PIECES``) gives the pointer
    stores' bits — rows past M and columns past N clipped by the copy (N = 40 on 32-wide tiles: pieces wholly past N),
    NaN-poisoned outputs; N = 70 has 140-byte rows, not TMA-legal: the kernel keeps its pointer stores."""
    x, w, a, b, bias = make(M, N, 48, 8, seed=N)      # flat reads B by TMA: a rank of 16-byte rows
    cfg = cfg_for(8, bm=16, bn=32)
    ys = [run_poisoned(strategy, x, w, a, b, 0.6, bias, cfg)]
    monkeypatch.setattr(LG, "Y_TMA_STRATEGIES", frozenset({strategy}))
    monkeypatch.setattr(LG, "Y_PIECES", pieces)
    assert (LG._y_desc(torch.empty(M, N, dtype=x.dtype), cfg, strategy)[0] is None) == (N % 8 != 0)
    ys.append(run_poisoned(strategy, x, w, a, b, 0.6, bias, cfg))
    assert torch.equal(ys[0], ys[1])
    assert rel_err(ys[1], lora_linear_ref(x, w, a, b, 0.6, bias)) < REL_TOL


@pytest.mark.parametrize("strategy", KERNEL_STRATEGIES)
@pytest.mark.parametrize("split_k", [1, 3])
def test_no_memset_per_call_and_tickets_left_zero(strategy, split_k):
    """No strategy zeroes a buffer per call — a captured graph replays that as a memset node, ~1.2 µs (session 47:
    the persistent strategies' sync words, stream-K's tickets and the multi-LoRA split-K tickets did). Tickets,
    flags and counters come from the shared per-stream region, and every launch leaves it at zero, so the next
    launch, of any shape, starts from zero too."""
    from _lora import tickets_zero
    if split_k > 1 and strategy not in SPLIT_K_OK:
        pytest.skip("persistent / stream-K strategies do not take split_k")
    for M, N, K, bm, bn in ((37, 70, 48, 16, 32), (9, 90, 64, 16, 16), (50, 20, 40, 16, 16)):
        x, w, a, b, bias = make(M, N, K, 6, seed=M)
        cfg = cfg_for(6, split_k, bm=bm, bn=bn)
        run_poisoned(strategy, x, w, a, b, 0.6, bias, cfg)        # the region and any derived weight exist from here
        out = torch.full((M, N), float("nan"), dtype=x.dtype)
        with AtenOps() as ops:     # (run_poisoned clears the weight cache: kcat would rebuild [W | B | 0])
            y = run_strategy(strategy, x, w, a, b, 0.6, bias, cfg, out=out)
        assert not [op for op in ops.seen if "zero" in op or "fill" in op], (M, ops.seen)
        assert tickets_zero(), (M, N, K)
        assert rel_err(y, lora_linear_ref(x, w, a, b, 0.6, bias)) < REL_TOL


@settings(max_examples=8, deadline=None)
@given(M=st.integers(1, 50), N=st.integers(1, 60), K=st.integers(1, 70), r=st.integers(1, 20),
       strategy=st.sampled_from(KERNEL_STRATEGIES), split_k=st.integers(1, 2),
       bias=st.booleans(), scale=st.floats(-2, 2, allow_nan=False))
def test_fuzz_shapes(M, N, K, r, strategy, split_k, bias, scale):
    if strategy not in SPLIT_K_OK or K <= 16:
        split_k = 1
    x, w, a, b, bb = make(M, N, K, r, bias=bias, seed=M * 7 + N)
    y = run_poisoned(strategy, x, w, a, b, scale, bb, cfg_for(r, split_k))
    ref = lora_linear_ref(x, w, a, b, scale, bb)
    assert ((y.double() - ref).abs().max() <= REL_TOL * ref.abs().max() + 1e-3).item()


def test_tolerance_is_meaningful():
    x, w, a, b, bias = make(37, 70, 88, 8)
    ref = lora_linear_ref(x, w, a, b, 0.7, bias)
    torch_fp16 = (x.float() @ w.float().T + 0.7 * (x.float() @ a.float().T).half().float()
                  @ b.float().T + bias.float()).half()
    assert rel_err(torch_fp16, ref) < REL_TOL / 4
    wrong = run_poisoned("kloop", x, w, a, b, 0.75, bias, cfg_for(8))  # scale off by 7%
    assert rel_err(wrong, ref) > REL_TOL


# ---------------------------------------------------------------------------- the public op

def test_op_auto_batched_and_planner():
    x, w, a, b, bias = make(12, 40, 48, 8)
    xb = x.reshape(3, 4, 48)
    y = lora_linear(xb, w, a, b, scale=0.5, bias=bias)
    assert y.shape == (3, 4, 40) and y.dtype == torch.float16
    assert rel_err(y, lora_linear_ref(xb, w, a, b, 0.5, bias)) < REL_TOL


def test_pinned_strategy_and_config_reach_the_launch(monkeypatch):
    seen = []
    real = LG.run_strategy
    monkeypatch.setattr(LG, "run_strategy", lambda s, *a, **k: seen.append((s, a[-1])) or real(s, *a, **k))
    x, w, a, b, _ = make(8, 16, 16, 4)
    cfg = cfg_for(4)
    with pinned(strategy="split", config=cfg):
        lora_linear(x, w, a, b)
    with pinned(config=cfg):
        lora_linear(x, w, a, b, strategy="concat")
    assert seen == [("split", cfg), ("concat", cfg)]


def test_rank_zero_is_plain_gemm():
    x, w, _, _, bias = make(10, 24, 32, 1)
    a0, b0 = torch.empty(0, 32, dtype=x.dtype), torch.empty(24, 0, dtype=x.dtype)
    for strategy in ("auto", "kloop", "persistent_static"):
        y = lora_linear(x, w, a0, b0, bias=bias, strategy=strategy)
        ref = x.double() @ w.double().T + bias.double()
        assert rel_err(y, ref) < REL_TOL


def test_empty_m():
    x, w, a, b, bias = make(1, 24, 32, 4)
    y = lora_linear(x[:0].reshape(0, 32), w, a, b, bias=bias)
    assert y.shape == (0, 24)
    y3 = lora_linear(torch.empty(2, 0, 32, dtype=x.dtype), w, a, b)
    assert y3.shape == (2, 0, 24)


def test_noncontiguous_misaligned_and_odd_k_are_copied():
    x, w, a, b, bias = make(13, 24, 37, 4)       # K=37: rows are 74 B, not 16-B aligned → padded
    ref = lora_linear_ref(x, w, a, b, 1.0, bias)
    with pinned(config=cfg_for(4)):
        assert rel_err(lora_linear(x, w, a, b, bias=bias, strategy="kloop"), ref) < REL_TOL
        xt = torch.randn(48, 13).half().t()[:, :40]          # [13, 40] with stride (1, 13)
        w2 = (torch.randn(24, 40) / 7).half()
        a2 = (torch.randn(4, 40) / 7).half()
        ref2 = lora_linear_ref(xt, w2, a2, b, 1.0, bias)
        assert rel_err(lora_linear(xt, w2, a2, b, bias=bias, strategy="split"), ref2) < REL_TOL
        buf = torch.randn(13 * 40 + 1).half()
        xoff = buf[1:].view(13, 40)                          # contiguous, base off by 2 bytes
        assert xoff.data_ptr() % 16 != 0
        ref3 = lora_linear_ref(xoff, w2, a2, b, 1.0, bias)
        assert rel_err(lora_linear(xoff, w2, a2, b, bias=bias, strategy="kloop"), ref3) < REL_TOL
        assert rel_err(lora_linear(xt, w2, a2, b.t().contiguous().t(), bias=bias), ref2) < REL_TOL


@pytest.mark.parametrize("strategy, split_k", [("kloop", 1), ("kloop", 2), ("split", 1),
                                               ("concat", 2), ("persistent_dynamic", 1)])
def test_nan_inf_propagate_like_torch(strategy, split_k):
    x, w, a, b, bias = make(20, 24, 32, 4)
    x[3, 5] = float("inf")
    x[7, 0] = float("nan")
    ref = lora_linear_ref(x, w, a, b, 1.0, bias)
    with pinned(config=cfg_for(4, split_k)):
        y = lora_linear(x, w, a, b, bias=bias, strategy=strategy)
    assert torch.equal(y.isnan(), ref.isnan())
    assert torch.equal(y.isinf(), ref.isinf())
    fin = ref.isfinite()
    assert rel_err(y[fin], ref[fin]) < REL_TOL


def test_deterministic_bits():
    x, w, a, b, bias = make(37, 70, 88, 8)
    for strategy in ("kloop", "persistent_dynamic", "streamk"):
        cfg = cfg_for(8, split_k=1 if strategy in ("persistent_dynamic", "streamk") else 3)
        y1 = run_poisoned(strategy, x, w, a, b, 0.7, bias, cfg)
        y2 = run_poisoned(strategy, x, w, a, b, 0.7, bias, cfg)
        assert torch.equal(y1, y2)


def test_weight_cache_tracks_inplace_edits():
    x, w, a, b, _ = make(8, 16, 16, 4)
    LG.clear_weight_cache()
    with pinned(config=cfg_for(4)):
        y1 = lora_linear(x, w, a, b, strategy="merged")
        with torch.no_grad():
            b.mul_(2)                                   # bumps b._version
        y2 = lora_linear(x, w, a, b, strategy="merged")
        y3 = lora_linear(x, w, a, b, scale=0.5, strategy="merged")
    assert rel_err(y2, lora_linear_ref(x, w, a, b)) < REL_TOL
    assert rel_err(y3, lora_linear_ref(x, w, a, b, 0.5)) < REL_TOL
    assert not torch.equal(y1, y2)


def test_weight_cache_is_an_lru_bounded_by_entries_and_bytes():
    cache = LG._WeightCache(capacity=3, max_bytes=3 * 64)       # 64 B per [4, 4] fp32 entry
    ts = [torch.randn(4, 4) for _ in range(5)]
    builds = []

    def get(i):
        return cache.get("k", (ts[i],), (), lambda: builds.append(i) or ts[i] * 2)
    for i in (0, 1, 2, 0, 3):           # 0 is refreshed before 3 arrives: 1 is the LRU victim
        get(i)
    assert builds == [0, 1, 2, 3] and len(cache.entries) == 3
    get(0), get(2), get(3)
    assert builds == [0, 1, 2, 3]        # steady state over a rotation that fits: no rebuilds
    get(1)
    assert builds[-1] == 1 and len(cache.entries) == 3
    small = LG._WeightCache(capacity=8, max_bytes=100)          # bytes bind before entries
    for t in ts[:3]:
        small.get("k", (t,), (), lambda t=t: t.clone())
    assert len(small.entries) == 1      # newest is always kept, even above the byte bound


def test_direct_eager_path_only_for_plain_tensors():
    x, w, a, b, bias = make(6, 16, 16, 4)
    assert LG._direct_ok(x, w, a, b, bias) and LG._direct_ok(x, torch.nn.Parameter(w, requires_grad=False), a, b, None)
    wg = w.clone().requires_grad_()
    assert not LG._direct_ok(x, wg, a, b, None)
    with torch.no_grad():
        assert LG._direct_ok(x, wg, a, b, None)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        assert not LG._direct_ok(torch.empty(2, 2), w, a, b, None)
    y_direct = lora_linear(x, w, a, b, 0.5, bias)
    y_op = torch.ops.lowrank_gemm.lora_linear(x, w, a, b, 0.5, bias, "auto")
    assert torch.equal(y_direct, y_op)


def test_split_down_projection_k_slices():
    # S from K slices summed in order by the main epilogue, and by the reduce kernel after split-K
    assert LG.down_splits(256, 16, 4096, 16, 132) == 4 and LG.down_splits(4096, 16, 4096, 16, 132) == 2
    assert LG.down_splits(64, 16, 256, 16, 132) == 1            # keeps ≥ 4 K steps per slice
    x, w, a, b, bias = make(40, 50, 96, 24)
    for split_k in (1, 2):
        cfg = cfg_for(16, split_k=split_k)
        assert rel_err(run_poisoned("split", x, w, a, b, 0.5, bias, cfg),
                       lora_linear_ref(x, w, a, b, 0.5, bias)) < REL_TOL


def test_cpu_without_interpreter_falls_back_to_torch(monkeypatch):
    monkeypatch.setattr(LG, "_interpreting", lambda: False)
    called = []
    monkeypatch.setattr(LG, "run_strategy", lambda *a, **k: called.append(1))
    x, w, a, b, bias = make(5, 8, 16, 2)
    y = lora_linear(x, w, a, b, 0.3, bias)
    assert not called
    assert rel_err(y, lora_linear_ref(x, w, a, b, 0.3, bias)) < REL_TOL


def test_torch_compile_fullgraph_traces_the_op():
    x, w, a, b, bias = make(6, 16, 16, 4)

    def f(x):
        return lora_linear(x, w, a, b, 0.5, bias).relu()
    y = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
    assert rel_err(y, lora_linear_ref(x, w, a, b, 0.5, bias).relu()) < REL_TOL


def test_opcheck():
    x, w, a, b, bias = make(6, 16, 16, 4)
    torch.library.opcheck(torch.ops.lowrank_gemm.lora_linear.default, (x, w, a, b, 0.5, bias, "split"),
                          test_utils=("test_schema", "test_faketensor"))


# ---------------------------------------------------------------------------- bad input

def _bad(**over):
    x, w, a, b, bias = make(4, 8, 16, 2)
    args = dict(x=x, weight=w, lora_a=a, lora_b=b, bias=bias)
    args.update(over)
    return args


@pytest.mark.parametrize("over, exc, needle", [
    (dict(weight=torch.randn(8, 15).half()), ValueError, "weight must be [N, K] with K=16"),
    (dict(lora_a=torch.randn(2, 15).half()), ValueError, "lora_a must be [r, K] with K=16"),
    (dict(lora_b=torch.randn(8, 3).half()), ValueError, "lora_b must be [N, r] = [8, 2]"),
    (dict(bias=torch.randn(9).half()), ValueError, "bias must be [N] = [8]"),
    (dict(lora_a=torch.randn(2, 16).float()), TypeError, "lora_a must have x's dtype torch.float16"),
    (dict(x=torch.randn(4, 16)), TypeError, "x must be float16 or bfloat16, got torch.float32"),
    (dict(weight=torch.randn(8, 16, 1).half()), ValueError, "weight must be 2-D"),
    (dict(lora_b=torch.randn(8, 2).half().to("meta")), ValueError, "lora_b must be on x's device"),
])
def test_bad_input_messages(over, exc, needle):
    with pytest.raises(exc, match=needle.replace("[", r"\[").replace("]", r"\]")):
        lora_linear(**_bad(**over))


def test_bad_strategy_and_pins():
    with pytest.raises(ValueError, match="strategy must be 'auto' or one of"):
        lora_linear(**_bad(), strategy="fastest")
    with pytest.raises(ValueError, match="unknown strategy"):
        with pinned(strategy="nope"):
            pass
    args = _bad(lora_a=torch.randn(40, 16).half(), lora_b=torch.randn(8, 40).half())
    with pinned(config=cfg_for(16)):   # block_r 16 < rank 40
        with pytest.raises(ValueError, match="rank 40 > block_r 16"):
            lora_linear(**args, strategy="kloop")


# ---------------------------------------------------------------------------- sm_90 lowering

MOD = "lowrank_gemm.kernels._lora_kernels"


def main_signature(bm, bn, bk, br, dt="bf16"):
    sig = {"x_desc": f"tensordesc<{dt}[{bm}, {bk}]>", "w_desc": f"tensordesc<{dt}[{bn}, {bk}]>",
           "a_desc": f"tensordesc<{dt}[{br}, {bk}]>", "s_ptr": "*fp32", "b_ptr": f"*{dt}",
           "bias_ptr": f"*{dt}", "y_ptr": f"*{dt}", "sws_ptr": "*fp32", "ws_ptr": "*fp32", "cnt_ptr": "*i32",
           "M": "i32", "N": "i32", "K": "i32", "R": "i32", "scale": "fp32", "SPLIT_K": "i32",
           "S_SPLITS": "i32", "DP_TILES": "i32"}
    sig.update({k: "i32" for k in ("stride_sk", "stride_sm", "stride_sr", "stride_bn", "stride_br", "stride_yk",
                                   "stride_ym", "stride_yn", "stride_swk", "stride_swn", "stride_swm",
                                   "stride_swr", "stride_wk", "stride_wm", "stride_wn")})
    return sig


def persistent_signature(bm, bn, bk, br, dt="bf16"):
    sig = {"x_desc": f"tensordesc<{dt}[{bm}, {bk}]>", "w_desc": f"tensordesc<{dt}[{bn}, {bk}]>",
           "a_desc": f"tensordesc<{dt}[{br}, {bk}]>", "s_ptr": "*fp32", "sync_ptr": "*i32",
           "b_ptr": f"*{dt}", "bias_ptr": f"*{dt}", "y_ptr": f"*{dt}",
           "M": "i32", "N": "i32", "K": "i32", "R": "i32", "scale": "fp32"}
    sig.update({k: "i32" for k in ("stride_sm", "stride_sr", "stride_bn", "stride_br",
                                   "stride_ym", "stride_yn")})
    return sig


MAIN_FLAGS = dict(FIXUP=False, EPI_M=64, EPI_CHUNKS=1, IN_FLIGHT=1, HYBRID=False, PDL=False, EPI_PREFETCH=False,
                  SWAP_AB=False, S_PRODUCERS=0)


def compile_main(cfg: KernelConfig, lowrank: int, partial=False, r_chunks=1, fixup_m=None, **flags):
    """fixup_m: compile the FIXUP (one-launch split-K) variant with the launcher's EPI_M/EPI_CHUNKS/
    IN_FLIGHT for M; flags: HYBRID, PDL, EPI_PREFETCH, HAS_BIAS. Every constexpr is passed: Triton's
    AOT cache key lists the constexpr *values* in argument order without their names, so two
    partial sets such as {HYBRID: True} and {EPI_PREFETCH: True} would share a cache entry."""
    from lowrank_gemm.kernels.aot import compile_sm90
    c = cfg
    consts = dict(MAIN_FLAGS, HAS_BIAS=True)
    if fixup_m is not None:
        consts.update(FIXUP=True, **LG.fixup_meta(fixup_m, c))
    consts.update(flags)
    return compile_sm90(MOD, "lora_main_kernel", main_signature(c.block_m, c.block_n, c.block_k, c.block_r),
                        dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, BLOCK_R=c.block_r,
                             GROUP_M=c.group_m, LOWRANK=lowrank, PARTIAL=partial, R_CHUNKS=r_chunks,
                             **consts),
                        num_warps=c.num_warps, num_stages=c.num_stages)


# what the JIT binds for a real launch (contiguous S, B, Y; 16-B aligned pointers, sizes and row strides a
# multiple of 16): without it the compiler lays the persistent epilogue out differently and reports less shared
# memory than the launch needs (session 16)
PERSISTENT_UNIT_STRIDES = dict(stride_sr=1, stride_br=1, stride_yn=1)
PERSISTENT_ALIGNED = ("s_ptr", "sync_ptr", "b_ptr", "bias_ptr", "y_ptr", "M", "N", "K", "R",
                      "stride_sm", "stride_bn", "stride_ym")


def compile_persistent(cfg: KernelConfig, dynamic: bool, readers_late: bool = True, y_tma: bool = False,
                       trace: bool = False):
    from lowrank_gemm.kernels.aot import compile_sm90
    c = cfg
    sig = persistent_signature(c.block_m, c.block_n, c.block_k, c.block_r)
    if y_tma:
        sig["y_desc"] = f"tensordesc<bf16[{c.block_m}, {c.block_n // 2}]>"
    if trace:
        sig["trace_ptr"] = "*i64"
    return compile_sm90(MOD, "lora_persistent_kernel", sig,
                        dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, BLOCK_R=c.block_r,
                             GROUP_M=c.group_m, DYNAMIC=dynamic, HAS_BIAS=True, EPI_STAGES=c.epi_stages or None,
                             READERS_LATE=readers_late, Y_TMA=y_tma, TRACE=trace, **PERSISTENT_UNIT_STRIDES),
                        aligned=PERSISTENT_ALIGNED + (("trace_ptr",) if trace else ()), num_warps=c.num_warps,
                        num_stages=c.num_stages)


@pytest.mark.parametrize("cfg", [KernelConfig(block_m=128, block_n=256, block_k=64, block_r=64, num_warps=8,
                                              num_stages=4),
                                 KernelConfig(block_m=128, block_n=128, block_k=64, block_r=16, num_warps=8,
                                              num_stages=6)])
def test_aot_persistent_y_by_tma(cfg):
    """Session 52 candidate: the persistent kernel's Y by bulk tensor copies needs no shared memory beyond the pointer
    stores' (the staging buffer is laid over the K loop's, dead by the epilogue): the tuned table's deepest
    128×256 and 128×128 entries still fit."""
    ptr, tma = compile_persistent(cfg, False), compile_persistent(cfg, False, y_tma=True)
    assert tma.has("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group", "cp.async.bulk.wait_group.read")
    assert tma.shared == ptr.shared <= 232448


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_aot_persistent_trace_stamps_only_when_asked(dynamic):
    """TRACE (probe_flat_trace.py): the global timer read at each of the six points (the first tile's three behind a
    runtime test) and the SM id stored; off (the default), none of it, and the same shared memory either way."""
    cfg = KernelConfig(block_m=128, block_n=256, block_k=64, block_r=64, num_warps=8, num_stages=4)
    traced, plain = compile_persistent(cfg, dynamic, trace=True), compile_persistent(cfg, dynamic)
    assert traced.ptx.count("%globaltimer") == 6 and "%smid" in traced.ptx
    assert "%globaltimer" not in plain.ptx and "%smid" not in plain.ptx
    assert traced.shared == plain.shared


def streamk_signature(bm, bn, bk, br, dt="bf16"):
    sig = {"x_desc": f"tensordesc<{dt}[{bm}, {bk}]>", "w_desc": f"tensordesc<{dt}[{bn}, {bk}]>",
           "a_desc": f"tensordesc<{dt}[{br}, {bk}]>", "b_ptr": f"*{dt}", "bias_ptr": f"*{dt}",
           "y_ptr": f"*{dt}", "ws_ptr": "*fp32", "sws_ptr": "*fp32", "cnt_ptr": "*i32",
           "M": "i32", "N": "i32", "K": "i32", "R": "i32", "scale": "fp32"}
    sig.update({k: "i32" for k in ("stride_bn", "stride_br", "stride_ym", "stride_yn")})
    return sig


def compile_streamk(cfg: KernelConfig):
    from lowrank_gemm.kernels.aot import compile_sm90
    c = cfg
    return compile_sm90(MOD, "lora_streamk_kernel", streamk_signature(c.block_m, c.block_n, c.block_k, c.block_r),
                        dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, BLOCK_R=c.block_r,
                             GROUP_M=c.group_m, HAS_BIAS=True),
                        num_warps=c.num_warps, num_stages=c.num_stages)


H200_CFG = KernelConfig(block_m=64, block_n=128, block_k=128, block_r=16, num_warps=4, num_stages=4)


@pytest.mark.parametrize("cfg", [H200_CFG.replace(block_m=128, block_k=64, num_stages=3),
                                 H200_CFG.replace(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)])
def test_aot_persistent_readers_count_waits_for_no_barrier(cfg):
    """Session 48: each tile's count past its S wait (the atomic that lets the block's last tile reset the shared sync
    words) is one lane's atomic whose result is first used after the tile's store. Session 47's scalar atomic
    broadcast its result through shared memory behind a CTA barrier, so every tile waited out the atomic's round
    trip before its epilogue (the large-M persistent cells ran ~2 % slower on the H200)."""
    def after_count(ptx):
        lines = [ln.strip() for ln in ptx.split("\n") if ln.strip() and not ln.strip().startswith(("//", ".loc"))]
        at = next(i for i, ln in enumerate(lines) if "atom.global.gpu.relaxed.add" in ln)
        return " ".join(lines[at + 1:at + 6])
    late, early = compile_persistent(cfg, False), compile_persistent(cfg, False, readers_late=False)
    assert "bar.sync" in after_count(early.ptx) and "st.shared" in after_count(early.ptx)
    assert "bar.sync" not in after_count(late.ptx) and "st.shared" not in after_count(late.ptx), after_count(late.ptx)
    assert late.shared == early.shared


@pytest.mark.parametrize("name, compile_", [
    ("kloop", lambda: compile_main(H200_CFG, LG.K_.LOWRANK_KLOOP)),
    ("kloop split-K partial", lambda: compile_main(H200_CFG.replace(split_k=4), LG.K_.LOWRANK_KLOOP, True)),
    ("split main", lambda: compile_main(H200_CFG.replace(block_m=128, block_k=64, block_r=64),
                                        LG.K_.LOWRANK_GLOBAL)),
    ("split main, planner's 128x256 8 warps, r 64 in 4 unrolled chunks",
     lambda: compile_main(KernelConfig(block_m=128, block_n=256, block_k=64, block_r=16, num_warps=8,
                                       num_stages=4), LG.K_.LOWRANK_GLOBAL, r_chunks=4)),
    ("persistent dynamic", lambda: compile_persistent(H200_CFG.replace(block_m=128, block_k=64, num_stages=3), True)),
    ("streamk", lambda: compile_streamk(H200_CFG)),
    ("streamk narrow 64x32, 6 stages", lambda: compile_streamk(H200_CFG.replace(block_n=32, num_stages=6))),
])
def test_sm90_ptx_uses_wgmma_and_tma(name, compile_):
    info = compile_()
    assert "wgmma.mma_async" in info.ptx, name
    assert "cp.async.bulk.tensor" in info.ptx, name


# ---------------------------------------------------------------------------- bench helpers (CPU)

def test_bench_helpers_render(tmp_path):
    from lowrank_gemm.bench import lora as B
    assert B.nbytes(64, 28672, 4096, 16) == 2 * (28672 * 4096 + 64 * 4096 + 64 * 28672 + 16 * 4096 + 28672 * 16)
    assert B.plausible("merged", 64, 16, False) and not B.plausible("merged", 64, 64, False)
    assert all(B.plausible(s, 1, 64, True) for s in B.STRATS)
    rows = [{"suite": "lora", "impl": i, "M": m, "N": 4096, "K": 4096, "r": 16, "dtype": "bfloat16",
             "median_us": 10.0, "graph_us": 9.0 + (i == "auto"), "ratio_cublas": 1.0 + 0.1 * (i == "auto"),
             "plan": "kloop" if i == "auto" else None} for i in ("cublas_base", "auto") for m in (1, 64)]
    md = B.to_markdown({"device": "test"}, rows)
    assert "auto (kloop)" in md and "× cuBLAS" in md
    B.plot({"rows": rows}, tmp_path / "lora.png")
    assert (tmp_path / "lora.png").stat().st_size > 0


def test_weight_cache_never_serves_a_freed_tensors_entry():
    """A freed weight's address can be reused by a new tensor with the same version: the cache must
    not hand back the old derived weight (seen on the GPU as a flaky wrong `concat` result)."""
    from lowrank_gemm.kernels.lora_gemm import _WeightCache
    cache = _WeightCache()
    w = torch.randn(8, 4)
    first = cache.get("merged", (w,), (), lambda: w * 2)
    assert cache.get("merged", (w,), (), lambda: w * 3) is first       # a hit while alive
    del w
    assert not cache.entries                                            # evicted with its source
