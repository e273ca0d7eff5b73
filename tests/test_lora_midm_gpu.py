"""Session 5 LoRA variants on the H200 in bf16 (``pytest -m gpu``): the one-launch mid-M split-K
(chunked FIXUP reduction; the partial-last-wave "hybrid" grid at 224 tiles), and the launch options
(``LoraOptions``: epilogue prefetch and PDL must not change a bit; the full-rank down kernel stays
within tolerance), eager and as CUDA-graph replays. Tolerance 1e-2 relative to float64 (as
test_lora_gemm_gpu.py).
"""

import pytest
import torch

from lowrank_gemm.bench.common import capture_graph
from lowrank_gemm.kernels import lora_gemm as LG
from lowrank_gemm.kernels.lora_gemm import lora_linear, lora_options, run_strategy
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.plan.planner import can_implement, fixup_dp_tiles, pinned
from lowrank_gemm.reference import lora_linear_ref

from test_lora_gemm_gpu import TOL, make, rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]

SPLIT4 = KernelConfig(block_m=128, block_n=256, block_k=64, block_r=16, group_m=2, num_warps=8, num_stages=4,
                      split_k=4, split_mode="fixup")
CHUNKED = KernelConfig(block_m=128, block_n=128, block_k=64, block_r=16, group_m=2, num_warps=4, num_stages=5,
                       split_k=2, split_mode="fixup")
CASES = [  # (strategy, (M, N, K, r), config)
    ("split", (256, 4096, 4096, 16), SPLIT4),
    ("kloop", (256, 4096, 4096, 16), SPLIT4),
    ("merged", (256, 4096, 4096, 16), CHUNKED),
    ("kloop", (250, 4000, 4096, 8), CHUNKED),               # ragged M and N in the last tiles
    ("split", (256, 28672, 4096, 16), SPLIT4),              # 224 tiles: 132 whole + 92 split 4 ways
    ("kloop", (256, 28672, 4096, 64), SPLIT4.replace(block_r=64)),
]


def _tickets_zero():
    torch.cuda.synchronize()
    return LG._TICKETS.all_zero(torch.device("cuda", torch.cuda.current_device()))


@pytest.mark.parametrize("strategy, shape, cfg", CASES, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else None)
def test_one_launch_mid_m_bf16(strategy, shape, cfg):
    M, N, K, r = shape
    assert can_implement(strategy, shape, cfg)
    x, w, a, b, bias = make(M, N, K, r, seed=M + r)
    ys = []
    for _ in range(3):
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        LG.clear_weight_cache()
        ys.append(run_strategy(strategy, x, w, a, b, 0.5, bias, cfg, out=out))
    assert not ys[0].isnan().any()
    assert rel_err(ys[0], lora_linear_ref(x, w, a, b, 0.5, bias)) < TOL
    assert all(torch.equal(ys[0], y) for y in ys[1:]), "not bit-identical across calls"
    assert _tickets_zero()
    if N == 28672:
        assert fixup_dp_tiles(2 * 112, cfg.split_k, LG.num_sms(x.device)) > 0


@pytest.mark.parametrize("strategy, cfg", [("split", SPLIT4), ("kloop", SPLIT4), ("split", SPLIT4.replace(split_k=1)),
                                           ("kloop", CHUNKED.replace(split_k=1))])
def test_prefetch_and_pdl_bit_identical_eager_and_graph(strategy, cfg):
    M, N, K, r = 256, 4096, 4096, 16
    x, w, a, b, bias = make(M, N, K, r)
    fn = lambda: lora_linear(x, w, a, b, 0.5, bias)
    with pinned(strategy=strategy, config=cfg):
        base = fn()
        with lora_options(prefetch=True, pdl=True):
            eager, g, y = capture_graph(fn)
            g.replay()
    torch.cuda.synchronize()
    assert torch.equal(base, eager) and torch.equal(base, y)
    assert rel_err(base, lora_linear_ref(x, w, a, b, 0.5, bias)) < TOL
    assert _tickets_zero()


def test_down_full_rank_bf16():
    M, N, K, r = 1024, 4096, 4096, 64
    x, w, a, b, bias = make(M, N, K, r)
    cfg = SPLIT4.replace(split_k=1)
    ref = lora_linear_ref(x, w, a, b, 0.5, bias)
    with pinned(strategy="split", config=cfg), lora_options(down_full_rank=True, pdl=True):
        y = lora_linear(x, w, a, b, 0.5, bias)
    assert rel_err(y, ref) < TOL
