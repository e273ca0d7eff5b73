"""The kcat LoRA strategy on the CPU (interpreter, fp16): the x-concat kernel, the packed layout, the op."""

import pytest
import torch

from lowrank_gemm.kernels import lora_gemm as LG
from lowrank_gemm.kernels.lora_gemm import kcat_preferred, lora_linear, run_strategy
from lowrank_gemm.kernels.lora_kcat import build_xcat, pack_lora_weights, packed_wcat, r_padded
from lowrank_gemm.plan.planner import heuristic_lora, pinned
from lowrank_gemm.reference import lora_linear_ref


def make(M, N, K, r, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).half()
    w = (torch.randn(N, K, generator=g) / K ** 0.5).half()
    a = (torch.randn(r, K, generator=g) / K ** 0.5).half()
    b = torch.randn(N, r, generator=g).half()
    return x, w, a, b, torch.randn(N, generator=g).half()


def rel_err(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("M,K,r,split,block_m", [(37, 72, 5, None, None), (50, 600, 24, 3, 16), (50, 600, 24, 5, 32),
                                                  (70, 1000, 64, None, 64), (3, 40, 1, 1, 16),
                                                  (1100, 300, 8, None, None)])     # the M ≥ 1024 plan
def test_xcat_copies_x_and_appends_scaled_s(M, K, r, split, block_m):
    x, _, a, _, _ = make(M, 8, K, r)
    rp = r_padded(r)
    out = torch.full((M, K + rp), float("nan"), dtype=x.dtype)
    bk = 128 if M >= 1024 else 64
    xc = build_xcat(x, a, 0.7, rp, split=split, block_m=block_m, block_k=bk, out=out)
    assert torch.equal(xc[:, :K], x)
    s = 0.7 * x.double() @ a.double().t()
    torch.testing.assert_close(xc[:, K:K + r].double(), s, atol=2e-3, rtol=2e-3)
    assert torch.equal(xc[:, K + r:], torch.zeros(M, rp - r, dtype=x.dtype)), "pad columns must be written zero"
    again = build_xcat(x, a, 0.7, rp, split=split, block_m=block_m, block_k=bk)
    assert torch.equal(xc, again), "deterministic (the slices' S summed in slice order)"


def test_packed_layout_views_and_detection():
    _, w, _, b, _ = make(4, 24, 40, 5)
    wv, bv = pack_lora_weights(w, b)
    assert torch.equal(wv, w) and torch.equal(bv, b)
    wcat = packed_wcat(wv, bv)
    assert wcat is not None and wcat.shape == (24, 40 + 64)
    assert torch.equal(wcat[:, 45:], torch.zeros(24, 59, dtype=w.dtype))
    assert packed_wcat(w, b) is None                              # separate tensors
    assert packed_wcat(wv, b) is None and packed_wcat(w, bv) is None
    assert packed_wcat(wv[:, :39], bv) is None                    # not adjacent
    assert packed_wcat(wv[1:], bv[1:]) is not None                # a row slice keeps the layout
    assert packed_wcat(wv[:-1], bv[1:]) is None                   # different rows
    assert packed_wcat(wv.float(), bv.float()) is None            # copies


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("M,N,K,r", [(37, 70, 88, 8), (21, 50, 40, 3), (40, 33, 200, 64), (13, 30, 75, 5)])
def test_kcat_strategy_matches_reference(packed, M, N, K, r):
    x, w, a, b, bias = make(M, N, K, r)
    if packed:
        w, b = pack_lora_weights(w, b)
    LG.clear_weight_cache()
    with pinned(strategy="kcat"):
        y = lora_linear(x, w, a, b, 0.7, bias)
    ref = lora_linear_ref(x, w, a, b, 0.7, bias)
    assert rel_err(y, ref) < 2e-3
    if K % 8 == 0:      # else x, W and A are padded copies: a derived weight per call, evicted with its source
        assert bool(LG._WEIGHT_CACHE.entries) == (not packed), "packed: the view, no derived weight"
    out = torch.full((M, N), float("nan"), dtype=x.dtype)
    cfg = heuristic_lora(M, N, K, r, 16, gpu=False, sms=4, strategy="kcat")[1]
    y2 = run_strategy("kcat", x, w, a, b, 0.7, None, cfg, out=out)
    assert not y2.isnan().any() and rel_err(y2, lora_linear_ref(x, w, a, b, 0.7, None)) < 2e-3


def test_packed_views_work_for_every_strategy():
    """Other strategies take the packed views as they are (16-byte row pitch): same result as unpacked."""
    x, w, a, b, bias = make(20, 48, 64, 8)
    wv, bv = pack_lora_weights(w, b)
    for s in ("kloop", "split", "streams"):
        with pinned(strategy=s):
            torch.testing.assert_close(lora_linear(x, wv, a, bv, 0.5, bias), lora_linear(x, w, a, b, 0.5, bias),
                                       rtol=0, atol=0)


def test_auto_rule():
    assert kcat_preferred(2048, 28672, 4096, 16) and kcat_preferred(4096, 28672, 4096, 64, "persistent_static")
    # M in [1024, 2048): kcat beats the planner's split, not a tuned persistent plan (session 16)
    assert kcat_preferred(1024, 28672, 4096, 16) and kcat_preferred(1500, 9000, 3000, 24, "split")
    assert not kcat_preferred(1024, 28672, 4096, 16, "persistent_static")
    assert not kcat_preferred(256, 28672, 4096, 16)          # memory-bound: the copy of x is not free
    assert not kcat_preferred(4096, 8192, 8192, 16)          # N = K: the concat is ~7 % of the GEMM (measured)
    assert not kcat_preferred(4096, 28672, 4096, 256)
