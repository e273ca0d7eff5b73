"""W4A4 int4_g64 v2 with four consumer warpgroups ("quad"): the no-expander e4m3 route, one CTA tile of 128×128
split into four 64×64 consumer tiles that share every MAIN slot.

Why: ncu of the routed no-expander kernel (gluon/w4a4_ws.py, coop, in flight; NOTES.md session 25) found its K loop
issue-bound *and* latency-bound at once: 372 SASS instructions per consumer warp per two groups (256 of them the
standard format's two FFMAs per element per group), but only two consumer warps per scheduler — all that 64×128
accumulators plus two in-flight partials leave room for — issuing once every 1.9 cycles (short scoreboard on the
scale-row loads, barrier and fence waits, the MMA). Four consumers of 64×64 hold a quarter of the registers each
(accumulator 32 + one partial 32 + 16 w_scale values per thread), so four warps per scheduler were to hide each
other's waits; each consumer has no in-flight partial of its own, the other three were to be its overlap.

Per K step (one group of 64) the loader TMAs one MAIN slot: x e4m3 [128, 64] (``expand_act_f8`` / act_quant's
exact q), the weights' e4m3 offset nibbles [128, 64] (``expand_w4(offset=True)``, per call), the fp32 rows a, b of
the 128 tokens (xab) and the fp32 w_scale row of the 128 columns — one ``expect``. Consumer (cm, cn) multiplies rows
cm·64… of x by rows cn·64… of w (slices of the slot), loads its rows a, b and its 64 w_scale values, waits for its
MMA, folds ``acc = fma(fma(P', a, b), ws, acc)`` — the same FMA per element and group order as the other e4m3
routes, so the outputs are bit-identical to them — then fences (plain loads before a TMA refill:
skeleton.reads_done_before_refill) and releases the slot (four arrivals empty it). Epilogue per consumer:
× col_scale, + s·lora_upᵀ (16-bit wgmma from the LOWRANK slot, also shared by the four), + bias, TMA store from its
own staging buffer.

Measured (H200, GEMM alone, same process, probes/s28/call1–2): **slower than the routed coop kernel** — fc1 665 µs
against 559, 3072² 180 against 149 — so it is not routed (``LOWRANK_GEMM_V2_QUAD=1`` or ``quad=True`` runs it). ncu:
1.2 eligible warps per scheduler, issue slots 50 % busy; four warps per scheduler did not issue more often than two,
they waited on the per-warp proxy fence (MEMBAR), the LDS queue (MIO) and the slot barriers instead.

Roles (:data:`QUAD_ROLES`): the four consumers (the default partition is consumer (0, 0)) and a one-warp loader.
Five warpgroups start at 96 registers a thread (65536 / 640, multiples of 8); the loader gives back to 24 and the
consumers take the rest evenly.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                               warpgroup_mma, warpgroup_mma_wait)
from triton.language.core import _aggregate as aggregate

from ...plan.config import KernelConfig
from ...plan.smem import SmemLedger, SmemTerm, Scope, barrier_bytes, solve_stages, tile_bytes
from ..env import getenv
from ..epilogue import rank_block
from ..launch import launch
from ..schedule import cdiv, persistent_grid
from .host import desc, dummy
from .w4a4_ws import (FMT_INT4_G, _BITS, _epi_tma, _expect, _f8_operands, _fmt_id, _pad_rank, _row_desc,
                      check_out, f8_default, f8_expanders_default)
from .skeleton import (GroupedTileScheduler, Pipeline, RoleSpec, Ring, bias_and_store, consumer_state,
                       make_pipeline, producer_state)

__all__ = ["QUAD_ROLES", "QUAD_CONSUMERS", "quad_default", "quad_route", "quad_ledger", "plan_quad", "quad_supported",
           "launch_w4a4_quad", "w4a4_quad_kernel", "aot_signature_quad"]

QUAD_CONSUMERS = 4
_INITIAL_REGS = (65536 // (128 * 5)) // 8 * 8          # 96: five warpgroups at launch
_LOADER_REGS = 24
_CONSUMER_REGS = (5 * _INITIAL_REGS - _LOADER_REGS) // QUAD_CONSUMERS // 8 * 8     # 112 (the default partition: 120)
QUAD_ROLES: tuple[RoleSpec, ...] = (
    RoleSpec("consumer00", 4, None, "rows 0–63 × columns 0–63 of the CTA tile: wgmma, rescale, epilogue"),
    RoleSpec("loader", 1, _LOADER_REGS, "TMA of MAIN (x, w, xab rows, w_scale row) and LOWRANK (s, lora_up)"),
    RoleSpec("consumer01", 4, _CONSUMER_REGS, "rows 0–63 × columns 64–127"),
    RoleSpec("consumer10", 4, _CONSUMER_REGS, "rows 64–127 × columns 0–63"),
    RoleSpec("consumer11", 4, _CONSUMER_REGS, "rows 64–127 × columns 64–127"),
)
_WORKER_WARPS = gl.constexpr([r.warps for r in QUAD_ROLES[1:]])
_WORKER_REGS = gl.constexpr([r.regs for r in QUAD_ROLES[1:]])
_NC = gl.constexpr(QUAD_CONSUMERS)
BLOCK = 64                 # each consumer's tile is BLOCK × BLOCK; the CTA's is 2·BLOCK × 2·BLOCK


@aggregate
class QuadArgs:
    x_desc: tma.tensor_descriptor      # e4m3 [M, K] box [2·BM, BK]
    w_desc: tma.tensor_descriptor      # e4m3 [N, K] box [2·BN, BK] (offset nibbles)
    s_desc: tma.tensor_descriptor      # fp32 [M, R] box [2·BM, BR]
    b_desc: tma.tensor_descriptor      # 16-bit [N, R] box [2·BN, BR]
    out_desc: tma.tensor_descriptor    # 16-bit [M, N] box [BM, BN] (EPI_TMA only)
    sc_desc: tma.tensor_descriptor     # xab fp32 [K/G·2·M] 1-D, box [2·BM]
    sw_desc: tma.tensor_descriptor     # w_scale fp32 [K/G·N] 1-D, box [2·BN]
    x_bufs: gl.shared_memory_descriptor    # MAIN [S, 2·BM, BK] e4m3
    w_bufs: gl.shared_memory_descriptor    # MAIN [S, 2·BN, BK] e4m3
    sx_bufs: gl.shared_memory_descriptor   # MAIN [2·S, 2·BM] fp32 (a, b rows)
    sw_bufs: gl.shared_memory_descriptor   # MAIN [S, 2·BN] fp32
    s_bufs: gl.shared_memory_descriptor    # LOWRANK [L, 2·BM, BR] fp32
    b_bufs: gl.shared_memory_descriptor    # LOWRANK [L, 2·BN, BR] 16-bit
    epi_bufs: gl.shared_memory_descriptor  # EPILOGUE [4, BM, BN]
    main: Pipeline
    lowrank: Pipeline
    out_ptr: gl.tensor
    stride_om: gl.tensor
    col_scale_ptr: gl.tensor
    bias_ptr: gl.tensor
    M: gl.tensor
    N: gl.tensor
    K: gl.tensor
    BLOCK_M: gl.constexpr
    BLOCK_N: gl.constexpr
    BLOCK_K: gl.constexpr
    BLOCK_R: gl.constexpr
    GROUP_M: gl.constexpr
    HAS_LOWRANK: gl.constexpr
    HAS_COL_SCALE: gl.constexpr
    HAS_BIAS: gl.constexpr
    EPI_TMA: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, x_desc, w_desc, s_desc, b_desc, out_desc, sc_desc, sw_desc, x_bufs, w_bufs, sx_bufs, sw_bufs,
                 s_bufs, b_bufs, epi_bufs, main, lowrank, out_ptr, stride_om, col_scale_ptr, bias_ptr, M, N, K,
                 BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_R, GROUP_M, HAS_LOWRANK, HAS_COL_SCALE, HAS_BIAS, EPI_TMA):
        self.x_desc = x_desc
        self.w_desc = w_desc
        self.s_desc = s_desc
        self.b_desc = b_desc
        self.out_desc = out_desc
        self.sc_desc = sc_desc
        self.sw_desc = sw_desc
        self.x_bufs = x_bufs
        self.w_bufs = w_bufs
        self.sx_bufs = sx_bufs
        self.sw_bufs = sw_bufs
        self.s_bufs = s_bufs
        self.b_bufs = b_bufs
        self.epi_bufs = epi_bufs
        self.main = main
        self.lowrank = lowrank
        self.out_ptr = out_ptr
        self.stride_om = stride_om
        self.col_scale_ptr = col_scale_ptr
        self.bias_ptr = bias_ptr
        self.M = M
        self.N = N
        self.K = K
        self.BLOCK_M = gl.constexpr(BLOCK_M)
        self.BLOCK_N = gl.constexpr(BLOCK_N)
        self.BLOCK_K = gl.constexpr(BLOCK_K)
        self.BLOCK_R = gl.constexpr(BLOCK_R)
        self.GROUP_M = gl.constexpr(GROUP_M)
        self.HAS_LOWRANK = gl.constexpr(HAS_LOWRANK)
        self.HAS_COL_SCALE = gl.constexpr(HAS_COL_SCALE)
        self.HAS_BIAS = gl.constexpr(HAS_BIAS)
        self.EPI_TMA = gl.constexpr(EPI_TMA)


@gluon.jit
def _scheduler(p):
    return GroupedTileScheduler.initialize(p.M, p.N, 2 * p.BLOCK_M, 2 * p.BLOCK_N, p.GROUP_M)


@gluon.jit
def _loader(p):
    """Per tile its LOWRANK slot, then per K step one MAIN slot (five TMA copies behind one expect)."""
    sched = _scheduler(p)
    k_tiles = gl.cdiv(p.K, p.BLOCK_K)
    main = producer_state(p.main.num_stages)
    lr = producer_state(p.lowrank.num_stages)
    main_bytes: gl.constexpr = (p.x_desc.block_type.nbytes + p.w_desc.block_type.nbytes
                                + 2 * p.sc_desc.block_type.nbytes + p.sw_desc.block_type.nbytes)
    for t in range(sched.get_num_tiles()):
        pid_m, pid_n = sched.get_tile(t)
        off_m = pid_m * (2 * p.BLOCK_M)
        off_n = pid_n * (2 * p.BLOCK_N)
        if p.HAS_LOWRANK:
            p.lowrank.producer_acquire(lr)
            bar = p.lowrank.ready_bar(lr)
            mbarrier.expect(bar, p.s_desc.block_type.nbytes + p.b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(p.s_desc, [off_m, 0], bar, p.s_bufs.index(lr.index))
            tma.async_copy_global_to_shared(p.b_desc, [off_n, 0], bar, p.b_bufs.index(lr.index))
            lr = lr.next()
        for kk in range(k_tiles):
            p.main.producer_acquire(main)
            bar = p.main.ready_bar(main)
            mbarrier.expect(bar, main_bytes)
            # 1-D row boxes: one running past its row reads the next row's values into rows never stored (their
            # operands are TMA zero fill); past the end: zeros
            tma.async_copy_global_to_shared(p.sc_desc, [(2 * kk) * p.M + off_m], bar, p.sx_bufs.index(2 * main.index))
            tma.async_copy_global_to_shared(p.sc_desc, [(2 * kk + 1) * p.M + off_m], bar,
                                            p.sx_bufs.index(2 * main.index + 1))
            tma.async_copy_global_to_shared(p.sw_desc, [kk * p.N + off_n], bar, p.sw_bufs.index(main.index))
            tma.async_copy_global_to_shared(p.x_desc, [off_m, kk * p.BLOCK_K], bar, p.x_bufs.index(main.index))
            tma.async_copy_global_to_shared(p.w_desc, [off_n, kk * p.BLOCK_K], bar, p.w_bufs.index(main.index))
            main = main.next()


@gluon.jit
def _epilogue(p, acc, lr, off_m, off_n, CM: gl.constexpr, CN: gl.constexpr, mma: gl.constexpr):
    """× col_scale → + s·lora_upᵀ (16-bit wgmma, K = BLOCK_R, s rounded like an unfused s @ B.T) → + bias → store."""
    if p.HAS_COL_SCALE:
        offs_n = off_n + gl.arange(0, p.BLOCK_N, gl.SliceLayout(0, mma))
        cs = gl.load(p.col_scale_ptr + offs_n, mask=offs_n < p.N, other=0.0).to(gl.float32)
        acc = acc * cs[None, :]
    if p.HAS_LOWRANK:
        lr_dtype: gl.constexpr = p.b_desc.dtype
        mma16: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                        instr_shape=[16, p.BLOCK_N, 16])
        s_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma16, k_width=2)
        acc16 = gl.convert_layout(acc, mma16, assert_trivial=True)
        p.lowrank.consumer_wait(lr)
        s = p.s_bufs.index(lr.index).slice(CM * p.BLOCK_M, p.BLOCK_M, dim=0).load(s_layout).to(lr_dtype)
        # synchronous: the MMA has consumed s (and read lora_up) before the slot goes back
        acc16 = warpgroup_mma(s, p.b_bufs.index(lr.index).slice(CN * p.BLOCK_N, p.BLOCK_N, dim=0).permute((1, 0)),
                              acc16)
        p.lowrank.consumer_release(lr)
        acc = gl.convert_layout(acc16, mma, assert_trivial=True)
    bias_and_store(p, acc, off_m, off_n, CM * 2 + CN, mma)


@gluon.jit
def _consumer(p, CM: gl.constexpr, CN: gl.constexpr):
    """Every tile, every MAIN / LOWRANK slot, on rows CM·BM… × columns CN·BN… of the CTA tile."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                  instr_shape=[16, p.BLOCK_N, 32])
    sched = _scheduler(p)
    k_tiles = gl.cdiv(p.K, p.BLOCK_K)
    main = consumer_state(p.main.num_stages)
    lr = consumer_state(p.lowrank.num_stages)
    part = gl.zeros([p.BLOCK_M, p.BLOCK_N], gl.float32, mma)
    for t in range(sched.get_num_tiles()):
        pid_m, pid_n = sched.get_tile(t)
        off_m = pid_m * (2 * p.BLOCK_M) + CM * p.BLOCK_M
        off_n = pid_n * (2 * p.BLOCK_N) + CN * p.BLOCK_N
        acc = gl.zeros([p.BLOCK_M, p.BLOCK_N], gl.float32, mma)
        for kk in range(k_tiles):
            p.main.consumer_wait(main)
            i = main.index
            tok = warpgroup_mma(p.x_bufs.index(i).slice(CM * p.BLOCK_M, p.BLOCK_M, dim=0),
                                p.w_bufs.index(i).slice(CN * p.BLOCK_N, p.BLOCK_N, dim=0).permute((1, 0)),
                                part, use_acc=False, is_async=True)
            xa = p.sx_bufs.index(2 * i).slice(CM * p.BLOCK_M, p.BLOCK_M, dim=0).load(gl.SliceLayout(1, mma))
            xb = p.sx_bufs.index(2 * i + 1).slice(CM * p.BLOCK_M, p.BLOCK_M, dim=0).load(gl.SliceLayout(1, mma))
            ws = p.sw_bufs.index(i).slice(CN * p.BLOCK_N, p.BLOCK_N, dim=0).load(gl.SliceLayout(0, mma))
            # fold first, then fence and release: the fence then finds the row loads long performed (fencing
            # before the MMA wait and releasing before the fold measured 5–6 % slower, probes/s28/call2)
            part = warpgroup_mma_wait(0, deps=(tok, ))
            acc = gl.fma(gl.fma(part, xa[:, None], xb[:, None]), ws[None, :], acc)
            fence_async_shared()
            p.main.consumer_release(main)
            main = main.next()
        _epilogue(p, acc, lr, off_m, off_n, CM, CN, mma)
        lr = lr.next()
    if p.EPI_TMA:
        tma.store_wait(0)


@gluon.jit
def _consumer00(p):
    _consumer(p, 0, 0)


@gluon.jit
def _consumer01(p):
    _consumer(p, 0, 1)


@gluon.jit
def _consumer10(p):
    _consumer(p, 1, 0)


@gluon.jit
def _consumer11(p):
    _consumer(p, 1, 1)


@gluon.jit(do_not_specialize=["M", "N", "K", "stride_om"])
def w4a4_quad_kernel(x_desc, w_desc, s_desc, b_desc, out_desc, sc_desc, sw_desc, out_ptr, stride_om,
                     col_scale_ptr, bias_ptr, M, N, K,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, BLOCK_R: gl.constexpr,
                     GROUP_M: gl.constexpr, STAGES: gl.constexpr, LOWRANK_STAGES: gl.constexpr,
                     HAS_LOWRANK: gl.constexpr, HAS_COL_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr,
                     EPI_TMA: gl.constexpr):
    # Every SMEM buffer and barrier of the kernel is declared here (quad_ledger mirrors it).
    TM: gl.constexpr = 2 * BLOCK_M
    TN: gl.constexpr = 2 * BLOCK_N
    x_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, TM, BLOCK_K],
                                       gl.NVMMASharedLayout.get_default_for([TM, BLOCK_K], gl.float8e4nv))
    w_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, TN, BLOCK_K],
                                       gl.NVMMASharedLayout.get_default_for([TN, BLOCK_K], gl.float8e4nv))
    sx_bufs = gl.allocate_shared_memory(sc_desc.dtype, [2 * STAGES] + sc_desc.block_type.shape, sc_desc.layout)
    sw_bufs = gl.allocate_shared_memory(sw_desc.dtype, [STAGES] + sw_desc.block_type.shape, sw_desc.layout)
    if HAS_LOWRANK:
        s_bufs = gl.allocate_shared_memory(s_desc.dtype, [LOWRANK_STAGES] + s_desc.block_type.shape, s_desc.layout)
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [LOWRANK_STAGES] + b_desc.block_type.shape, b_desc.layout)
    else:
        s_bufs = x_bufs
        b_bufs = w_bufs
    if EPI_TMA:
        epi_bufs = gl.allocate_shared_memory(out_desc.dtype, [_NC] + out_desc.block_type.shape, out_desc.layout)
    else:
        epi_bufs = x_bufs
    main = make_pipeline(STAGES, 1, _NC)              # filled by the loader's expect; emptied by four consumers
    lowrank = make_pipeline(LOWRANK_STAGES, 1, _NC)
    p = QuadArgs(x_desc, w_desc, s_desc, b_desc, out_desc, sc_desc, sw_desc, x_bufs, w_bufs, sx_bufs, sw_bufs,
                 s_bufs, b_bufs, epi_bufs, main, lowrank, out_ptr, stride_om, col_scale_ptr, bias_ptr, M, N, K,
                 BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_R, GROUP_M, HAS_LOWRANK, HAS_COL_SCALE, HAS_BIAS, EPI_TMA)
    gl.warp_specialize([
        (_consumer00, (p, )),
        (_loader, (p, )),
        (_consumer01, (p, )),
        (_consumer10, (p, )),
        (_consumer11, (p, )),
    ], _WORKER_WARPS, _WORKER_REGS)


# =============================================================================================
# Host side (the 16-bit staging rule, _epi_tma, and the checks are the v2 launcher's: gluon/w4a4_ws.py).


def quad_default() -> bool:
    """Whether the no-expander int4_g64 route runs this kernel (``LOWRANK_GEMM_V2_QUAD``: 1 on, 0 off; default off
    until measured against the coop in-flight kernel)."""
    return getenv("LOWRANK_GEMM_V2_QUAD", "0") == "1"


def quad_route(x_q, w_q, lowrank_act, fmt, group_size: int, pinned: dict) -> bool:
    """Whether a ``launch_w4a4_v2`` call that left ``quad`` open would run the no-expander route this kernel
    replaces: int4_g64 with the e4m3 path, no expanders (``f8_expanders_default``: from ``W8_MIN_M`` tokens), a
    shape :func:`quad_supported` takes, and none of the other kernels' options pinned (``pinned``: those arguments;
    None = left to their defaults)."""
    if _fmt_id(fmt) != FMT_INT4_G or any(v is not None and v is not False for k, v in pinned.items()
                                         if k not in ("f8", "expanders", "coop", "ws_f32", "scale_tma")):
        return False
    if pinned.get("f8") is False or pinned.get("coop") is False or pinned.get("ws_f32") is False \
            or pinned.get("scale_tma") is False or pinned.get("expanders") not in (None, 0) or not f8_default():
        return False
    M = x_q.shape[0]
    if pinned.get("expanders") is None and f8_expanders_default(M) != 0:
        return False
    K = x_q.shape[1] if x_q.dtype == torch.float8_e4m3fn else 2 * x_q.shape[1]
    r = 0 if lowrank_act is None else lowrank_act.shape[1]
    return quad_supported(M, w_q.shape[0], K, r, group_size, "int4_g64") is None


def quad_ledger(config: KernelConfig, *, rank: int, out_dtype=torch.bfloat16, lowrank_dtype=torch.bfloat16,
                n_out: int = 8) -> SmemLedger:
    """Every byte :func:`w4a4_quad_kernel` allocates, itemized: MAIN slots carry the CTA tile's operands and rows
    (shared by the four consumers), LOWRANK the CTA tile's s and lora_up, EPILOGUE one staging tile per consumer."""
    bm, bn, bk, br = config.block_m, config.block_n, config.block_k, config.block_r
    s, lr = config.num_stages, max(1, config.lowrank_stages)
    terms = [SmemTerm(f"{Ring.MAIN}.x_e4m3", tile_bytes(2 * bm, bk, 8), s),
             SmemTerm(f"{Ring.MAIN}.w_e4m3", tile_bytes(2 * bn, bk, 8), s),
             SmemTerm(f"{Ring.MAIN}.x_ab_rows", tile_bytes(2, 2 * bm, 32), s),
             SmemTerm(f"{Ring.MAIN}.w_scale_row", tile_bytes(1, 2 * bn, 32), s)]
    if rank > 0:
        terms += [SmemTerm(f"{Ring.LOWRANK}.s_fp32", tile_bytes(2 * bm, br, 32), lr),
                  SmemTerm(f"{Ring.LOWRANK}.lora_up", tile_bytes(2 * bn, br, _BITS[lowrank_dtype]), lr)]
    if _epi_tma(out_dtype, n_out):
        terms.append(SmemTerm(f"{Ring.EPILOGUE}.out", tile_bytes(bm, bn, _BITS[out_dtype]), 1, Scope.PER_CONSUMER))
    terms.append(SmemTerm("barriers", barrier_bytes(2 * (s + lr))))
    return SmemLedger(tuple(terms), consumers=QUAD_CONSUMERS, label=f"w4a4 quad {2 * bm}x{2 * bn}x{bk}")


def plan_quad(*, rank: int, group_size: int = 64, out_dtype=torch.bfloat16, lowrank_dtype=torch.bfloat16,
              n_out: int = 8, verbose: bool = False) -> KernelConfig:
    """The consumer tile is BLOCK × BLOCK, one group per K step; stages from the ledger (MAIN deepest first, then
    LOWRANK). Raises SmemError with the table if nothing fits."""
    base = KernelConfig(block_m=BLOCK, block_n=BLOCK, block_k=group_size, block_r=rank_block(max(rank, 1)), group_m=8,
                        num_warps=4, num_stages=2, lowrank_stages=1, persistent=True)
    has_lr = rank > 0

    def build(main_stages, lr_stages):
        return quad_ledger(base.replace(num_stages=main_stages, lowrank_stages=lr_stages), rank=rank,
                           out_dtype=out_dtype, lowrank_dtype=lowrank_dtype, n_out=n_out)

    main, lr, ledger = solve_stages(build, min_main=2, max_main=8, min_lowrank=1 if not has_lr else 2,
                                    max_lowrank=1 if not has_lr else 4)
    if verbose:
        print(ledger.table())
    return base.replace(num_stages=main, lowrank_stages=lr)


def quad_supported(M: int, N: int, K: int, rank: int, group_size: int, fmt: str):
    """None where the kernel runs the problem, else why not (the v2 launcher then keeps its other kernels)."""
    if fmt not in ("int4_g64", 0):
        return f"quad runs int4_g64 only, got {fmt!r}"
    if group_size != 64:
        return f"quad runs group 64 only, got {group_size}"
    if M % 8 or N % 8:
        return f"quad needs the scale rows by TMA (M, N % 8 == 0), got M={M}, N={N}"
    if K % group_size:
        return f"K={K} is not a multiple of the group size {group_size}"
    if rank > 64:
        return f"quad takes ranks ≤ 64 (its LOWRANK slot), got {rank}"
    return None


def _kernel_args(x8, xab, w_f8, ws32, lowrank_act, lora_up, bias, out, col_scale, group_size, grid):
    M, K = x8.shape
    N = w_f8.shape[0]
    r = 0 if lowrank_act is None else lowrank_act.shape[1]
    dev = out.device
    lr_dtype = lora_up.dtype if r else torch.bfloat16
    cfg = plan_quad(rank=r, group_size=group_size, out_dtype=out.dtype, lowrank_dtype=lr_dtype, n_out=N)
    bm, bn, bk, br = cfg.block_m, cfg.block_n, cfg.block_k, cfg.block_r
    r8 = -(-r // 8) * 8
    epi_tma = _epi_tma(out.dtype, N)
    args = (desc(x8, (2 * bm, bk)), desc(w_f8, (2 * bn, bk)),
            desc(_pad_rank(lowrank_act, r8) if r else dummy(dev, torch.float32, (2 * bm, br)), (2 * bm, br)),
            desc(_pad_rank(lora_up, r8) if r else dummy(dev, lr_dtype, (2 * bn, br)), (2 * bn, br)),
            desc(out if epi_tma else dummy(dev, torch.bfloat16, (bm, bn)), (bm, bn)),
            _row_desc(xab, 2 * bm), _row_desc(ws32, 2 * bn), out, out.stride(0),
            col_scale if col_scale is not None else dummy(dev, torch.int32, (1, )),
            bias if bias is not None else dummy(dev, torch.int32, (1, )), M, N, K)
    tiles = cdiv(M, 2 * bm) * cdiv(N, 2 * bn)
    grid = min(grid, tiles) if grid else persistent_grid(tiles, dev)
    cx = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, BLOCK_R=br, GROUP_M=cfg.group_m, STAGES=cfg.num_stages,
              LOWRANK_STAGES=max(1, cfg.lowrank_stages), HAS_LOWRANK=r > 0, HAS_COL_SCALE=col_scale is not None,
              HAS_BIAS=bias is not None, EPI_TMA=epi_tma)
    return grid, args, cx, cfg


def _operands(x_q, x_scale, w_q, w_scale, lowrank_act, lora_up, bias, out, group_size, col_scale, w_f8):
    """Validate (the launcher contract's own checks) and bring every operand to the kernel's form: e4m3 x + fp32
    xab rows (act_quant's or expanded here), e4m3 offset-nibble weights + fp32 w_scale rows (expanded per call
    unless ``w_f8`` is given)."""
    from ..w4a4_gemm import check_gemm_args
    M, N, K, r = check_gemm_args(x_q, x_scale, w_q, w_scale, None, lowrank_act, lora_up, bias, group_size,
                                 "int4_g64")
    why = quad_supported(M, N, K, r, group_size, "int4_g64")
    _expect(why is None, lambda: why)
    check_out(out, col_scale, M, N, x_q.device)
    x8, xab = _f8_operands(x_q, x_scale, group_size, True, "w4a4 quad")
    if w_f8 is None:
        from ..w4_expand import expand_w4
        w_f8, ws32 = expand_w4(w_q, None, group_size, "int4_g64", torch.float8_e4m3fn, offset=True,
                               scales=w_scale.contiguous())
    else:
        ws32 = w_scale.float().contiguous()
    _expect(w_f8.dtype == torch.float8_e4m3fn and tuple(w_f8.shape) == (N, K) and w_f8.is_contiguous()
            and w_f8.device == w_q.device,
            lambda: f"w_f8 must be the contiguous e4m3 [N, K] = {[N, K]} offset-nibble expansion of w_q on "
                    f"{w_q.device}, got {w_f8.dtype} {list(w_f8.shape)} on {w_f8.device}")
    for name, t in (("x (e4m3)", x8), ("w_f8", w_f8), ("out", out), ("xab", xab), ("w_scale (fp32)", ws32)):
        _expect(t.data_ptr() % 16 == 0, lambda: f"{name} must be 16-byte aligned for TMA, got {t.data_ptr():#x}")
    return x8, xab.contiguous(), w_f8, ws32


def launch_w4a4_quad(x_q, x_scale, w_q, w_scale, lowrank_act, lora_up, bias, out, group_size: int = 64, *,
                     col_scale=None, w_f8=None, grid: int | None = None):
    """out [M, N] ← the int4_g64 layer's GEMM + low-rank epilogue on this kernel; the argument contract of
    ``kernels.w4a4_gemm`` (int4_g64, ``x_q`` packed or act_quant's e4m3 form). Returns ``out``."""
    x8, xab, w8, ws32 = _operands(x_q, x_scale, w_q, w_scale, lowrank_act, lora_up, bias, out, group_size,
                                  col_scale, w_f8)
    g, args, cx, _ = _kernel_args(x8, xab, w8, ws32, lowrank_act, lora_up, bias, out, col_scale, group_size, grid)
    launch(w4a4_quad_kernel, (g, ), *args, **cx, num_warps=4)
    return out


def aot_signature_quad(*, M=256, N=384, K=384, rank=32, bias=True, col_scale=True, out_dtype=torch.bfloat16):
    """(signature, constexprs, config) for ``kernels.aot.compile_sm90`` of :func:`w4a4_quad_kernel`, from CPU
    stand-ins of a small problem."""
    import inspect
    from triton.runtime.jit import mangle_type
    from .w4a4_ws import make_operands_v2
    ops = make_operands_v2("int4_g64", M, N, K, rank, 64, device="cpu", bias=bias, col_scale=col_scale,
                           out_dtype=out_dtype)
    G = K // 64
    x8 = torch.zeros((M, K), dtype=torch.float8_e4m3fn)
    xab = torch.zeros((G, 2, M), dtype=torch.float32)
    w8 = torch.zeros((N, K), dtype=torch.float8_e4m3fn)
    ws32 = torch.zeros((G, N), dtype=torch.float32)
    _, args, cx, cfg = _kernel_args(x8, xab, w8, ws32, ops["lowrank_act"], ops["lora_up"], ops["bias"], ops["out"],
                                    ops["col_scale"], 64, None)
    names = [n for n in inspect.signature(w4a4_quad_kernel.fn).parameters if n not in cx]
    sig = {n: (mangle_type(a) if not isinstance(a, int) else "i32") for n, a in zip(names, args)}
    return sig, cx, cfg
