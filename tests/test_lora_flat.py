"""``lora_flat_kernel`` (session 49 candidate): persistent tiles whose tile and K loops are one pipelined loop.

Interpreter (fp16): every variant against the float64 product on ragged shapes, fewer programs than tiles, NaN-poisoned
outputs. Ahead of time for sm_90: the flattened kernel with its branch by TMA keeps an MMA in flight and ptxas does
not serialize its wgmmas; with S and B by pointer loads ptxas reports C7515 (why the TMA form is the one measured)."""

import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from _lora import make, rel_err
from _sm90 import ptxas_stats
from lowrank_gemm.kernels import _lora_kernels as K_

MOD = "lowrank_gemm.kernels._lora_kernels"


def run_flat(x, w, s, b, bias, *, bm, bn, bk, br, grid, a=None, scale=1.0, sync=None, **flags):
    """y [M, N] (NaN-poisoned first) from lora_flat_kernel; ``s`` fp32 [S_SPLITS, M, r] (IN_GRID: written here)."""
    M, K = x.shape
    N, r = b.shape
    y = torch.full((M, N), float("nan"), dtype=x.dtype)
    a = a if a is not None else torch.zeros(r, K, dtype=x.dtype)
    sync = sync if sync is not None else torch.zeros(2, dtype=torch.int32)
    if flags.get("Y_TMA"):
        flags["y_desc"] = TensorDescriptor.from_tensor(y, [bm, bn // flags.get("Y_PIECES", 2)])
    K_.lora_flat_kernel[(grid,)](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
        TensorDescriptor.from_tensor(a, [br, bk]), s[0], sync, b, bias if bias is not None else y, y,
        TensorDescriptor.from_tensor(s, [1, bm, br]), TensorDescriptor.from_tensor(b, [bn, br]), M, N, K, r, scale,
        s.stride(1), s.stride(2), b.stride(0), b.stride(1), y.stride(0), y.stride(1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, BLOCK_R=br, GROUP_M=2, LOWRANK=True, HAS_BIAS=bias is not None,
        S_SPLITS=s.shape[0], PROXY_FENCE=False, **flags)
    return y


CASES = [   # M, N, K, r, tiles (bm, bn, bk, br), programs, flags, S slices
    (77, 136, 96, 8, (32, 64, 32, 16), 3, dict(FLATTEN=True, LORA_TMA=True), 3),
    (45, 72, 160, 8, (32, 32, 32, 16), 5, dict(FLATTEN=False, LORA_TMA=True), 1),
    (50, 96, 64, 16, (32, 64, 32, 16), 2, dict(FLATTEN=True, LORA_TMA=False), 1),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}r{c[3]}-{'-'.join(f'{k}{v:d}' for k, v in c[6].items())}-s{c[7]}")
@pytest.mark.parametrize("bias", [True, False])
def test_flat_matches_reference(case, bias):
    """S from outside (the down kernel's K slices), several programs striding over the tiles."""
    M, N, K, r, (bm, bn, bk, br), grid, flags, splits = case
    x, w, a, b, bb = make(M, N, K, r, bias=bias, seed=M + N)
    bb = bb if bias else None
    g = torch.Generator().manual_seed(K)
    s = torch.randn(splits, M, r, generator=g) * 0.3         # S's K slices, as the down kernel leaves them
    y = run_flat(x, w, s, b, bb, bm=bm, bn=bn, bk=bk, br=br, grid=grid, **flags)
    ref = x.double() @ w.double().T + s.sum(0).half().double() @ b.double().T
    if bias:
        ref += bb.double()
    assert not torch.isnan(y).any()
    assert rel_err(y, ref) < 2e-3


@pytest.mark.parametrize("M, N, K, r, slices", [(77, 136, 96, 8, 1), (130, 70, 200, 16, 1), (20, 64, 64, 16, 1),
                                                (130, 70, 200, 16, 3), (77, 136, 96, 8, 5)])
def test_flat_in_grid_s(M, N, K, r, slices):
    """IN_GRID: the S tasks computed by the kernel (scaled; in K slices whose partials the last task of a block sums
    — 5 slices of K = 96's three 32-wide tiles leave two empty), the first tile peeled, one wait; one program (the
    interpreter runs programs in order, and a program may not wait on a later one); every sync word ends at zero."""
    from lowrank_gemm.reference import lora_linear_ref
    x, w, a, b, bb = make(M, N, K, r, seed=M)
    s = torch.full((1, M, r), float("nan"))
    ws = torch.full((slices, M, r), float("nan"))
    sync = torch.zeros(2 + -(-M // 32), dtype=torch.int32)
    y = run_flat(x, w, s, b, bb, bm=32, bn=64, bk=32, br=16, grid=1, a=a, scale=0.7, sync=sync, IN_GRID=True,
                 ws_ptr=ws, stride_wk=ws.stride(0), s_slices=slices)
    assert rel_err(y, lora_linear_ref(x, w, a, b, 0.7, bb)) < 2e-3
    assert not sync.any()


@pytest.mark.parametrize("M, N, grid, slices", [(70, 136, 4, 1), (70, 136, 12, 1), (20, 64, 5, 1), (70, 136, 12, 3)])
def test_flat_s_tasks_on_one_program_of_a_wider_grid(M, N, grid, slices):
    """IN_GRID with ``s_programs`` = 1: program 0 runs every S task (the interpreter runs programs in order, so only
    the first may hold them), the others only tiles; with more programs than tiles (12 against 70 × 136's nine, 5
    against 20 × 64's one) the lowest hold no tile and must neither compute one nor count in the wait; every output
    element written (NaN-poisoned), every sync word back at zero."""
    from lowrank_gemm.reference import lora_linear_ref
    x, w, a, b, bb = make(M, N, 96, 16, seed=N)
    s = torch.full((1, M, 16), float("nan"))
    ws = torch.full((slices, M, 16), float("nan"))
    sync = torch.zeros(2 + -(-M // 32), dtype=torch.int32)
    y = run_flat(x, w, s, b, bb, bm=32, bn=64, bk=32, br=16, grid=grid, a=a, scale=0.7, sync=sync, IN_GRID=True,
                 ws_ptr=ws, stride_wk=ws.stride(0), s_slices=slices, s_programs=1)
    assert rel_err(y, lora_linear_ref(x, w, a, b, 0.7, bb)) < 2e-3
    assert not sync.any()


@pytest.mark.parametrize("pid_m, tiles, grid, k_tiles, want", [
    (8, 256, 132, 64, (1, 8)),        # 1024×8192 on 128×256 tiles: 8 programs with one tile fewer, 8 blocks
    (32, 1024, 132, 128, (1, 32)),    # 4096×8192: slack 32
    (32, 512, 132, 64, (1, 16)),      # 4096²: 16 programs with one tile fewer, two whole blocks each
    (8, 128, 132, 64, (1, 4)),        # 1024×4096²: one tile each on 128 programs, 4 spare programs, two blocks each
    (8, 128, 128, 64, (16, 128)),     # the same without spare programs: sixteen slices over every program
    (8, 128, 128, 8, (8, 128)),       # never more slices than K tiles
    (40, 520, 132, 64, (3, 132)),     # slack 8 < 40 / 2: three slices over every program
    (300, 9600, 132, 64, (1, 132)),   # more blocks than programs: whole blocks over every program
    (3, 2, 5, 4, (1, 3)),             # a grid wider than the tiles: three spare programs, one block each
])
def test_flat_s_tasks(pid_m, tiles, grid, k_tiles, want):
    from lowrank_gemm.kernels.schedule import flat_s_tasks
    assert flat_s_tasks(pid_m, tiles, grid, k_tiles) == want


@pytest.mark.parametrize("bm, bn, br, stages, want", [
    (128, 256, 64, 3, 6),      # r64: X + A stages in the room of 3 X + W stages
    (128, 256, 16, 4, 8),      # r16: 10 fit, capped at 8
    (128, 128, 64, 4, 5),
    (64, 64, 64, 2, 2),        # never fewer than the main loop's
])
def test_flat_s_stages(bm, bn, br, stages, want):
    from lowrank_gemm.kernels.lora_gemm import flat_s_stages
    from lowrank_gemm.plan.config import KernelConfig
    assert flat_s_stages(KernelConfig(block_m=bm, block_n=bn, block_k=64, block_r=br, num_stages=stages)) == want


@pytest.mark.parametrize("tiles, pid_m, want", [(128, 8, 132), (130, 8, 132), (3584, 32, 132), (4, 2, 6)])
def test_flat_programs_adds_spare_programs_for_s(tiles, pid_m, want):
    from lowrank_gemm.kernels.schedule import flat_programs
    assert flat_programs(tiles, pid_m, 132) == want


@pytest.mark.parametrize("M, N, in_grid, pieces", [(77, 136, False, 2), (130, 72, True, 2), (20, 40, True, 2),
                                                   (77, 136, False, 4), (20, 40, True, 4)])
def test_flat_y_by_tma_matches_pointer_stores(M, N, in_grid, pieces):
    """Y_TMA (session 52 candidate): Y stored by TMA in column pieces — the copy clips rows past M and columns past N
    (N = 40 on 64-wide tiles: the last tile column's second half lies wholly outside), every element written
    (NaN-poisoned), bit-identical to the pointer stores; with the S tasks in the grid too."""
    x, w, a, b, bb = make(M, N, 96, 16, seed=N)
    kw = dict(bm=32, bn=64, bk=32, br=16, FLATTEN=True, LORA_TMA=True)
    if in_grid:
        kw.update(grid=1, a=a, scale=0.7, IN_GRID=True, ws_ptr=torch.empty(1), stride_wk=0)
        ys = [run_flat(x, w, torch.full((1, M, 16), float("nan")), b, bb, sync=torch.zeros(2 + -(-M // 32),
                       dtype=torch.int32), Y_TMA=on, Y_PIECES=pieces, **kw) for on in (False, True)]
    else:
        s = torch.randn(2, M, 16, generator=torch.Generator().manual_seed(2))
        ys = [run_flat(x, w, s, b, bb, grid=3, Y_TMA=on, Y_PIECES=pieces, **kw) for on in (False, True)]
    assert not torch.isnan(ys[1]).any()
    assert torch.equal(ys[0], ys[1])


def test_aot_flat_y_by_tma():
    """sm_90: Y_TMA stores by bulk tensor copies from one staging buffer (no st.global of Y left in the bare kernel),
    keeps an MMA in flight; in halves it fits 3 stages with the S tasks in the grid at r16 and r64 but not the
    planner's 4 at r16 (device call 1 ran halves at 3), in quarters it fits those 4."""
    bm, bn, bk = 128, 256, 64
    from lowrank_gemm.kernels.aot import compile_sm90

    def comp(br, stages, pieces=2, **flags):
        sig = dict(flat_signature(bm, bn, bk, br), y_desc=f"tensordesc<bf16[{bm}, {bn // pieces}]>")
        return compile_sm90(MOD, "lora_flat_kernel", sig, dict(
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, BLOCK_R=br, GROUP_M=8, HAS_BIAS=False, FLATTEN=True, LORA_TMA=True,
            Y_TMA=True, Y_PIECES=pieces, **UNIT, **flags), num_warps=8, num_stages=stages, aligned=ALIGNED)
    bare = comp(16, 4, LOWRANK=False)
    assert bare.has("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group", "cp.async.bulk.wait_group.read",
                    "wgmma.wait_group.sync.aligned 1")
    assert "st.global" not in bare.ptx
    for br, stages, s_stages in ((16, 3, 8), (64, 3, 6)):
        assert comp(br, stages, LOWRANK=True, IN_GRID=True, S_STAGES=s_stages).shared <= 232448
    assert comp(16, 4, LOWRANK=True, IN_GRID=True, S_STAGES=8).shared > 232448
    # quarters (16 KB staging): the planner's 4 stages at r16 fit (221 232 B)
    quarters = comp(16, 4, pieces=4, LOWRANK=True, IN_GRID=True, S_STAGES=8)
    assert quarters.shared <= 232448 and quarters.has("wgmma.wait_group.sync.aligned 1")


def test_flat_same_result_flattened_or_not():
    """Flattening changes when loads are issued, not the arithmetic: bit-identical outputs."""
    x, w, a, b, bb = make(70, 136, 128, 8, seed=3)
    s = torch.randn(2, 70, 8, generator=torch.Generator().manual_seed(1))
    kw = dict(bm=32, bn=64, bk=32, br=16, grid=3, LORA_TMA=True)
    assert torch.equal(run_flat(x, w, s, b, bb, FLATTEN=True, **kw), run_flat(x, w, s, b, bb, FLATTEN=False, **kw))


def flat_signature(bm, bn, bk, br, dt="bf16"):
    return {"x_desc": f"tensordesc<{dt}[{bm}, {bk}]>", "w_desc": f"tensordesc<{dt}[{bn}, {bk}]>",
            "a_desc": f"tensordesc<{dt}[{br}, {bk}]>", "s_ptr": "*fp32", "sync_ptr": "*i32", "b_ptr": f"*{dt}",
            "bias_ptr": f"*{dt}", "y_ptr": f"*{dt}", "s_desc": f"tensordesc<fp32[1, {bm}, {br}]>",
            "b_desc": f"tensordesc<{dt}[{bn}, {br}]>", "M": "i32", "N": "i32", "K": "i32", "R": "i32", "scale": "fp32",
            "stride_sm": "i32", "stride_bn": "i32", "stride_ym": "i32", "ws_ptr": "*fp32", "stride_wk": "i32",
            "s_slices": "i32", "s_programs": "i32"}


UNIT = dict(stride_sr=1, stride_br=1, stride_yn=1)
ALIGNED = ("s_ptr", "sync_ptr", "b_ptr", "bias_ptr", "y_ptr", "M", "N", "K", "R", "stride_sm", "stride_bn", "stride_ym",
           "ws_ptr", "stride_wk")


def compile_flat(br=16, stages=4, trace=False, **flags):
    from lowrank_gemm.kernels.aot import compile_sm90
    bm, bn, bk = 128, 256, 64
    sig = dict(flat_signature(bm, bn, bk, br), **({"trace_ptr": "*i64"} if trace else {}))
    return compile_sm90(MOD, "lora_flat_kernel", sig, dict(
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, BLOCK_R=br, GROUP_M=8, LOWRANK=True, HAS_BIAS=False, TRACE=trace, **UNIT,
        **flags), num_warps=8, num_stages=stages, aligned=ALIGNED + (("trace_ptr",) if trace else ()))


@pytest.mark.parametrize("flags", [dict(S_SPLITS=1), dict(S_SPLITS=4), dict(IN_GRID=True),
                                   dict(IN_GRID=True, S_STAGES=8)], ids=str)
def test_aot_flat_tma_branch_keeps_the_mma_in_flight(flags):
    c = compile_flat(FLATTEN=True, LORA_TMA=True, **flags)
    assert c.has("wgmma.mma_async", "cp.async.bulk.tensor", "wgmma.wait_group.sync.aligned 1")
    if flags.get("IN_GRID"):     # S by plain stores, read by TMA: the proxy fence after the acquire
        assert c.has("fence.proxy.async.global", "ld.global.gpu.acquire")
    assert c.shared <= 232448      # 227 KiB: H100 / H200 per-block opt-in maximum
    stats = ptxas_stats(c.ptx)
    if stats is None:
        pytest.skip("no ptxas in this triton")
    assert "C7515" not in stats[2] and "C7514" not in stats[2], stats[2]


def test_aot_flat_trace_stamps_only_when_asked():
    """TRACE (probe_flat_trace.py): the global timer read at each of the six points and the SM id stored, the MMA
    still in flight; off (the default), none of it is in the kernel."""
    traced = compile_flat(FLATTEN=True, LORA_TMA=True, IN_GRID=True, S_STAGES=8, trace=True)
    assert traced.ptx.count("%globaltimer") == 6 and "%smid" in traced.ptx
    assert traced.has("wgmma.wait_group.sync.aligned 1")
    plain = compile_flat(FLATTEN=True, LORA_TMA=True, IN_GRID=True, S_STAGES=8)
    assert "%globaltimer" not in plain.ptx and "%smid" not in plain.ptx


def test_flat_trace_refused_where_it_cannot_run(monkeypatch):
    """The debug knob under the interpreter (no inline PTX) or in a wrong buffer: a clear error, not a launch."""
    from _lora import run
    from lowrank_gemm.kernels import lora_gemm
    x, w, a, b, bb = make(40, 64, 64, 8, seed=5)
    monkeypatch.setattr(lora_gemm, "KERNEL_TRACE", torch.zeros(4, K_.TRACE_SLOTS, dtype=torch.int64))
    with pytest.raises(ValueError, match="KERNEL_TRACE"):
        run("flat", x, w, a, b, 1.0, bb, flat_cfg(8))


def test_aot_flat_pointer_branch_serializes_the_wgmmas():
    """The finding behind the TMA form: the same kernel with S and B by pointer loads gets every wgmma serialized."""
    stats = ptxas_stats(compile_flat(FLATTEN=True, LORA_TMA=False).ptx)
    if stats is None:
        pytest.skip("no ptxas in this triton")
    assert "C7515" in stats[2]


# ---------------------------------------------------------------------------- the op's "flat" strategy

def flat_cfg(r, bm=32, bn=64, bk=32, stages=3):
    from lowrank_gemm.plan.config import KernelConfig
    return KernelConfig(block_m=bm, block_n=bn, block_k=bk, block_r=max(16, r), group_m=2, num_warps=4,
                        num_stages=stages)


@pytest.mark.parametrize("M, N, K, r, bias", [(77, 136, 96, 8, True), (130, 70, 200, 16, False), (33, 200, 64, 16, True),
                                              (5, 40, 52, 8, True)])
def test_flat_strategy_matches_reference(M, N, K, r, bias):
    """run_strategy("flat"): poisoned output, ragged M / N / K (K = 52 takes the padded TMA copy), S in the down
    kernel's K slices, bias or none, against the float64 reference."""
    from _lora import run
    from lowrank_gemm.reference import lora_linear_ref
    x, w, a, b, bb = make(M, N, K, r, bias=bias, seed=M * 3 + r)
    y = run("flat", x, w, a, b, 0.7, bb, flat_cfg(r))
    assert not torch.isnan(y).any()
    assert rel_err(y, lora_linear_ref(x, w, a, b, 0.7, bb)) < 2e-3


def test_flat_strategy_is_deterministic():
    from _lora import run
    x, w, a, b, bb = make(90, 130, 128, 16, seed=5)
    assert torch.equal(run("flat", x, w, a, b, 0.5, bb, flat_cfg(16)), run("flat", x, w, a, b, 0.5, bb, flat_cfg(16)))


@pytest.mark.parametrize("r, block_r, why", [(6, 16, "rank a multiple of 8"), (24, 16, "rank 24 > block_r 16"),
                                              (72, 128, "flat adds the rank in one chunk")])
def test_flat_strategy_refuses_what_it_cannot_run(r, block_r, why):
    from lowrank_gemm.plan.planner import can_implement
    ok = can_implement("flat", (64, 128, 256, r), flat_cfg(block_r))
    assert not ok and why in ok.reason


def test_flat_split_k_refused():
    from lowrank_gemm.plan.planner import can_implement
    ok = can_implement("flat", (64, 128, 256, 16), flat_cfg(16).replace(split_k=2))
    assert not ok and "does not split K" in ok.reason


LEDGER_CONFIGS = [   # (block_m, block_n, block_k, warps, stages, block_r, S slices — 0: IN_GRID, the op's form)
    (128, 256, 64, 8, 4, 16, 0), (128, 256, 64, 8, 3, 64, 0), (128, 128, 64, 4, 4, 16, 0), (128, 128, 64, 4, 4, 64, 0),
    (64, 128, 128, 4, 4, 16, 0), (256, 128, 64, 8, 3, 16, 0), (128, 256, 64, 8, 4, 16, 4), (128, 128, 64, 4, 5, 16, 1),
]


@pytest.mark.parametrize("pieces", [0, 2, 4], ids=["y_pointers", "y_tma_halves", "y_tma_quarters"])
@pytest.mark.parametrize("bm, bn, bk, warps, stages, br, splits", LEDGER_CONFIGS)
def test_flat_ledger_bounds_the_compiled_kernel(bm, bn, bk, warps, stages, br, splits, pieces):
    """The ledger never under-counts what the compiled kernel asks for (±1 KiB), and over-counts by at most the S/B
    term's documented slack (16 KiB): Y stored by pointers, or by TMA in halves or quarters (its staging piece)."""
    from lowrank_gemm.kernels.aot import compile_sm90
    from lowrank_gemm.plan.config import KernelConfig
    cfg = KernelConfig(block_m=bm, block_n=bn, block_k=bk, block_r=br, num_warps=warps, num_stages=stages)
    ledger = K_.smem_ledger(cfg, 16, "flat", y_pieces=pieces).total()
    consts = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, BLOCK_R=br, GROUP_M=8, LOWRANK=True, HAS_BIAS=True,
                  FLATTEN=True, LORA_TMA=True, S_SPLITS=splits, IN_GRID=splits == 0, **UNIT)
    consts["S_SPLITS"] = max(splits, 1)
    if splits == 0:     # the S tasks' own pipeline, as the op launches it: laid over the main loop's buffers
        from lowrank_gemm.kernels.lora_gemm import flat_s_stages
        consts["S_STAGES"] = flat_s_stages(cfg)
    sig = flat_signature(bm, bn, bk, br)
    if pieces:
        sig["y_desc"] = f"tensordesc<bf16[{bm}, {bn // pieces}]>"
        consts.update(Y_TMA=True, Y_PIECES=pieces)
    shared = compile_sm90(MOD, "lora_flat_kernel", sig, consts, num_warps=warps, num_stages=stages,
                          aligned=ALIGNED).shared
    assert shared - 1024 <= ledger <= shared + 16384 + 1024, (shared, ledger)


def test_planner_ledger_counts_the_y_piece_where_the_op_stores_y_by_tma(monkeypatch):
    """``lora_ledger`` is the ledger of the launch the op makes: the staging piece only where ``flat`` stores Y by
    TMA (128×128 on 4 warps: an 8 KiB quarter, 4 KiB of it beyond the flattened region's half)."""
    from lowrank_gemm.kernels import lora_gemm
    from lowrank_gemm.plan.config import KernelConfig
    from lowrank_gemm.plan.planner import lora_ledger
    cfg = KernelConfig(block_m=128, block_n=128, block_k=64, block_r=16, num_warps=4, num_stages=4)
    pointers = lora_ledger("flat", cfg).total()
    monkeypatch.setattr(lora_gemm, "Y_TMA_STRATEGIES", frozenset({"flat"}))
    assert lora_gemm.y_store_pieces("flat", cfg) == 4 and lora_gemm.y_store_pieces("split", cfg) == 0
    assert lora_ledger("flat", cfg).total() == pointers + 4096
    assert lora_ledger("split", cfg).total() == K_.smem_ledger(cfg, 16, "split").total()
    monkeypatch.setattr(lora_gemm, "Y_PIECES", 1)        # a whole 32 KiB tile: 28 KiB beyond
    assert lora_ledger("flat", cfg).total() == pointers + 28672


def test_flat_through_the_op():
    """``lora_linear(strategy="flat")``: the planner's plan for a pinned flat (rank 8 in a 16 block, no split-K)."""
    from lowrank_gemm.kernels.lora_gemm import lora_linear
    from lowrank_gemm.reference import lora_linear_ref
    x, w, a, b, bb = make(40, 72, 64, 8, seed=11)
    y = lora_linear(x, w, a, b, 0.9, bb, strategy="flat")
    assert rel_err(y, lora_linear_ref(x, w, a, b, 0.9, bb)) < 2e-3


def test_flat_no_memset_per_call_and_tickets_left_zero():
    """As every strategy (test_lora_gemm.py): the sync words come from the shared per-stream region, nothing is zeroed
    per call (a captured graph would replay it as a memset node), and the region is back at zero after each call."""
    from _lora import AtenOps, run, tickets_zero
    from lowrank_gemm.kernels.lora_gemm import run_strategy
    from lowrank_gemm.reference import lora_linear_ref
    for M, N, K in ((37, 70, 48), (9, 90, 64), (50, 20, 40)):
        x, w, a, b, bias = make(M, N, K, 8, seed=M)
        run("flat", x, w, a, b, 0.6, bias, flat_cfg(8))
        out = torch.full((M, N), float("nan"), dtype=x.dtype)
        with AtenOps() as ops:
            y = run_strategy("flat", x, w, a, b, 0.6, bias, flat_cfg(8), out=out)
        assert not [op for op in ops.seen if "zero" in op or "fill" in op], ops.seen
        assert tickets_zero()
        assert rel_err(y, lora_linear_ref(x, w, a, b, 0.6, bias)) < 2e-3


@pytest.mark.parametrize("M, N, K, r, routed", [
    (4096, 28672, 4096, 64, True), (4096, 8192, 8192, 64, True), (1024, 28672, 4096, 32, True),
    (4096, 28672, 4096, 16, False),    # r ≤ 16 on a wide layer: level with the tuned plan (s50a / s50c / s51b)
    (4096, 4096, 4096, 64, True),      # narrow: 32 S blocks, two on each of the 16 programs with one tile fewer
    (4096, 4096, 4096, 8, True),
    (1024, 4096, 4096, 64, True),      # narrow, one tile per program: two blocks on each of 4 spare programs
    (512, 4096, 4096, 16, False),      # narrow, half a wave
    (38400, 4096, 4096, 16, False),    # 300 blocks, 84 programs with one tile fewer: whole blocks on every program
    (1024, 8192, 8192, 64, False),     # ~2 waves of a wide layer
    (4096, 28672, 4096, 36, False),    # TMA rows of B / S: r a multiple of 8
    (4096, 28672, 4096, 128, False),   # the rank in one chunk: r ≤ 64
])
def test_flat_plan_routes_where_it_measured_ahead(M, N, K, r, routed):
    """The planner's flat rule on a 132-SM GPU (sessions 50–51, probes/s50/s50c, probes/s51/s51b)."""
    from lowrank_gemm.kernels.schedule import flat_s_tasks
    from lowrank_gemm.plan.planner import flat_plan
    plan = flat_plan(M, N, K, r, 16, 132)
    assert (plan is not None) == routed
    if routed:
        strategy, cfg = plan
        tiles = -(-M // cfg.block_m) * -(-N // cfg.block_n)
        slices, s_programs = flat_s_tasks(-(-M // cfg.block_m), tiles, 132, -(-K // cfg.block_k))
        assert strategy == "flat" and slices == 1 and s_programs < 132
    assert flat_plan(M, N, K, r, 8, 132) is None        # fp8 operands: not this kernel
