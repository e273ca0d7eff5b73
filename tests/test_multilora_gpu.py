"""Fused multi-LoRA GEMM on the H200: bf16, real sizes, CUDA graphs, torch.compile.

Tolerance: normalized errors vs the float64 reference, relative to PyTorch's own bf16 path
(``F.linear`` + bf16 low-rank matmuls) on the same inputs: ours may be at most 2× (+ a floor)
worse. Each test is guarded by a timeout so a hang cannot eat the device session.
"""

import math

import pytest
import torch

from lowrank_gemm.bench.common import capture_graph
from lowrank_gemm.kernels import multilora_gemm as mg
from lowrank_gemm.kernels._multilora_baselines import shrink_expand, torch_loop
from lowrank_gemm.nn.multilora import AdapterBank
from lowrank_gemm.reference import multi_lora_linear_ref

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]
DT = torch.bfloat16


def make(M, N, K, L, r_max, ranks=None, seed=0, bias=True):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    x = torch.randn(M, K, generator=g, device=dev).to(DT)
    w = (torch.randn(N, K, generator=g, device=dev) / math.sqrt(K)).to(DT)
    bank = AdapterBank(L, r_max, K, N, dtype=DT, device=dev)
    ranks = ranks or [r_max - (l % 3) * (r_max // 4) for l in range(L)]
    for l, r in enumerate(ranks):
        a = torch.randn(r, K, generator=g, device=dev) / math.sqrt(K)
        b = torch.randn(N, r, generator=g, device=dev) / math.sqrt(r)
        bank.set_adapter(l, a.to(DT), b.to(DT), 0.5 + l / L)
    ids = torch.randint(-1, L, (M,), generator=g, device=dev, dtype=torch.int32)
    b_ = torch.randn(N, generator=g, device=dev).to(DT) if bias else None
    return x, w, bank, ids, b_


def nerr(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


def ref_and_torch_err(x, w, bank, ids, bias):
    ref = multi_lora_linear_ref(x, w, bank.bank_a, bank.bank_b, ids, bank.scales, bank.ranks, bias)
    slots = sorted(set(ids.tolist()) - {-1})
    y_t = torch_loop(x, w, bank.bank_a, bank.bank_b, bank.ranks.tolist(), bank.scales, ids, slots, bias)
    return ref, nerr(y_t, ref)


def _new_adapter(bank, slot, gen, scale):
    """A new rank-8 adapter into ``slot``, in place (no recompile, no recapture)."""
    bank.set_adapter(slot, (torch.randn(8, 4096, generator=gen, device="cuda") / 64).to(DT),
                     torch.randn(4096, 8, generator=gen, device="cuda").to(DT), scale)


def _graph_swap(call, x, w, bank, static_ids, bias, swap, seed):
    """Capture ``call`` once and replay it; ``swap(gen)`` then edits the bank in place and returns new ids, copied into
    ``static_ids``; the same graph replayed again: both replays match the reference of the ids and bank they saw."""
    _, g, y_g = capture_graph(call)
    g.replay()
    ref, e_t = ref_and_torch_err(x, w, bank, static_ids, bias)
    assert nerr(y_g, ref) <= 2 * e_t + 1e-3
    static_ids.copy_(swap(torch.Generator(device="cuda").manual_seed(seed)))
    g.replay()
    torch.cuda.synchronize()
    ref2, e_t2 = ref_and_torch_err(x, w, bank, static_ids, bias)
    assert nerr(y_g, ref2) <= 2 * e_t2 + 1e-3


@pytest.mark.parametrize("mode", ["gather", "segment"])
@pytest.mark.parametrize("M,N,K,L,r", [(16, 4096, 4096, 4, 16), (64, 28672, 4096, 16, 64),
                                       (256, 4096, 4096, 64, 64), (77, 3000, 1000, 5, 24),
                                       # untuned decode shapes: the swap-AB heuristic (session 15)
                                       (16, 6144, 4096, 16, 16), (3, 3000, 1000, 5, 24)])
def test_matches_reference_bf16(mode, M, N, K, L, r):
    x, w, bank, ids, bias = make(M, N, K, L, r)
    ref, e_torch = ref_and_torch_err(x, w, bank, ids, bias)
    y = mg.multi_lora_linear(x, w, bank, ids, bias=bias, mode=mode)
    assert nerr(y, ref) <= 2 * e_torch + 1e-3, (nerr(y, ref), e_torch)
    y_se = shrink_expand(x, w, bank.bank_a, bank.bank_b, bank.ranks, bank.scales, ids, bias)
    assert nerr(y_se, ref) <= 2 * e_torch + 1e-3


def test_base_rows_bit_identical_and_single_adapter():
    x, w, bank, ids, bias = make(64, 4096, 4096, 8, 16)
    ids[::2] = -1
    y = mg.multi_lora_gemm(x, w, bank.bank_a, bank.bank_b, bank.ranks, bank.scales, ids, bias)
    base = mg.multi_lora_gemm(x, w, bank.bank_a, bank.bank_b, bank.ranks, bank.scales, ids, bias, has_lora=False)
    rows = ids == -1
    assert torch.equal(y[rows], base[rows])
    one = torch.full_like(ids, 3)
    from lowrank_gemm.reference import lora_linear_ref
    r = int(bank.ranks[3])
    ref = lora_linear_ref(x, w, bank.bank_a[3, :r], bank.bank_b[3, :, :r], float(bank.scales[3]), bias)
    assert nerr(mg.multi_lora_linear(x, w, bank, one, bias=bias), ref) < 1e-2


def test_cuda_graph_adapter_swap_no_recapture():
    x, w, bank, ids, bias = make(64, 4096, 4096, 4, 32)
    static_ids = ids.clone()
    mg.multi_lora_linear(x, w, bank, static_ids, bias=bias, mode="gather")      # compile outside capture

    def swap(gen):      # replace slot 1 (new rank and scale), remove slot 2, reassign ids
        _new_adapter(bank, 1, gen, 3.0)
        bank.remove(2)
        return torch.randint(-1, 4, (64,), generator=gen, device="cuda", dtype=torch.int32)
    _graph_swap(lambda: mg.multi_lora_linear(x, w, bank, static_ids, bias=bias, mode="segment"),
                x, w, bank, static_ids, bias, swap, seed=7)


def test_torch_compile_fullgraph():
    x, w, bank, ids, bias = make(32, 4096, 4096, 4, 16)

    @torch.compile(fullgraph=True)
    def f(x, ids):
        return mg.multi_lora_linear(x, w, bank.bank_a, bank.bank_b, bank.ranks, bank.scales, ids, bias) * 2

    ref, e_t = ref_and_torch_err(x, w, bank, ids, bias)
    assert nerr(f(x, ids) / 2, ref) <= 2 * e_t + 1e-3


@pytest.mark.parametrize("M", [1, 16, 64])
def test_torch_compile_reduce_overhead(M, fresh_kernel_buffers):
    """CUDA-graph trees over multi-LoRA from a fresh process's state, new X and adapter ids every call: each output
    equals the eager op's bits (buffers made in the trees' warm-up must stay out of their pool)."""
    _, w, bank, _, bias = make(M, 4096, 4096, 4, 16)

    def f(x, ids):
        return mg.multi_lora_linear(x, w, bank.bank_a, bank.bank_b, bank.ranks, bank.scales, ids, bias)
    g = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    for seed in range(5):
        x, _, _, ids, _ = make(M, 4096, 4096, 4, 16, seed=100 + seed)
        y = g(x, ids).clone()
        torch.cuda.synchronize()
        assert torch.equal(y, f(x, ids)), f"call {seed}"


def test_bad_ids_clamp_safe_under_no_validation():
    x, w, bank, ids, bias = make(64, 4096, 4096, 4, 16)
    bad = ids.clone()
    bad[0], bad[1] = 1_000_000, -7
    with pytest.raises(ValueError, match="adapter_ids must lie in"):
        mg.multi_lora_linear(x, w, bank, bad, bias=bias)
    y = mg.multi_lora_linear(x, w, bank, bad, bias=bias, validate=False)
    torch.cuda.synchronize()
    fixed = bad.clone()
    fixed[0], fixed[1] = -1, -1
    ref, e_t = ref_and_torch_err(x, w, bank, fixed, bias)
    assert nerr(y, ref) <= 2 * e_t + 1e-3


@pytest.mark.parametrize("mode", ["gather", "segment"])
@pytest.mark.parametrize("M,N,K,L,r,split", [(64, 4096, 4096, 64, 16, 4), (64, 28672, 4096, 16, 64, 1),
                                             (77, 3000, 1000, 9, 24, 2), (256, 4096, 4096, 64, 16, 1)])
def test_appended_expand_matches_reference(mode, M, N, K, L, r, split):
    """The appended-expand candidate (one pipelined K step per distinct adapter) at real sizes, bf16."""
    import dataclasses
    x, w, bank, ids, bias = make(M, N, K, L, r, seed=3)
    ref, e_torch = ref_and_torch_err(x, w, bank, ids, bias)
    base = mg.heuristic_plan(M, N, K, r, L, mode, torch.cuda.get_device_properties(0).multi_processor_count)
    for rowsel in (False, True):
        plan = dataclasses.replace(base, expand="appended", append_rowsel=rowsel, fuse_d=0,
                                   main=base.main.replace(split_k=split))
        y = mg.multi_lora_gemm(x, w, bank.bank_a, bank.bank_b, bank.ranks, bank.scales, ids, bias, mode=mode,
                               plan=plan)
        assert nerr(y, ref) <= 2 * e_torch + 1e-3, (rowsel, nerr(y, ref), e_torch)
        y2 = mg.multi_lora_gemm(x, w, bank.bank_a, bank.bank_b, bank.ranks, bank.scales, ids, bias, mode=mode,
                                plan=plan)
        assert torch.equal(y, y2), "deterministic"


def _check_plan(x, w, bank, ids, bias, mode, plan, clean_too=False):
    """One plan with PDL on: the float64 reference on NaN-poisoned outputs and workspaces, bit-identical repeats and
    PDL off, −1 rows equal to the plan's base (``clean_too``: the zero-padded bank's unmasked loads equal too)."""
    M, N = x.shape[0], w.shape[0]
    args = (x, w, bank.bank_a, bank.bank_b, bank.ranks, bank.scales, ids, bias)

    def gemm(pdl, **kw):
        out = torch.full((M, N), float("nan"), dtype=DT, device="cuda")
        return mg.multi_lora_gemm(*args, mode=mode, plan=plan, pdl=pdl, out=out, poison_workspace=True, **kw)

    y = gemm(True)
    ref, e_torch = ref_and_torch_err(x, w, bank, ids, bias)
    assert nerr(y, ref) <= 2 * e_torch + 1e-3, (nerr(y, ref), e_torch)
    assert torch.equal(gemm(True), y) and torch.equal(gemm(False), y)
    if clean_too:
        assert torch.equal(gemm(True, b_clean=True), y)
    rows = ids == -1
    assert torch.equal(y[rows], gemm(True, has_lora=False)[rows])
    if plan.main.split_k > 1:     # split-K tickets come from the LoRA launches' shared region: left zero by each launch
        from lowrank_gemm.kernels import lora_gemm as LG
        assert LG._TICKETS.all_zero(torch.device("cuda", torch.cuda.current_device()))


@pytest.mark.parametrize("mode", ["gather", "segment"])
@pytest.mark.parametrize("M,N,K,L,r,bm,bn,split,rc", [(64, 4096, 4096, 64, 16, 64, 64, 4, 16),
                                                    (256, 4096, 4096, 64, 16, 128, 128, 2, 16),
                                                    (64, 28672, 4096, 64, 64, 64, 128, 1, 8),
                                                    (16, 4096, 4096, 16, 16, 16, 128, 4, 8),
                                                    (77, 3000, 1000, 9, 24, 64, 64, 3, 4)])
def test_rows_expand_matches_reference(mode, M, N, K, L, r, bm, bn, split, rc):
    """expand="rows" (session 27: each row's branch on the CUDA cores, chunks over the split-K programs) at real
    sizes, bf16, PDL on: the float64 reference on NaN-poisoned outputs and workspaces, bit-identical repeats and
    PDL-off, −1 rows equal to the plan's base, the zero-padded bank's unmasked loads equal to the masked ones."""
    import dataclasses
    x, w, bank, ids, bias = make(M, N, K, L, r, seed=27)
    ids[::5] = -1
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    base = mg.heuristic_plan(M, N, K, r, L, mode, sms)
    main = base.main.replace(block_m=bm, block_n=bn, split_k=split, swap_ab=bm == 16,
                             num_warps=8 if bm == 128 else 4, num_stages=3)
    plan = dataclasses.replace(base, main=main, fuse_d=0, expand="rows", rows_chunk=rc, s_unroll=True)
    _check_plan(x, w, bank, ids, bias, mode, plan, clean_too=True)


@pytest.mark.parametrize("mode", ["gather", "segment"])
@pytest.mark.parametrize("M,N,K,L,r,split,expand", [(256, 4096, 4096, 64, 16, 4, "appended"),
                                                   (64, 4096, 4096, 64, 16, 8, "rows"),
                                                   (77, 3000, 1000, 9, 24, 3, "appended")])
def test_shrink_by_row_matches_reference(mode, M, N, K, L, r, split, expand):
    """plan.shrink_rows (session 27: one shrink program per row × K slice) at real sizes, bf16, PDL on: the float64
    reference on NaN-poisoned outputs and workspaces, bit-identical repeats and PDL-off, −1 rows equal the base."""
    import dataclasses
    x, w, bank, ids, bias = make(M, N, K, L, r, seed=29)
    ids[::6] = -1
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    base = mg.heuristic_plan(M, N, K, r, L, mode, sms)
    plan = dataclasses.replace(base, fuse_d=0, expand=expand, s_unroll=True, shrink_rows=True,
                               shrink=base.shrink.replace(split_k=split))
    _check_plan(x, w, bank, ids, bias, mode, plan)


# ---- session 5: PDL between the shrink and the main kernel, the unrolled S sum (plan s_unroll)

def _appended_plan(M, N, K, L, r, mode, split):
    import dataclasses
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    base = mg.heuristic_plan(M, N, K, r, L, mode, sms)
    return dataclasses.replace(base, expand="appended", fuse_d=0, main=base.main.replace(split_k=split))


@pytest.mark.parametrize("mode", ["gather", "segment"])
@pytest.mark.parametrize("M,N,K,L,r,split", [(64, 4096, 4096, 64, 16, 4), (16, 28672, 4096, 16, 64, 1),
                                             (77, 3000, 1000, 9, 24, 2), (256, 4096, 4096, 64, 16, 2)])
def test_pdl_and_s_unroll_bit_identical(mode, M, N, K, L, r, split):
    """PDL and the unrolled S sum change when things run, not what is computed: outputs equal the
    PDL-off loop bit for bit (NaN-poisoned outputs and workspaces), −1 rows equal the base."""
    import dataclasses
    x, w, bank, ids, bias = make(M, N, K, L, r, seed=5)
    ids[::5] = -1
    plan = _appended_plan(M, N, K, L, r, mode, split)
    args = (x, w, bank.bank_a, bank.bank_b, bank.ranks, bank.scales, ids, bias)

    def gemm(p, pdl, **kw):
        out = torch.full((M, N), float("nan"), dtype=DT, device="cuda")
        return mg.multi_lora_gemm(*args, mode=mode, plan=p, pdl=pdl, out=out, poison_workspace=True, **kw)

    y0 = gemm(plan, False)
    ref, e_torch = ref_and_torch_err(x, w, bank, ids, bias)
    assert nerr(y0, ref) <= 2 * e_torch + 1e-3
    for pdl, unroll in ((True, False), (True, True), (False, True)):
        assert torch.equal(gemm(dataclasses.replace(plan, s_unroll=unroll), pdl), y0), (pdl, unroll)
    base = gemm(plan, True, has_lora=False)
    rows = ids == -1
    assert torch.equal(gemm(plan, True)[rows], base[rows])


@pytest.mark.parametrize("mode", ["gather", "segment"])
def test_pdl_cuda_graph_replay_and_id_swap(mode):
    """Under CUDA-graph capture the main kernel overlaps the shrink through a programmatic edge: every
    replay (S workspace NaN-poisoned inside the graph) equals the eager PDL-off call, also after the
    ids change between replays."""
    import dataclasses
    M, N, K, L, r = 64, 4096, 4096, 16, 16
    x, w, bank, ids, bias = make(M, N, K, L, r, seed=9)
    plan = dataclasses.replace(_appended_plan(M, N, K, L, r, mode, 4), s_unroll=True)
    static_ids = ids.clone()

    def call(pdl):
        return mg.multi_lora_gemm(x, w, bank.bank_a, bank.bank_b, bank.ranks, bank.scales, static_ids, bias,
                                  mode=mode, plan=plan, pdl=pdl, validate=False, poison_workspace=True)

    _, g, y_g = capture_graph(lambda: call(True))
    gen = torch.Generator(device="cuda").manual_seed(11)
    for _ in range(3):
        y_g.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y_g, call(False))
        static_ids.copy_(torch.randint(-1, L, (M,), generator=gen, device="cuda", dtype=torch.int32))


@pytest.mark.parametrize("mode", ["gather", "segment"])
@pytest.mark.parametrize("M,N,K,L,r,bn,split,expand", [(16, 28672, 4096, 16, 64, 128, 1, "epilogue"),
                                                      (64, 4096, 4096, 4, 16, 64, 2, "appended"),
                                                      (13, 3000, 1000, 5, 24, 64, 1, "epilogue")])
def test_swap_ab_matches_reference(mode, M, N, K, L, r, bn, split, expand):
    """main.swap_ab (W·Xᵀ, tokens on the wgmma N) with PDL and the unrolled S sum: the float64 reference,
    NaN-poisoned output and workspaces, bit-identical repeats, −1 rows equal to the swap plan's base GEMM,
    CUDA-graph replay equal to eager."""
    import dataclasses
    x, w, bank, ids, bias = make(M, N, K, L, r, seed=13)
    ids[::4] = -1
    p = mg.choose_plan(M, N, K, r, L, mode, x.device)
    p = dataclasses.replace(p, fuse_d=0, epi_d=max(p.epi_d, 1), s_unroll=True, expand=expand,
                            main=p.main.replace(swap_ab=True, block_m=16 if M <= 16 else 64, block_n=bn,
                                                split_k=split, num_warps=4, num_stages=3))
    args = (x, w, bank.bank_a, bank.bank_b, bank.ranks, bank.scales, ids, bias)

    def gemm(**kw):
        out = torch.full((M, N), float("nan"), dtype=DT, device="cuda")
        return mg.multi_lora_gemm(*args, mode=mode, plan=p, pdl=True, out=out, poison_workspace=True, **kw)

    y = gemm()
    ref, e_torch = ref_and_torch_err(x, w, bank, ids, bias)
    assert nerr(y, ref) <= 2 * e_torch + 1e-3, (nerr(y, ref), e_torch)
    assert torch.equal(gemm(), y)
    rows = ids == -1
    assert torch.equal(y[rows], gemm(has_lora=False)[rows])
    _, g, y_g = capture_graph(gemm)
    y_g.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y_g, y)


# ---- one adapter in the batch (the caller's max_adapters=1): the single-adapter kernels in bank mode

@pytest.mark.parametrize("M,N,r", [(16, 4096, 16), (16, 4096, 64), (64, 4096, 16), (64, 4096, 64),
                                   (16, 28672, 64), (64, 28672, 16), (64, 28672, 64), (37, 6144, 24),
                                   (256, 4096, 16), (256, 4096, 64), (256, 28672, 64), (200, 6144, 24)])
def test_one_adapter_hint_bank_mode(M, N, r):
    """The LoRA table's plan on a bank: bf16 vs the float64 reference, −1 rows equal the same plan's base product
    bit for bit, repeats bit-identical, and the route was taken — except in the bucket where the single-adapter op
    runs the Gluon v2 kernel (M 33–64, N ≥ 16384, r ≤ 16), which keeps the multi-LoRA plan."""
    from lowrank_gemm.kernels import lora_gemm as LG
    x, w, bank, ids, bias = make(M, N, 4096, 8, r)
    ids = torch.where(ids >= 0, 5, -1).to(torch.int32)
    routed = mg.one_adapter_plan(M, N, 4096, x, w, bank.bank_a, ids) is not None
    assert routed == (LG._v2_choice(M, N, 4096, r, x.device) is None)
    ref, e_t = ref_and_torch_err(x, w, bank, ids, bias)
    y = mg.multi_lora_linear(x, w, bank, ids, bias=bias, max_adapters=1)
    assert nerr(y, ref) <= 2 * e_t + 1e-3, (nerr(y, ref), e_t)
    assert torch.equal(y, mg.multi_lora_linear(x, w, bank, ids, bias=bias, max_adapters=1))
    base = mg.multi_lora_gemm(x, w, bank.bank_a, bank.bank_b, bank.ranks, bank.scales, ids, bias, has_lora=False,
                              adapters=1)
    rows = ids == -1
    assert torch.equal(y[rows], base[rows])
    assert LG.bank_plan(M, N, 4096, r, DT, x.device) is not None


@pytest.mark.parametrize("M,N,r", [(16, 4096, 16), (64, 28672, 64), (256, 4096, 64)])
def test_one_adapter_hint_wrong_stays_exact(M, N, r):
    x, w, bank, ids, bias = make(M, N, 4096, 8, r)          # up to 8 distinct adapters, hint says 1
    ref, e_t = ref_and_torch_err(x, w, bank, ids, bias)
    y = mg.multi_lora_linear(x, w, bank, ids, bias=bias, max_adapters=1)
    assert nerr(y, ref) <= 2 * e_t + 1e-3, (nerr(y, ref), e_t)


def _hinted_swap(x, w, bank, static_ids, bias, max_adapters, new_ids):
    """:func:`_graph_swap` of a call with the hint: slot 3 replaced by a new rank-8 adapter (scale 2), the ids moved
    to ``new_ids(gen)``."""
    def swap(gen):
        _new_adapter(bank, 3, gen, 2.0)
        return new_ids(gen)
    _graph_swap(lambda: mg.multi_lora_linear(x, w, bank, static_ids, bias=bias, max_adapters=max_adapters),
                x, w, bank, static_ids, bias, swap, seed=9)


def test_one_adapter_hint_cuda_graph_swap():
    """Captured once with the hint; the ids then move to another adapter, whose slot is replaced too: the replay
    gives the new adapter's result (the kernels pick the adapter on the device)."""
    x, w, bank, ids, bias = make(64, 4096, 4096, 4, 32)
    static_ids = torch.where(ids >= 0, 1, -1).to(torch.int32)
    _hinted_swap(x, w, bank, static_ids, bias, 1, lambda gen: torch.where(
        torch.rand(64, generator=gen, device="cuda") < 0.25, -1, 3).to(torch.int32))


# ---- a few adapters in the batch (max_adapters 2–4, rank 16/32): stacked bank mode

def _few(M, N, r, adapters, seed):
    """A batch of ``adapters`` distinct slots of an 8-slot bank (mixed ranks), some rows −1."""
    x, w, bank, ids, bias = make(M, N, 4096, 8, r, seed=seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    slots = torch.tensor([7, 2, 5, 0][:adapters], device="cuda", dtype=torch.int32)
    ids = slots[torch.randint(0, adapters, (M,), generator=g, device="cuda")]
    ids[:adapters] = slots
    ids[adapters:] = torch.where(torch.rand(M - adapters, generator=g, device="cuda") < 0.2, -1, ids[adapters:])
    return x, w, bank, ids.to(torch.int32), bias


def _check_hinted(x, w, bank, ids, bias, max_adapters):
    """A hinted call: bf16 vs the float64 reference, bit-identical on repeat, −1 rows equal the same launches' base
    product bit for bit. → (ref, PyTorch's own error)."""
    ref, e_t = ref_and_torch_err(x, w, bank, ids, bias)
    y = mg.multi_lora_linear(x, w, bank, ids, bias=bias, max_adapters=max_adapters)
    assert nerr(y, ref) <= 2 * e_t + 1e-3, (nerr(y, ref), e_t)
    assert torch.equal(y, mg.multi_lora_linear(x, w, bank, ids, bias=bias, max_adapters=max_adapters))
    base = mg.multi_lora_gemm(x, w, bank.bank_a, bank.bank_b, bank.ranks, bank.scales, ids, bias, has_lora=False,
                              adapters=max_adapters)
    rows = ids == -1
    assert torch.equal(y[rows], base[rows])
    return ref, e_t


@pytest.mark.parametrize("M,N,r,adapters", [(16, 4096, 16, 4), (64, 4096, 16, 4), (16, 28672, 16, 4),
                                            (64, 28672, 16, 4), (16, 4096, 16, 2), (64, 4096, 32, 2),
                                            (64, 28672, 32, 2), (37, 6144, 16, 3)])
def test_few_adapters_stacked_bank_mode(M, N, r, adapters):
    """The LoRA table's rank-D·r plan on the bank: the route taken, bf16 vs the float64 reference, −1 rows equal
    the same launches' base product bit for bit, repeats bit-identical."""
    from lowrank_gemm.kernels import lora_gemm as LG
    x, w, bank, ids, bias = _few(M, N, r, adapters, seed=M + adapters)
    route = mg.bank_route(M, N, 4096, x, w, bank.bank_a, ids, adapters)
    assert route is not None and route[2] == LG.next_pow2(adapters), route
    _check_hinted(x, w, bank, ids, bias, adapters)


@pytest.mark.parametrize("M,N", [(16, 4096), (64, 28672)])
def test_few_adapters_hint_wrong_stays_exact(M, N):
    x, w, bank, ids, bias = make(M, N, 4096, 8, 16, seed=4)     # up to 8 distinct adapters, hint says 2
    ref, e_t = ref_and_torch_err(x, w, bank, ids, bias)
    y = mg.multi_lora_linear(x, w, bank, ids, bias=bias, max_adapters=2)
    assert nerr(y, ref) <= 2 * e_t + 1e-3, (nerr(y, ref), e_t)


def test_few_adapters_cuda_graph_swap():
    """Captured once with max_adapters=4; the ids then move to other slots (one of them replaced with a new
    adapter of another rank): the replay serves the new set."""
    x, w, bank, ids, bias = _few(64, 4096, 16, 4, seed=21)
    new = torch.tensor([3, 1, 6], device="cuda", dtype=torch.int32)
    _hinted_swap(x, w, bank, ids.clone(), bias, 4,
                lambda gen: new[torch.randint(0, 3, (64,), generator=gen, device="cuda")])


@pytest.mark.parametrize("M,N,r,adapters", [(16, 4096, 16, 16), (16, 4096, 64, 4), (16, 28672, 16, 16),
                                            (64, 4096, 16, 8), (37, 6144, 32, 6)])
def test_wide_stacked_bank_mode_opt_in(M, N, r, adapters, monkeypatch):
    """LOWRANK_GEMM_ML_STACK_WIDE=1 (not routed: measured slower than the multi plan, session 23): a stacked rank
    above 64 on the rank-64 plan as split, the epilogue in rank chunks — the route taken, the reference, −1 rows
    equal the base product, repeats bit-identical."""
    from lowrank_gemm.kernels import lora_gemm as LG
    monkeypatch.setenv("LOWRANK_GEMM_ML_STACK_WIDE", "1")
    x, w, bank, _, bias = make(M, N, 4096, 16, r, seed=M + adapters)
    g = torch.Generator(device="cuda").manual_seed(adapters)
    slots = torch.randperm(16, generator=g, device="cuda")[:adapters].to(torch.int32)
    ids = slots[torch.arange(M, device="cuda") % adapters]
    ids = torch.where(torch.rand(M, generator=g, device="cuda") < 0.2, -1, ids)[torch.randperm(M, generator=g,
                                                                                               device="cuda")]
    route = mg.bank_route(M, N, 4096, x, w, bank.bank_a, ids, adapters)
    assert route is not None and route[0] == "split" and route[2] == LG.next_pow2(adapters), route
    ref, e_t = _check_hinted(x, w, bank, ids, bias, adapters)
    y_hint = mg.multi_lora_linear(x, w, bank, ids, bias=bias, max_adapters=max(2, adapters // 4))   # stragglers
    assert nerr(y_hint, ref) <= 2 * e_t + 1e-3
