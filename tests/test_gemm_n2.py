"""The two-block-wide GEMM probe kernel (``kernels/gemm_n2.py``): right on ragged shapes under the interpreter (fp16),
every element written, and its sm_90 compile (two wgmma widths per K step, TMA loads and stores, no spill)."""

import pytest
import torch

from lowrank_gemm.kernels.gemm_n2 import gemm_n2, n2_ledger, n2_stages, n2_tiles
from lowrank_gemm.plan.smem import SM90_SMEM_LIMIT


def rel_err(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("M,N,K,bn0,bn1", [(37, 104, 88, 32, 16), (64, 96, 48, 32, 32), (5, 200, 40, 64, 16)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_matches_reference_and_writes_every_element(M, N, K, bn0, bn1, with_bias):
    g = torch.Generator().manual_seed(M)
    x = torch.randn(M, K, generator=g).half()
    w = (torch.randn(N, K, generator=g) / K ** 0.5).half()
    bias = torch.randn(N, generator=g).half() if with_bias else None
    out = torch.full((M, N), float("nan"), dtype=torch.float16)
    y = gemm_n2(x, w, bias, block_m=16, block_n0=bn0, block_n1=bn1, block_k=16, group_m=2, num_warps=4, stages=2,
                out=out)
    assert not y.isnan().any()
    ref = x.double() @ w.double().T + (bias.double() if with_bias else 0)
    assert rel_err(y, ref) < 2e-3


def test_bad_input():
    x, w = torch.randn(4, 32).half(), torch.randn(16, 32).half()
    with pytest.raises(ValueError, match="one K"):
        gemm_n2(x, w[:, :16])
    with pytest.raises(TypeError, match="one dtype"):
        gemm_n2(x, w.float())
    with pytest.raises(ValueError, match="multiples of 8"):
        gemm_n2(torch.randn(4, 12).half(), torch.randn(16, 12).half())
    with pytest.raises(ValueError, match="block_n1"):
        gemm_n2(x, w, block_n1=48)


def test_tiles_and_stages():
    assert n2_tiles(256, 11008, 128, 128, 64) == 2 * 58          # 116 tiles: 0.88 of 132 SMs' wave
    assert [n2_stages(128, 128, n1, 64) for n1 in (32, 64, 128)] == [6, 5, 4]
    ledger = n2_ledger(128, 128, 64, 64, 5)
    assert ledger.term("x tile").total(1) == 5 * 128 * 64 * 2 and ledger.term("W blocks").total(1) == 5 * 192 * 64 * 2
    assert ledger.total() == 204800 + 40 and not n2_ledger(128, 128, 64, 64, 6).fits()
    from lowrank_gemm.plan.smem import SmemError
    with pytest.raises(SmemError, match="cannot stage"):
        n2_stages(128, 256, 256, 16)          # 6 stages of 20 KB cannot hold a 128×512 output tile


def test_sm90_compile_has_two_wgmma_widths_and_tma():
    """128 × (128 + 64) at its ring depth: one x tile feeds an m64n128 and an m64n64 wgmma per K step, loads and
    stores by TMA, within the shared memory and without spills."""
    from _sm90 import ptxas_stats

    from lowrank_gemm.kernels.aot import compile_sm90
    stages = n2_stages(128, 128, 64, 64)
    sig = {"x_desc": "tensordesc<bf16[128, 64]>", "w0_desc": "tensordesc<bf16[128, 64]>",
           "w1_desc": "tensordesc<bf16[64, 64]>", "y0_desc": "tensordesc<bf16[128, 128]>",
           "y1_desc": "tensordesc<bf16[128, 64]>", "bias_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32"}
    c = compile_sm90("lowrank_gemm.kernels.gemm_n2", "gemm_n2_kernel", sig, dict(
        BLOCK_M=128, BLOCK_N0=128, BLOCK_N1=64, BLOCK_K=64, GROUP_M=2, HAS_BIAS=True, STAGES=stages), num_warps=8)
    assert c.has("wgmma.mma_async.sync.aligned.m64n128k16", "wgmma.mma_async.sync.aligned.m64n64k16",
                 "cp.async.bulk.tensor")
    assert abs(c.shared - n2_ledger(128, 128, 64, 64, stages).total()) <= 64     # the ledger, term by term
    assert c.shared <= SM90_SMEM_LIMIT
    stats = ptxas_stats(c.ptx)
    if stats is not None:
        assert stats[1] == 0, stats[2]


@pytest.mark.gpu
@pytest.mark.parametrize("M,K,N", [(256, 4096, 11008), (300, 1000, 5000), (1024, 8192, 3072)])
@pytest.mark.parametrize("bm,bn0,bn1,warps", [(128, 128, 64, 8), (128, 128, 32, 8), (64, 128, 64, 4)])
def test_gpu_bf16_real_sizes(M, K, N, bm, bn0, bn1, warps):
    g = torch.Generator(device="cuda").manual_seed(M)
    x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    w = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).bfloat16()
    bias = torch.randn(N, device="cuda", generator=g).bfloat16()
    ys = []
    for _ in range(2):
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        ys.append(gemm_n2(x, w, bias, block_m=bm, block_n0=bn0, block_n1=bn1, num_warps=warps, out=out))
    torch.cuda.synchronize()
    assert not ys[0].isnan().any()
    assert rel_err(ys[0], x.double() @ w.double().T + bias.double()) < 1e-2
    assert torch.equal(ys[0], ys[1])
