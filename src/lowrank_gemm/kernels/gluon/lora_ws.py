"""LoRA GEMM v2: warp-specialized persistent Gluon kernel for sm_90 (bf16/fp16).

    y[M, N] = x·Wᵀ + scale·(x·Aᵀ)·Bᵀ + bias      x [M, K], W [N, K], A [r, K], B [N, r] (PEFT layouts)

fp32 accumulation, output in x's dtype (spec: ``reference.lora_linear_ref``).

Roles (:data:`LORA_ROLES`, the one place warps/registers are stated; no expander: bf16 needs no unpack):
loader (1 warp, TMA of every ring) and two consumer warpgroups on alternate local tiles (ping-pong: one's
epilogue overlaps the other's K loop), sharing the MAIN ring through ``skeleton.ConsumerOrder``.
COOP (a config with ``num_warps`` 8, :func:`is_coop`): both consumers on every tile, a half of its rows each
(128×256 = 2 × 64×256, 256×128 = 2 × 128×128: the tile areas v1 and cuBLAS run at 256+ tokens, where ping-pong's
per-consumer tiles read W or x from L2 twice as often); every slot is released by both (empty barriers count 2);
one LOWRANK slot, which the loader refills after the tile's first STAGES MAIN fills; Y stored from registers.

Two ways to get s = x·Aᵀ (``shrink``; constexpr ``FUSED``, both selectable at run time for A/B):

- ``"fused"``: the A tile [BLOCK_R, BK] rides in the MAIN slot next to x and W, and each K step issues a
  second wgmma s += x·Aᵀ (N = BLOCK_R) on the same x tile. s lives in the consumer's registers
  (BM·BLOCK_R/128 fp32 per thread). Costs r_pad/BN extra MMA work (s is recomputed per N tile):
  free when memory-bound (M ≤ 128), 12.5 % (r=16, BN=128) … 50 % (r=64) of the MMA time when compute-bound.
- ``"pre"``: s = x·Aᵀ by one cuBLAS call before the kernel (bf16 [M, r8]); its [BM, BLOCK_R] tile comes by
  TMA with the B tile in the LOWRANK ring. One extra launch + one more read of x; no redundant MMA.

Epilogue (per consumer, own tile): s·scale in fp32 → x dtype (rounded like an unfused ``s @ B.T``) →
acc += s·Bᵀ as a register-A wgmma with K = BLOCK_R → + bias → TMA store from the consumer's own
staging buffer (masked st.global when N % 8 ≠ 0).

Rings: MAIN (STAGES slots: x, W[, A]), LOWRANK (2 slots: B[, s] per tile — slot c is only ever used by
consumer c, so its parity can never run a lap ahead), EPILOGUE (one buffer per consumer). Session-1
pitfalls avoided by construction: release addresses derive from the loop-carried state (``prev()``), and
the consumers hand the MAIN ring to each other per tile.
"""


from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma,
                                                               warpgroup_mma, warpgroup_mma_wait)
from triton.language.core import _aggregate as aggregate

from ...plan.config import KernelConfig
from ...plan.smem import Scope, SmemError, SmemLedger, SmemTerm, barrier_bytes, solve_stages, tile_bytes
from ..env import getenv
from ..epilogue import rank_block
from ..launch import launch
from ..schedule import cdiv, num_sms
from ..tma import tma_operand, tma_ready
from .host import desc, dummy
from .skeleton import (bias_and_store, consumer_step, NUM_CONSUMERS, NUM_ROLES, REGISTER_BUDGET, ConsumerOrder, GroupedTileScheduler, Pipeline,
                       Ring, consumer_state, debug_record, make_consumer_order, make_pipeline, producer_state)

__all__ = ["LORA_ROLES", "LORA_ROLE_IDS", "LOWRANK_STAGES", "lora_v2_ledger", "plan_lora_v2", "default_config_v2",
           "can_implement_v2", "launch_lora_v2", "lora_ws_kernel", "kernel_args_v2", "pre_shrink", "aot_signature_v2",
           "make_operands_v2", "reference_v2", "balanced_grid", "shrink_mode", "SHRINK_MODES", "is_coop",
           "lowrank_stages"]


# ---------------------------------------------------------------------------------------------
# Roles: warps and registers, stated once. setmaxnreg hands registers out per warpgroup (the 1-warp
# loader holds a whole warpgroup's share): 65536 / 128 = 512 per thread summed over the 3 warpgroups.
@dataclass(frozen=True)
class LoraRole:
    name: str
    warps: int
    regs: int | None    # None: the default partition, gets what the workers leave
    does: str


LORA_ROLES: tuple[LoraRole, ...] = (
    LoraRole("consumer0", 4, None, "wgmma main (+ shrink) of even local tiles, then their epilogue"),
    LoraRole("loader", 1, 24, "TMA loads of the MAIN and LOWRANK rings; scalar work only"),
    LoraRole("consumer1", 4, 240, "wgmma main (+ shrink) of odd local tiles, then their epilogue"),
)
LORA_ROLE_IDS = {r.name: i for i, r in enumerate(LORA_ROLES)}
CONSUMER_WARPS = LORA_ROLES[0].warps
LORA_DEFAULT_REGS = REGISTER_BUDGET - sum(r.regs for r in LORA_ROLES[1:])       # 248
LORA_CONSUMER_REGS = min(LORA_DEFAULT_REGS, LORA_ROLES[LORA_ROLE_IDS["consumer1"]].regs)   # 240
_WORKER_WARPS = gl.constexpr([r.warps for r in LORA_ROLES[1:]])
_WORKER_REGS = gl.constexpr([r.regs for r in LORA_ROLES[1:]])
_ROLE_C0 = gl.constexpr(LORA_ROLE_IDS["consumer0"])
_ROLE_LOADER = gl.constexpr(LORA_ROLE_IDS["loader"])
_ROLE_C1 = gl.constexpr(LORA_ROLE_IDS["consumer1"])
# Registers a consumer may spend on its two accumulators (acc + s), the rest is addresses/epilogue.
ACC_REG_LIMIT = 192

LOWRANK_STAGES = NUM_CONSUMERS    # one slot per consumer (module docstring)
_LOWRANK_STAGES = gl.constexpr(LOWRANK_STAGES)
SHRINK_MODES = ("fused", "pre")
DEBUG_ITERS_DEFAULT = 64


# =============================================================================================
# Device code
_DTYPES = (torch.bfloat16, torch.float16)   # 16-bit wgmma operands only


@aggregate
class LoraArgs:
    x_desc: tma.tensor_descriptor      # [M, K] box [BM, BK]
    w_desc: tma.tensor_descriptor      # [N, K] box [BN, BK]
    a_desc: tma.tensor_descriptor      # [r, K] box [BR, BK]      (FUSED)
    b_desc: tma.tensor_descriptor      # [N, r8] box [BN, BR]
    s_desc: tma.tensor_descriptor      # [M, r8] box [BM, BR]     (not FUSED)
    out_desc: tma.tensor_descriptor    # [M, N] box [BM, BN]      (EPI_TMA)
    x_bufs: gl.shared_memory_descriptor    # MAIN [S, BM, BK]
    w_bufs: gl.shared_memory_descriptor    # MAIN [S, BN, BK]
    a_bufs: gl.shared_memory_descriptor    # MAIN [S, BR, BK]      (FUSED)
    b_bufs: gl.shared_memory_descriptor    # LOWRANK [2, BN, BR]
    s_bufs: gl.shared_memory_descriptor    # LOWRANK [2, BM, BR]   (not FUSED)
    epi_bufs: gl.shared_memory_descriptor  # EPILOGUE [2, BM, BN]  (EPI_TMA)
    main: Pipeline
    lowrank: Pipeline
    order: ConsumerOrder
    out_ptr: gl.tensor
    stride_om: gl.tensor
    bias_ptr: gl.tensor
    dbg_ptr: gl.tensor
    scale: gl.tensor
    M: gl.tensor
    N: gl.tensor
    K: gl.tensor
    BLOCK_M: gl.constexpr
    BLOCK_N: gl.constexpr
    BLOCK_K: gl.constexpr
    BLOCK_R: gl.constexpr
    GROUP_M: gl.constexpr
    FUSED: gl.constexpr
    HAS_BIAS: gl.constexpr
    EPI_TMA: gl.constexpr
    DEBUG: gl.constexpr
    DEBUG_ITERS: gl.constexpr
    COOP: gl.constexpr
    ROWS: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, x_desc, w_desc, a_desc, b_desc, s_desc, out_desc, x_bufs, w_bufs, a_bufs, b_bufs, s_bufs,
                 epi_bufs, main, lowrank, order, out_ptr, stride_om, bias_ptr, dbg_ptr, scale, M, N, K, BLOCK_M,
                 BLOCK_N, BLOCK_K, BLOCK_R, GROUP_M, FUSED, HAS_BIAS, EPI_TMA, DEBUG, DEBUG_ITERS, COOP):
        self.x_desc = x_desc
        self.w_desc = w_desc
        self.a_desc = a_desc
        self.b_desc = b_desc
        self.s_desc = s_desc
        self.out_desc = out_desc
        self.x_bufs = x_bufs
        self.w_bufs = w_bufs
        self.a_bufs = a_bufs
        self.b_bufs = b_bufs
        self.s_bufs = s_bufs
        self.epi_bufs = epi_bufs
        self.main = main
        self.lowrank = lowrank
        self.order = order
        self.out_ptr = out_ptr
        self.stride_om = stride_om
        self.bias_ptr = bias_ptr
        self.dbg_ptr = dbg_ptr
        self.scale = scale
        self.M = M
        self.N = N
        self.K = K
        self.BLOCK_M = gl.constexpr(BLOCK_M)
        self.BLOCK_N = gl.constexpr(BLOCK_N)
        self.BLOCK_K = gl.constexpr(BLOCK_K)
        self.BLOCK_R = gl.constexpr(BLOCK_R)
        self.GROUP_M = gl.constexpr(GROUP_M)
        self.FUSED = gl.constexpr(FUSED)
        self.HAS_BIAS = gl.constexpr(HAS_BIAS)
        self.EPI_TMA = gl.constexpr(EPI_TMA)
        self.DEBUG = gl.constexpr(DEBUG)
        self.DEBUG_ITERS = gl.constexpr(DEBUG_ITERS)
        self.COOP = gl.constexpr(COOP)
        self.ROWS = gl.constexpr(BLOCK_M // 2 if COOP else BLOCK_M)    # rows of the tile one consumer owns


@gluon.jit
def _load_lowrank(p, lr, off_m, off_n):
    """The tile's B (and, not FUSED, s) tiles on one barrier: one round trip for the branch's operands."""
    p.lowrank.producer_acquire(lr)
    bar = p.lowrank.ready_bar(lr)
    if p.FUSED:
        mbarrier.expect(bar, p.b_desc.block_type.nbytes)
    else:
        mbarrier.expect(bar, p.b_desc.block_type.nbytes + p.s_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(p.s_desc, [off_m, 0], bar, p.s_bufs.index(lr.index))
    tma.async_copy_global_to_shared(p.b_desc, [off_n, 0], bar, p.b_bufs.index(lr.index))
    return lr.next()


@gluon.jit
def _loader_partition(p):
    """Per tile: the LOWRANK slot (consumed last, so it has the K loop to land), then per K step one MAIN
    slot (x, W and, FUSED, A: one expect, one barrier). Ping-pong: the LOWRANK slot first (one per consumer).
    COOP (one LOWRANK slot): after the tile's first STAGES MAIN fills — the consumers' K loop on this tile has
    begun by then, so the previous tile's epilogue released the slot, and the wait never holds MAIN fills back."""
    BK: gl.constexpr = p.BLOCK_K
    sched = GroupedTileScheduler.initialize(p.M, p.N, p.BLOCK_M, p.BLOCK_N, p.GROUP_M)
    k_tiles = gl.cdiv(p.K, BK)
    lr_at = gl.minimum(k_tiles - 1, p.main.num_stages)
    main = producer_state(p.main.num_stages)
    lr = producer_state(p.lowrank.num_stages)
    it = 0
    for t in range(sched.get_num_tiles()):
        pid_m, pid_n = sched.get_tile(t)
        off_m = pid_m * p.BLOCK_M
        off_n = pid_n * p.BLOCK_N
        if not p.COOP:
            lr = _load_lowrank(p, lr, off_m, off_n)
        for kk in range(k_tiles):
            if p.COOP:
                if kk == lr_at:
                    lr = _load_lowrank(p, lr, off_m, off_n)
            if p.DEBUG:
                debug_record(p.dbg_ptr, _ROLE_LOADER, it, main, p.DEBUG_ITERS)
            it += 1
            p.main.producer_acquire(main)
            bar = p.main.ready_bar(main)
            if p.FUSED:
                mbarrier.expect(bar, p.x_desc.block_type.nbytes + p.w_desc.block_type.nbytes
                                + p.a_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(p.a_desc, [0, kk * BK], bar, p.a_bufs.index(main.index))
            else:
                mbarrier.expect(bar, p.x_desc.block_type.nbytes + p.w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(p.x_desc, [off_m, kk * BK], bar, p.x_bufs.index(main.index))
            tma.async_copy_global_to_shared(p.w_desc, [off_n, kk * BK], bar, p.w_bufs.index(main.index))
            main = main.next()


@gluon.jit
def _x_tile(p, main, CONSUMER: gl.constexpr):
    """The MAIN slot's x rows this consumer multiplies (COOP: its half of the tile)."""
    xt = p.x_bufs.index(main.index)
    if p.COOP:
        xt = xt.slice(CONSUMER * p.ROWS, p.ROWS)
    return xt


@gluon.jit
def _mainloop_fused(p, main, mma: gl.constexpr, mma_r: gl.constexpr, k_tiles, it, ROLE: gl.constexpr,
                    CONSUMER: gl.constexpr):
    """acc += x·Wᵀ and s += x·Aᵀ per K step, one step's two wgmma groups in flight; the slot of step
    kk-1 is released after wait(2) — its address from ``main.prev()``, never a ``prev = main`` alias
    (skeleton docstring: that alias is not loop-carried and froze the 2l release on one slot)."""
    acc = gl.zeros([p.ROWS, p.BLOCK_N], gl.float32, mma)
    s = gl.zeros([p.ROWS, p.BLOCK_R], gl.float32, mma_r)
    for kk in range(k_tiles):
        it = consumer_step(p, main, ROLE, it)
        xt = _x_tile(p, main, CONSUMER)
        tok = warpgroup_mma(xt, p.w_bufs.index(main.index).permute((1, 0)), acc, is_async=True)
        tok_s = warpgroup_mma(xt, p.a_bufs.index(main.index).permute((1, 0)), s, is_async=True)
        acc, s = warpgroup_mma_wait(2, deps=(tok, tok_s))
        p.main.consumer_release(main.prev(), pred=kk > 0)    # step kk-1's wgmmas have retired
        main = main.next()
    acc, s = warpgroup_mma_wait(0, deps=(acc, s))
    p.main.consumer_release(main.prev())                       # the last step's slot
    return acc, s, main, it


@gluon.jit
def _mainloop_pre(p, main, mma: gl.constexpr, k_tiles, it, ROLE: gl.constexpr, CONSUMER: gl.constexpr):
    """acc += x·Wᵀ per K step, one wgmma in flight, lagged release as in :func:`_mainloop_fused`."""
    acc = gl.zeros([p.ROWS, p.BLOCK_N], gl.float32, mma)
    for kk in range(k_tiles):
        it = consumer_step(p, main, ROLE, it)
        tok = warpgroup_mma(_x_tile(p, main, CONSUMER), p.w_bufs.index(main.index).permute((1, 0)), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(1, deps=(tok, ))
        p.main.consumer_release(main.prev(), pred=kk > 0)
        main = main.next()
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    p.main.consumer_release(main.prev())
    return acc, main, it


@gluon.jit
def _epilogue(p, acc, s, lr, off_m, off_n, CONSUMER: gl.constexpr, mma: gl.constexpr):
    """acc += (scale·s → x dtype)·Bᵀ (register-A wgmma, K = BLOCK_R) → + bias → store. ``off_m``: the first
    row this consumer owns."""
    dtype: gl.constexpr = p.b_desc.dtype
    s_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    p.lowrank.consumer_wait(lr)
    if p.FUSED:
        s16 = gl.convert_layout((s * p.scale).to(dtype), s_op)
    else:
        st = p.s_bufs.index(lr.index)
        if p.COOP:
            st = st.slice(CONSUMER * p.ROWS, p.ROWS)
        s16 = (st.load(s_op).to(gl.float32) * p.scale).to(dtype)
    acc = warpgroup_mma(s16, p.b_bufs.index(lr.index).permute((1, 0)), acc)
    p.lowrank.consumer_release(lr)
    bias_and_store(p, acc, off_m, off_n, CONSUMER, mma, p.ROWS)


@gluon.jit
def _consumer_partition(p, CONSUMER: gl.constexpr):
    """Ping-pong: local tiles CONSUMER, CONSUMER + 2, …: the MAIN state skips the other consumer's k_tiles
    slot uses per tile; the LOWRANK state always lands on slot CONSUMER (2 slots, alternate tiles).
    COOP: every local tile, rows [CONSUMER·ROWS, +ROWS) of it; both consumers release every slot (empty
    barriers count 2), so no hand-off is needed: each walks the rings in order."""
    ROLE: gl.constexpr = _ROLE_C0 if CONSUMER == 0 else _ROLE_C1
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                  instr_shape=[16, p.BLOCK_N, 16])
    mma_r: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                    instr_shape=[16, p.BLOCK_R, 16])
    sched = GroupedTileScheduler.initialize(p.M, p.N, p.BLOCK_M, p.BLOCK_N, p.GROUP_M)
    k_tiles = gl.cdiv(p.K, p.BLOCK_K)
    main = consumer_state(p.main.num_stages)
    lr = consumer_state(p.lowrank.num_stages)
    first: gl.constexpr = 0 if p.COOP else CONSUMER
    step: gl.constexpr = 1 if p.COOP else 2
    if not p.COOP:
        main = main.advance(CONSUMER * k_tiles)
        lr = lr.advance(CONSUMER)
    it = 0
    for t in range(first, sched.get_num_tiles(), step):
        pid_m, pid_n = sched.get_tile(t)
        off_m = pid_m * p.BLOCK_M
        off_n = pid_n * p.BLOCK_N
        if not p.COOP:
            p.order.acquire(CONSUMER, t)     # the other consumer is done with tile t-1's MAIN slots
        if p.FUSED:
            acc, s, main, it = _mainloop_fused(p, main, mma, mma_r, k_tiles, it, ROLE, CONSUMER)
        else:
            acc, main, it = _mainloop_pre(p, main, mma, k_tiles, it, ROLE, CONSUMER)
            s = acc      # unused (s comes from the LOWRANK slot)
        if p.COOP:
            _epilogue(p, acc, s, lr, off_m + CONSUMER * p.ROWS, off_n, CONSUMER, mma)
            lr = lr.next()
        else:
            p.order.release(CONSUMER)        # its K loop may start while this epilogue runs
            main = main.advance(k_tiles)
            _epilogue(p, acc, s, lr, off_m, off_n, CONSUMER, mma)
            lr = lr.advance(2)
    if p.EPI_TMA:
        tma.store_wait(0)


@gluon.jit
def _consumer0(p):
    _consumer_partition(p, 0)


@gluon.jit
def _consumer1(p):
    _consumer_partition(p, 1)


# M, N, K, stride_om, scale are LoraArgs fields typed gl.tensor: never let Triton specialize a 1 into a
# constexpr (M=1 decode; the W4A4 aggregate rejected exactly that on the H200).
@gluon.jit(do_not_specialize=["M", "N", "K", "stride_om", "scale"])
def lora_ws_kernel(x_desc, w_desc, a_desc, b_desc, s_desc, out_desc,
                   out_ptr, stride_om,           # [M, N] (used when not EPI_TMA)
                   bias_ptr,                     # [N] (HAS_BIAS)
                   dbg_ptr,                      # int32 [grid, 4, DEBUG_ITERS, 2] (DEBUG)
                   scale, M, N, K,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, BLOCK_R: gl.constexpr,
                   GROUP_M: gl.constexpr, STAGES: gl.constexpr, FUSED: gl.constexpr, HAS_BIAS: gl.constexpr,
                   EPI_TMA: gl.constexpr, DEBUG: gl.constexpr = False, DEBUG_ITERS: gl.constexpr = 64,
                   CONSUMER_ORDER: gl.constexpr = True, COOP: gl.constexpr = False):
    # Every SMEM buffer and barrier is declared here (lora_v2_ledger mirrors it term by term).
    LR_STAGES: gl.constexpr = 1 if COOP else _LOWRANK_STAGES     # COOP: one tile in flight, one slot
    RELEASERS: gl.constexpr = 2 if COOP else 1                     # COOP: both consumers read every slot
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    if FUSED:
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
        s_bufs = x_bufs     # unused
    else:
        a_bufs = x_bufs     # unused
        s_bufs = gl.allocate_shared_memory(s_desc.dtype, [LR_STAGES] + s_desc.block_type.shape, s_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [LR_STAGES] + b_desc.block_type.shape, b_desc.layout)
    if EPI_TMA:
        epi_bufs = gl.allocate_shared_memory(out_desc.dtype, [2] + out_desc.block_type.shape, out_desc.layout)
    else:
        epi_bufs = x_bufs
    main = make_pipeline(STAGES, 1, RELEASERS)
    lowrank = make_pipeline(LR_STAGES, 1, RELEASERS)
    order = make_consumer_order(CONSUMER_ORDER)   # False only to reproduce the parity hang (probe)
    p = LoraArgs(x_desc, w_desc, a_desc, b_desc, s_desc, out_desc, x_bufs, w_bufs, a_bufs, b_bufs, s_bufs, epi_bufs,
                 main, lowrank, order, out_ptr, stride_om, bias_ptr, dbg_ptr, scale, M, N, K, BLOCK_M, BLOCK_N,
                 BLOCK_K, BLOCK_R, GROUP_M, FUSED, HAS_BIAS, EPI_TMA, DEBUG, DEBUG_ITERS, COOP)
    gl.warp_specialize([
        (_consumer0, (p, )),
        (_loader_partition, (p, )),
        (_consumer1, (p, )),
    ], _WORKER_WARPS, _WORKER_REGS)


# =============================================================================================
# Host side: plan (ledger), validate, launch.


def is_coop(config: KernelConfig) -> bool:
    """Both consumers on one tile (each its half of the rows: the cooperative schedule) when ``num_warps`` is
    two consumer warpgroups' worth; else ping-pong (each consumer its own tiles)."""
    return config.num_warps == NUM_CONSUMERS * CONSUMER_WARPS


def lowrank_stages(config: KernelConfig) -> int:
    """LOWRANK slots: one per consumer in ping-pong; one in COOP (one tile in flight; the loader refills it during
    the next tile's K loop)."""
    return 1 if is_coop(config) else LOWRANK_STAGES


def lora_v2_ledger(config: KernelConfig, *, fused: bool, epi_tma: bool = True) -> SmemLedger:
    """Every byte ``lora_ws_kernel`` allocates (16-bit operands), itemized. COOP stores from registers (no
    staging buffer: ``epi_tma`` is ignored)."""
    bm, bn, bk, br, s = config.block_m, config.block_n, config.block_k, config.block_r, config.num_stages
    lrs = lowrank_stages(config)
    terms = [SmemTerm(f"{Ring.MAIN}.x", tile_bytes(bm, bk, 16), s),
             SmemTerm(f"{Ring.MAIN}.w", tile_bytes(bn, bk, 16), s)]
    if fused:
        terms.append(SmemTerm(f"{Ring.MAIN}.lora_a", tile_bytes(br, bk, 16), s))
    else:
        terms.append(SmemTerm(f"{Ring.LOWRANK}.s", tile_bytes(bm, br, 16), lrs))
    terms.append(SmemTerm(f"{Ring.LOWRANK}.lora_b", tile_bytes(bn, br, 16), lrs))
    if epi_tma and not is_coop(config):
        terms.append(SmemTerm(f"{Ring.EPILOGUE}.out", tile_bytes(bm, bn, 16), 1, Scope.PER_CONSUMER))
    # ready + empty per slot of MAIN and LOWRANK, and the consumers' two ORDER barriers
    terms.append(SmemTerm("barriers", barrier_bytes(2 * (s + lrs) + NUM_CONSUMERS)))
    return SmemLedger(tuple(terms), consumers=NUM_CONSUMERS,
                      label=f"lora v2 {'coop ' if is_coop(config) else ''}{'fused' if fused else 'pre'} "
                            f"{bm}x{bn}x{bk} r{br}")


def default_config_v2(M: int, N: int, K: int, rank: int) -> KernelConfig:
    """Decode (M ≤ 64): 64-row tiles (no MMA rows wasted on padding; 64×128 keeps 2 tiles per program at
    N=28672 so both consumers alternate). Otherwise 128×128 per consumer: 128 fp32 accumulator registers
    + BLOCK_R for s, within the 240 a consumer gets."""
    br = rank_block(rank)
    bm = 64 if M <= 64 else 128
    return KernelConfig(block_m=bm, block_n=128, block_k=64, block_r=br, group_m=8, num_warps=CONSUMER_WARPS,
                        num_stages=4, lowrank_stages=LOWRANK_STAGES, persistent=True)


def shrink_mode(M: int, requested: str | None = None) -> str:
    """``requested`` > env ``LOWRANK_GEMM_LORA_V2_SHRINK`` (fused|pre) > default: fused for M ≤ 128
    (memory-bound: the extra r/BN MMA work is free), pre above (compute-bound: it is not)."""
    mode = requested or getenv("LOWRANK_GEMM_LORA_V2_SHRINK") or ("fused" if M <= 128 else "pre")
    if mode not in SHRINK_MODES:
        raise ValueError(f"lora v2: shrink must be one of {SHRINK_MODES}, got {mode!r}")
    return mode


def plan_lora_v2(M: int, N: int, K: int, rank: int, *, config: KernelConfig | None = None, fused: bool = True,
                 epi_tma: bool = True, verbose: bool = False) -> KernelConfig:
    """Tiles from ``config`` (or :func:`default_config_v2`); block_r raised to the rank's block; MAIN
    stages from the ledger (deepest that fits, 2..8). Raises SmemError with the table if none fits."""
    base = config or default_config_v2(M, N, K, rank)
    base = base.replace(block_r=max(base.block_r, rank_block(rank)), lowrank_stages=lowrank_stages(base))
    main, _, ledger = solve_stages(lambda s, _l: lora_v2_ledger(base.replace(num_stages=s), fused=fused,
                                                                 epi_tma=epi_tma), min_main=2, max_main=8)
    if verbose:
        print(ledger.table())
    return base.replace(num_stages=main)


def _check_config(config: KernelConfig, rank: int, fused: bool, epi_tma: bool) -> None:
    """Raise ValueError/SmemError naming the violated constraint (expected vs got)."""
    bm, bn, bk, br = config.block_m, config.block_n, config.block_k, config.block_r
    coop = is_coop(config)
    if config.num_warps not in (CONSUMER_WARPS, NUM_CONSUMERS * CONSUMER_WARPS):
        raise ValueError(f"lora v2: num_warps is {CONSUMER_WARPS} (ping-pong: a consumer warpgroup per tile) or "
                         f"{NUM_CONSUMERS * CONSUMER_WARPS} (COOP: both on one tile), got {config.num_warps}")
    if bm not in ((128, 256) if coop else (64, 128)) or bn not in (64, 128, 256):
        raise ValueError(f"lora v2: block_m ∈ {{64, 128}} (COOP: {{128, 256}}, split between the consumers), "
                         f"block_n ∈ {{64, 128, 256}}; got {bm}×{bn} {'COOP' if coop else 'ping-pong'}")
    if bk not in (32, 64, 128):
        raise ValueError(f"lora v2: block_k ∈ {{32, 64, 128}}, got {bk}")
    if br not in (16, 32, 64, 128) or rank > br:
        raise ValueError(f"lora v2: block_r must be a power of two in [16, 128] ≥ rank {rank}, got {br}")
    rows = bm // 2 if coop else bm      # a consumer's share of the tile
    regs = rows * bn // 128 + (rows * br // 128 if fused else 0)
    if regs > ACC_REG_LIMIT:
        raise ValueError(f"lora v2: {rows}×{bn} (+ s {rows}×{br} when fused) accumulators need {regs} registers/thread "
                         f"per consumer, limit {ACC_REG_LIMIT} of the {LORA_CONSUMER_REGS} a consumer gets")
    if config.num_stages < 2:
        raise ValueError(f"lora v2: num_stages must be ≥ 2, got {config.num_stages}")
    lora_v2_ledger(config, fused=fused, epi_tma=epi_tma).check()


def _stores_by_tma(config: KernelConfig | None, N: int) -> bool:
    """Y leaves by TMA from a staging tile where rows are 16-byte pitched (N % 8 == 0) and the schedule is
    ping-pong; COOP stores its halves from registers (no staging tile in its ledger)."""
    return N % 8 == 0 and not (config is not None and is_coop(config))


def can_implement_v2(config: KernelConfig | None, shape: dict) -> bool:
    """``shape``: dict with M, N, K, rank and optionally shrink ("fused"/"pre"), dtype (bf16)."""
    try:
        M, N, K, r = shape["M"], shape["N"], shape["K"], shape["rank"]
        if r < 1 or K < 1 or shape.get("dtype", torch.bfloat16) not in _DTYPES:
            return False
        fused = shrink_mode(M, shape.get("shrink")) == "fused"
        epi_tma = _stores_by_tma(config, N)
        cfg = plan_lora_v2(M, N, K, r, config=config, fused=fused, epi_tma=epi_tma)
        _check_config(cfg, r, fused, epi_tma)
        return True
    except (ValueError, SmemError):
        return False


def balanced_grid(tiles: int, sms: int) -> int:
    """Programs of a persistent launch: as many waves as min(tiles, sms) programs would need, spread
    evenly (224 tiles on 132 SMs → 112 programs × 2, not 92 × 2 + 40 × 1: same makespan, no idle half-wave)."""
    waves = cdiv(tiles, max(1, sms))
    return max(1, cdiv(tiles, waves))


def pre_shrink(x: torch.Tensor, lora_a: torch.Tensor) -> torch.Tensor:
    """The ``pre`` mode's S = x·Aᵀ [M, r rounded up to 8] (16-byte rows for TMA; the padded columns are zeros): one
    cuBLAS call, fp32 accumulation rounded once to x's dtype; the kernel applies ``scale`` in fp32."""
    r = lora_a.shape[0]
    r8 = cdiv(r, 8) * 8
    a8 = lora_a if r == r8 else torch.nn.functional.pad(lora_a, (0, 0, 0, r8 - r))
    return torch.mm(x, a8.t())


def kernel_args_v2(x, weight, lora_a, lora_b, scale=1.0, bias=None, out=None, config=None, *, shrink=None,
                   grid=None, debug=False, debug_iters=DEBUG_ITERS_DEFAULT, consumer_order=True, s_pre=None):
    """Validate, plan, build one launch. x [M, K] (2-D), out [M, N] or None (allocated).
    Returns (grid, args, constexprs, config, out, dbg). ``s_pre``: for the AOT signature only (a stand-in s)."""
    from ..lora_gemm import check_inputs
    check_inputs(x, weight, lora_a, lora_b, bias)
    if x.dim() != 2:
        raise ValueError(f"lora v2: x must be 2-D [M, K] here (launch_lora_v2 flattens), got {tuple(x.shape)}")
    M, K = x.shape
    N, r = weight.shape[0], lora_a.shape[0]
    if K < 1 or r < 1:
        raise ValueError(f"lora v2: needs K ≥ 1 and rank ≥ 1, got K={K}, r={r}")
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if tuple(out.shape) != (M, N) or out.dtype != x.dtype or out.device != x.device or out.stride(-1) != 1:
        raise ValueError(f"lora v2: out must be [M, N] = {[M, N]} {x.dtype} on {x.device} with unit column stride, "
                         f"got {list(out.shape)} {out.dtype} on {out.device} strides {tuple(out.stride())}")
    fused = shrink_mode(M, shrink) == "fused"
    coop = config is not None and is_coop(config)
    epi_tma = tma_ready(out) and _stores_by_tma(config, N)
    cfg = plan_lora_v2(M, N, K, r, config=config, fused=fused, epi_tma=epi_tma)
    _check_config(cfg, r, fused, epi_tma)
    bm, bn, bk, br = cfg.block_m, cfg.block_n, cfg.block_k, cfg.block_r
    k8, r8 = cdiv(K, 8) * 8, cdiv(r, 8) * 8    # 16-byte row pitches for TMA (zero padding adds nothing)
    xt, wt = tma_operand(x, k8), tma_operand(weight, k8)
    bt = tma_operand(lora_b, r8)
    dev = x.device
    if fused:
        a_desc = desc(tma_operand(lora_a, k8), (br, bk))
        s_desc = desc(dummy(dev, x.dtype, (bm, br)), (bm, br))
    else:
        if s_pre is None:
            s_pre = pre_shrink(x, lora_a)
        a_desc = desc(dummy(dev, x.dtype, (br, bk)), (br, bk))
        s_desc = desc(tma_operand(s_pre, r8), (bm, br))
    out_desc = desc(out if epi_tma else dummy(dev, x.dtype, (bm, bn)), (bm, bn))
    tiles = cdiv(M, bm) * cdiv(N, bn)
    g = min(grid, tiles) if grid else balanced_grid(tiles, num_sms(dev) if dev.type == "cuda" else 4)
    i32 = dummy(dev, torch.int32, (1, ))
    dbg = None
    if debug:
        dbg = torch.full((g, int(NUM_ROLES), debug_iters, 2), -1, dtype=torch.int32, device=dev)
    args = (desc(xt, (bm, bk)), desc(wt, (bn, bk)), a_desc, desc(bt, (bn, br)), s_desc, out_desc, out,
            out.stride(0), bias if bias is not None else i32, dbg if debug else i32, float(scale), M, N, K)
    cx = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, BLOCK_R=br, GROUP_M=cfg.group_m, STAGES=cfg.num_stages,
              FUSED=fused, HAS_BIAS=bias is not None, EPI_TMA=epi_tma, DEBUG=debug, DEBUG_ITERS=debug_iters,
              CONSUMER_ORDER=consumer_order, COOP=coop)
    return g, args, cx, cfg, out, dbg


def launch_lora_v2(x, weight, lora_a, lora_b, scale: float = 1.0, bias=None, out=None,
                   config: KernelConfig | None = None, *, shrink: str | None = None, grid: int | None = None,
                   debug: bool = False, consumer_order: bool = True):
    """y [..., N] = x·Wᵀ + scale·(x·Aᵀ)·Bᵀ + bias on sm_90 (CUDA bf16/fp16 tensors, PEFT layouts:
    x [..., K], weight [N, K], lora_a [r, K], lora_b [N, r], bias [N]). ``out`` [..., N] (x's dtype) or None.
    ``shrink``: "fused" | "pre" | None (:func:`shrink_mode`). ``grid``: programs (default
    :func:`balanced_grid`). Returns y, or (y, dbg int32 [grid, 4, iters, 2]) with ``debug``.
    No host syncs: capturable in a CUDA graph (the "pre" shrink is one more kernel in the stream)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    N = weight.shape[0]
    out2 = out.reshape(-1, N) if out is not None else None
    if out is not None and out2.data_ptr() != out.data_ptr():
        raise ValueError("lora v2: out must be reshapeable to [M, N] without a copy")
    if x2.shape[0] == 0:
        y = out if out is not None else x.new_empty(*lead, N)
        return (y, None) if debug else y
    g, args, cx, _, out2, dbg = kernel_args_v2(x2, weight, lora_a, lora_b, scale, bias, out2, config, shrink=shrink,
                                               grid=grid, debug=debug, consumer_order=consumer_order)
    launch(lora_ws_kernel, (g, ), *args, **cx, num_warps=CONSUMER_WARPS)
    y = out if out is not None else out2.reshape(*lead, N)
    return (y, dbg) if debug else y


# =============================================================================================
# Test/bench support.
def make_operands_v2(M, N, K, rank, *, device="cuda", dtype=torch.bfloat16, bias=True, scale=0.5, seed=0):
    """Random, non-degenerate operands (kwargs of :func:`launch_lora_v2`); ``out`` poisoned with NaN."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype)
    a = (torch.randn(rank, K, generator=g) / K ** 0.5).to(dtype)
    b = (torch.randn(N, rank, generator=g) * 0.5).to(dtype)
    bs = torch.randn(N, generator=g).to(dtype) if bias else None
    out = torch.full((M, N), float("nan"), dtype=dtype)
    ops = dict(x=x, weight=w, lora_a=a, lora_b=b, scale=scale, bias=bs, out=out)
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in ops.items()}


def reference_v2(ops: dict) -> torch.Tensor:
    """float64 spec of a :func:`make_operands_v2` problem, on the CPU."""
    from ...reference import lora_linear_ref
    c = {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in ops.items()}
    return lora_linear_ref(c["x"], c["weight"], c["lora_a"], c["lora_b"], c["scale"], c["bias"])


def aot_signature_v2(config: KernelConfig | None = None, *, M=96, N=160, K=384, rank=16, bias=True, shrink="fused",
                     debug=False, dtype=torch.bfloat16):
    """(signature, constexprs, config) for ``kernels.aot.compile_sm90`` of :func:`lora_ws_kernel` from CPU
    stand-in tensors of a small problem."""
    import inspect
    from triton.runtime.jit import mangle_type
    ops = make_operands_v2(M, N, K, rank, device="cpu", dtype=dtype, bias=bias)
    s_pre = None if shrink == "fused" else torch.zeros(M, cdiv(rank, 8) * 8, dtype=dtype)
    _, args, cx, cfg, _, _ = kernel_args_v2(**ops, config=config, shrink=shrink, debug=debug, s_pre=s_pre)
    names = [n for n in inspect.signature(lora_ws_kernel.fn).parameters if n not in cx]
    sig = {}
    for n, a in zip(names, args):
        if isinstance(a, bool) or not isinstance(a, (int, float)):
            sig[n] = mangle_type(a)
        else:
            sig[n] = "fp32" if isinstance(a, float) else "i32"
    return sig, cx, cfg
