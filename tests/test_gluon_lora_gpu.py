"""GPU tests of the LoRA v2 kernel (kernels/gluon/lora_ws.py): numerics vs the float64 reference, ragged
shapes, persistent tile counts, both shrink modes, and the (index, phase) trace of every role.

Run ONLY after scripts/probe_lora_v2.py passed its correctness rungs (a warp-specialized kernel that hangs
never returns to Python); each test has a thread watchdog that dumps stacks and ends the process:
    PYTHONPATH=src python -m pytest -m gpu tests/test_gluon_lora_gpu.py -x -q -s
"""

import pytest
import torch
from _tiles import TILE_COUNT_CASES, tile_count

from lowrank_gemm.kernels.gluon import lora_ws as L
from lowrank_gemm.kernels.gluon import skeleton as sk
from lowrank_gemm.kernels.gluon.smoke import normalized_error
from lowrank_gemm.plan.config import KernelConfig

pytestmark = [pytest.mark.gpu]
WATCHDOG = dict(timeout=60, method="thread")
TOL = 1e-2      # bf16 output: one rounding of y, s rounded to bf16 before s·Bᵀ
SHRINKS = ["fused", "pre"]


def _check(M, N, K, rank=16, shrink="fused", grid=None, config=None, dtype=torch.bfloat16, bias=True, seed=0):
    print(f"\n[lora v2] M={M} N={N} K={K} r={rank} shrink={shrink} grid={grid} {dtype} bias={bias}", flush=True)
    ops = L.make_operands_v2(M, N, K, rank, device="cuda", dtype=dtype, bias=bias, seed=seed)
    out = L.launch_lora_v2(**ops, config=config, shrink=shrink, grid=grid)
    torch.cuda.synchronize()
    assert out.data_ptr() == ops["out"].data_ptr()
    ref = L.reference_v2(ops)
    got = out.cpu().double()
    bad = (~torch.isfinite(got)).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} unwritten/non-finite outputs, first at {bad[:5].tolist()}"
    err = normalized_error(out, ref)
    assert err < TOL, f"normalized max error {err:.3e} ≥ {TOL}"


@pytest.mark.timeout(**WATCHDOG)
@pytest.mark.parametrize("shrink", SHRINKS)
def test_single_tile_short_k(shrink):
    _check(17, 40, 64, shrink=shrink)


@pytest.mark.timeout(**WATCHDOG)
@pytest.mark.parametrize("shrink", SHRINKS)
@pytest.mark.parametrize("K", [64, 128, 448, 1000, 4096])
def test_k_loop_vs_ring_depth(shrink, K):
    _check(130, 136, K, shrink=shrink, grid=2)


@pytest.mark.timeout(**WATCHDOG)
@pytest.mark.parametrize("shrink", SHRINKS)
@pytest.mark.parametrize("which", TILE_COUNT_CASES)
def test_tile_counts(shrink, which):
    tiles = tile_count(which)
    # one row of 128-row tiles (M > 64 → BLOCK_M 128), ragged in M and N
    _check(128 - 5, 128 * tiles - 8, 256, shrink=shrink)


@pytest.mark.timeout(**WATCHDOG)
@pytest.mark.parametrize("shrink", SHRINKS)
@pytest.mark.parametrize("M,N,K,rank,bias", [(250, 300, 1000, 16, True), (61, 1003, 777, 5, True),
                                             (1, 4096, 4096, 16, False), (300, 260, 520, 64, True),
                                             (129, 8 * 131, 2048, 33, True)])
def test_ragged(shrink, M, N, K, rank, bias):
    _check(M, N, K, rank, shrink=shrink, bias=bias)


@pytest.mark.timeout(**WATCHDOG)
@pytest.mark.parametrize("shrink", SHRINKS)
def test_fp16(shrink):
    _check(100, 200, 512, 16, shrink=shrink, dtype=torch.float16)


@pytest.mark.timeout(**WATCHDOG)
def test_decode_tiles_64x256():
    cfg = L.default_config_v2(64, 0, 0, 16).replace(block_n=256)
    _check(64, 2048 + 8, 1024, 16, config=cfg)


@pytest.mark.timeout(**WATCHDOG)
@pytest.mark.parametrize("coop", [False, True], ids=["pingpong", "coop"])
@pytest.mark.parametrize("shrink", SHRINKS)
def test_debug_trace_matches_host_model(shrink, coop):
    """Every role's (index, phase) sequence of program 0 vs skeleton.expected_states_host (COOP: both consumers
    take every slot use, their halves of one tile)."""
    M, N, K = 3 * 128 - 5, 250, 640
    config = _coop("128x256") if coop else None
    ops = L.make_operands_v2(M, N, K, 16, device="cuda")
    out, dbg = L.launch_lora_v2(**ops, config=config, shrink=shrink, grid=1, debug=True)
    torch.cuda.synchronize()
    assert normalized_error(out, L.reference_v2(ops)) < TOL
    g, _, cx, cfg, _, _ = L.kernel_args_v2(**dict(ops, out=None), config=config, shrink=shrink, grid=1)
    want = sk.expected_role_states(g, M, N, K, cfg, {"loader": cx["STAGES"]}, cx["STAGES"])
    if coop:
        uses = list(range(len(want["loader"])))
        for c in range(sk.NUM_CONSUMERS):
            want[f"consumer{c}"] = sk.expected_states_host(uses, cx["STAGES"], producer=False)
    dbg = dbg.cpu()
    for name, seq in want.items():
        seq = seq[:L.DEBUG_ITERS_DEFAULT]
        got = [tuple(v) for v in dbg[0, L.LORA_ROLE_IDS[name], :len(seq)].tolist()]
        assert got == seq, f"{name}: got {got[:10]} want {seq[:10]}"


@pytest.mark.timeout(**WATCHDOG)
def test_cuda_graph_capture_replay():
    ops = L.make_operands_v2(64, 512, 1024, 16, device="cuda")
    x2 = ops["x"].clone()
    L.launch_lora_v2(**ops)   # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        L.launch_lora_v2(**dict(ops, x=x2))
    ops["out"].fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert normalized_error(ops["out"], L.reference_v2(ops)) < TOL


# COOP (num_warps 8): both consumers on one tile, a half of its rows each; one LOWRANK slot the loader refills
# during the next tile's K loop.
def _coop(tile):
    bm, bn = (int(v) for v in tile.split("x"))
    return KernelConfig(block_m=bm, block_n=bn, block_k=64, block_r=16, num_warps=8, num_stages=2)


@pytest.mark.timeout(**WATCHDOG)
@pytest.mark.parametrize("tile", ["128x256", "256x128"])
@pytest.mark.parametrize("shrink", SHRINKS)
@pytest.mark.parametrize("M,N,K,rank,bias,grid", [
    (17, 40, 64, 16, True, None),           # one tile, one K step: the LOWRANK fill before the first MAIN fill
    (250, 300, 1000, 16, True, None), (61, 1003, 777, 5, True, None), (300, 260, 520, 64, True, None),
    (129, 8 * 131, 2048, 33, False, None),
    (700, 1100, 192, 16, True, 3),          # many tiles per program, K steps < ring depth: the one slot's reuse
    (520, 2000, 4096, 64, True, 5)])
def test_coop_ragged(tile, shrink, M, N, K, rank, bias, grid):
    _check(M, N, K, rank, shrink=shrink, bias=bias, grid=grid, config=_coop(tile))


@pytest.mark.timeout(**WATCHDOG)
def test_coop_deterministic():
    ops = L.make_operands_v2(300, 1000, 2048, 16, device="cuda")
    a = L.launch_lora_v2(**dict(ops, out=None), config=_coop("128x256"), shrink="pre")
    b = L.launch_lora_v2(**dict(ops, out=None), config=_coop("128x256"), shrink="pre")
    assert torch.equal(a, b)
