"""The synchronization skeleton every warp-specialized (Gluon, sm_90) kernel here is built on.

Pieces (after Triton's Gluon tutorials 07-persistence and 08-warp-specialization, Hopper parts only):

- :class:`PipelineState` — slot index + phase bit of one role on one ring of SMEM slots.
  ``next()`` / ``advance(n)`` return a new value and are must-use (aggregates are immutable:
  dropping the result silently desynchronizes the ring — a hang, not an error).
- :class:`Pipeline` — the ``ready``/``empty`` mbarrier pair of a ring, with the four moves
  (producer_acquire / producer_commit / consumer_wait / consumer_release).
- The phase rule, stated ONCE: an mbarrier starts in phase 0, not yet completed. Waiting for
  parity 1 on a fresh barrier returns immediately ("the previous phase is complete"), so a producer
  starts on the flipped phase (:data:`PRODUCER_START_PHASE` = 1) and its first lap over the ring
  does not block on empty slots; a consumer starts on phase 0 and blocks until the first fill.
- :class:`GroupedTileScheduler` — persistent grouped tile order, the SAME math as the Triton
  kernels (it calls ``kernels.schedule.grouped_tile``), so every kernel walks tiles identically.
  Program ``pid`` visits ``tile_id = pid, pid + nprog, ...``; :func:`program_tiles_host` mirrors it.
- :data:`ROLES` — warps and registers of every role, the one table ``gl.warp_specialize`` reads.
- Parity soundness (why :class:`ConsumerOrder` exists): ``try_wait.parity(P)`` only asks whether
  the barrier's current phase has parity ≠ P, so a role may wait for phase n of a barrier only
  after phase n-1 completed. A waiter one lap AHEAD passes at once on a slot nobody filled, and
  after its early release the ring deadlocks (``protocol_model`` reproduces this). Roles that walk
  a ring in order are safe by construction; the two consumers that take alternate tiles of ONE
  ring are not (consumer1's first wait is k_tiles slot uses ahead), so they hand the ring to each
  other: consumer c starts the K loop of local tile t only after the other finished tile t-1.
- Strided roles need an even ring (:func:`strided_ring_stages`): when two roles take alternate uses of
  one ring (the two f8 expanders on MAIN and RAW, paired consumers on MAIN), a role's wait on use u is
  sound only if use u − S (same slot, one lap back) is done. With S even that use is the role's own;
  with S odd it is the OTHER role's, which may still be pending, and the wait passes one lap early.
  Session 26: odd MAIN rings (the ledger's 5 slots at group 128, 3 at rank 128, 7 beside 16 RAW slots)
  hung or faulted the paired two-expander kernel at M = 64, N = 28672. Consumers on alternate tiles of
  LOWRANK are safe with any count: a consumer waits for tile t's slot only after its K loop, which the
  loader fed after issuing tile t's LOWRANK fill, which needed use t − S released (program order).
  ``protocol_model.simulate_paired`` finds the odd MAIN / RAW passes and none on odd LOWRANK rings.
- Loop-carry pitfall (Triton 3.6 frontend, ``CodeGenerator._find_carries``): a name is loop-carried
  only if its IR handles after a dry run of the body differ from those before the loop. So
  ``prev = st`` before a loop plus ``prev = st; st = st.next()`` inside it leaves ``prev`` with the
  SAME handles as before (the dry run reads ``st``'s entry value) → ``prev`` is silently NOT carried
  and keeps the entry state in every iteration. Derive such values from the carried state instead
  (:meth:`PipelineState.prev`). This hung the 2l consumer (releases all hit one slot).
"""


from dataclasses import dataclass

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.language.core import _aggregate as aggregate

from ..schedule import cdiv, grouped_tile, grouped_tile_host


def strided_ring_stages(stages: int) -> int:
    """The deepest ring of at most ``stages`` slots that two roles taking alternate uses may share: an even count
    (module docstring, "Strided roles"); 2 at least."""
    if stages < 2:
        raise ValueError(f"a ring shared by two strided roles needs ≥ 2 slots, got {stages}")
    return stages - stages % 2


__all__ = ["strided_ring_stages", "bias_and_store", "consumer_step", "consumer_uses_host", "expected_role_states", "PipelineState", "Pipeline", "GroupedTileScheduler", "RoleSpec", "ROLES", "ROLE_IDS",
           "PRODUCER_START_PHASE", "CONSUMER_START_PHASE", "producer_state", "consumer_state",
           "alloc_barriers", "REGISTER_BUDGET", "DEFAULT_REGS", "CONSUMER_REGS", "DEFAULT_WARPS", "make_pipeline", "program_tiles_host", "expected_states_host",
           "debug_record", "NUM_CONSUMERS", "Ring", "ConsumerOrder", "make_consumer_order",
           "ROLES_TWO_EXPANDERS", "WORKER_WARPS_2X", "WORKER_REGS_2X", "DEFAULT_REGS_2X",
           "ROLES_NO_EXPANDER", "WORKER_WARPS_0X", "WORKER_REGS_0X", "DEFAULT_REGS_0X"]

# ---------------------------------------------------------------------------------------------
# Phase rule (see module docstring). Everything else derives its start phase from these two.
PRODUCER_START_PHASE = 1
CONSUMER_START_PHASE = 0
_PRODUCER_START = gl.constexpr(PRODUCER_START_PHASE)
_CONSUMER_START = gl.constexpr(CONSUMER_START_PHASE)


class Ring:
    """Names of the SMEM rings (pipelines) of a kernel; used as debug-record slots and in ledgers."""

    MAIN = "main"          # 8-bit operands ready for wgmma (x int8, w expanded)
    RAW = "raw"            # packed int4 tiles as TMA landed them, before expansion
    LOWRANK = "lowrank"    # s [BM, BR] and lora_up [BN, BR] tiles of the epilogue's up-projection
    EPILOGUE = "epilogue"  # per-consumer output staging buffer for the TMA store


# ---------------------------------------------------------------------------------------------
# Roles: warps and registers per partition, the ONE place they are stated.
@dataclass(frozen=True)
class RoleSpec:
    name: str
    warps: int
    regs: int | None     # None: the default partition (gets what the workers leave)
    does: str


NUM_CONSUMERS = 2
_NUM_CONSUMERS = gl.constexpr(NUM_CONSUMERS)
# Registers are handed out per warpgroup (setmaxnreg): 65536 registers / 128 threads = 512 per
# thread summed over the 4 warpgroups (a 1-warp role still holds a whole warpgroup's share).
# The default partition gets what the workers leave: 512 - 24 - 64 - 208 = 216.
REGISTER_BUDGET = 512
ROLES: tuple[RoleSpec, ...] = (
    # Default partition: must come first (gl.warp_specialize runs it on the kernel's num_warps).
    RoleSpec("consumer0", 4, None, "wgmma + rescale of even local tiles, then their epilogue"),
    RoleSpec("loader", 1, 24, "TMA loads of every ring (main/raw/lowrank); scalar work only"),
    RoleSpec("expander", 4, 64, "packed int4 -> int8 into SMEM, fence_async_shared, arrive"),
    RoleSpec("consumer1", 4, 208, "wgmma + rescale of odd local tiles, then their epilogue"),
)
ROLE_IDS = {r.name: i for i, r in enumerate(ROLES)}
ROLE_CONSUMER0 = gl.constexpr(ROLE_IDS["consumer0"])
ROLE_LOADER = gl.constexpr(ROLE_IDS["loader"])
ROLE_EXPANDER = gl.constexpr(ROLE_IDS["expander"])
ROLE_CONSUMER1 = gl.constexpr(ROLE_IDS["consumer1"])
NUM_ROLES = gl.constexpr(len(ROLES))
# Worker lists in partition order (ROLES[1:]), as gl.warp_specialize wants them.
WORKER_WARPS = gl.constexpr([r.warps for r in ROLES[1:]])
WORKER_REGS = gl.constexpr([r.regs for r in ROLES[1:]])
DEFAULT_WARPS = ROLES[0].warps
DEFAULT_REGS = REGISTER_BUDGET - sum(r.regs for r in ROLES[1:])
CONSUMER_REGS = min(DEFAULT_REGS, ROLES[ROLE_IDS["consumer1"]].regs)
# Two expanders (W4A4 f8 path, EXPANDERS=2): a fifth warpgroup; expander e expands K steps e, e+2, … so two
# steps' latency chains (barrier waits, proxy fence, arrives) overlap. Debug traces of both go to the
# "expander" role row. With 640 threads a CTA starts at 65536 / 640 → 96 registers per thread (multiples of 8),
# and Triton hands the default partition 5 × 96 minus the workers' registers: consumer0 gets 168, not the
# 512-budget remainder (sm_90 PTX: setmaxnreg.dec 168); ptxas fits the f8 consumer in it without spills.
ROLES_TWO_EXPANDERS: tuple[RoleSpec, ...] = (
    RoleSpec("consumer0", 4, None, ROLES[0].does),
    RoleSpec("loader", 1, 24, ROLES[1].does),
    RoleSpec("expander", 4, 40, "even K steps: packed int4 -> 8-bit into SMEM, fence_async_shared, arrive"),
    RoleSpec("consumer1", 4, 208, ROLES[3].does),
    RoleSpec("expander1", 4, 40, "odd K steps, as expander"),
)
WORKER_WARPS_2X = gl.constexpr([r.warps for r in ROLES_TWO_EXPANDERS[1:]])
WORKER_REGS_2X = gl.constexpr([r.regs for r in ROLES_TWO_EXPANDERS[1:]])
_INITIAL_REGS_2X = (65536 // (128 * len(ROLES_TWO_EXPANDERS))) // 8 * 8          # 96
DEFAULT_REGS_2X = len(ROLES_TWO_EXPANDERS) * _INITIAL_REGS_2X - sum(r.regs for r in ROLES_TWO_EXPANDERS[1:])
# No expander (W4A4 f8 path, EXPANDERS=0): the 8-bit weights come pre-expanded by TMA, so the loader fills MAIN
# alone and the freed warpgroup's registers go to the consumers (three warpgroups: 65536 / 384 → 168 per thread
# at launch; consumer0 gets 3 × 168 − 24 − 232 = 248) — room for a second in-flight fp32 partial.
ROLES_NO_EXPANDER: tuple[RoleSpec, ...] = (
    RoleSpec("consumer0", 4, None, ROLES[0].does),
    RoleSpec("loader", 1, 24, "TMA loads of every ring, the pre-expanded 8-bit weights included"),
    RoleSpec("consumer1", 4, 232, ROLES[3].does),
)
WORKER_WARPS_0X = gl.constexpr([r.warps for r in ROLES_NO_EXPANDER[1:]])
WORKER_REGS_0X = gl.constexpr([r.regs for r in ROLES_NO_EXPANDER[1:]])
_INITIAL_REGS_0X = (65536 // (128 * len(ROLES_NO_EXPANDER))) // 8 * 8            # 168
DEFAULT_REGS_0X = len(ROLES_NO_EXPANDER) * _INITIAL_REGS_0X - sum(r.regs for r in ROLES_NO_EXPANDER[1:])


# ---------------------------------------------------------------------------------------------
@aggregate
class PipelineState:
    """Where one role stands on one ring: slot ``index`` in [0, num_stages) and the ``phase`` bit
    it waits for on that slot's barrier."""

    index: gl.tensor
    phase: gl.tensor
    num_stages: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, index, phase, num_stages):
        self.index = index
        self.phase = phase
        self.num_stages = gl.constexpr(num_stages)

    @gluon.must_use_result
    @gluon.jit
    def next(self):
        incr = self.index + 1
        rollover = incr == self.num_stages
        return PipelineState(gl.where(rollover, 0, incr), gl.where(rollover, self.phase ^ 1, self.phase),
                             self.num_stages)

    @gluon.must_use_result
    @gluon.jit
    def prev(self):
        """The slot use before this one (e.g. the slot to release one step late)."""
        wrap = self.index == 0
        return PipelineState(gl.where(wrap, self.num_stages - 1, self.index - 1),
                             gl.where(wrap, self.phase ^ 1, self.phase), self.num_stages)

    @gluon.must_use_result
    @gluon.jit
    def advance(self, n):
        """Skip ``n`` ≥ 0 slot uses (e.g. the other consumer's tile on a shared ring)."""
        total = self.index + n
        laps = total // self.num_stages
        return PipelineState(total % self.num_stages, self.phase ^ (laps & 1), self.num_stages)


@gluon.jit
def producer_state(num_stages: gl.constexpr):
    return PipelineState(gl.to_tensor(0), gl.to_tensor(_PRODUCER_START), num_stages)


@gluon.jit
def consumer_state(num_stages: gl.constexpr):
    return PipelineState(gl.to_tensor(0), gl.to_tensor(_CONSUMER_START), num_stages)


@gluon.jit
def alloc_barriers(num: gl.constexpr, count: gl.constexpr):
    """``num`` mbarriers, each completing a phase after ``count`` arrivals (+ any expected bytes)."""
    bars = gl.allocate_shared_memory(gl.int64, [num, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(num):
        mbarrier.init(bars.index(i), count=count)
    return bars


@aggregate
class Pipeline:
    """One ring: ``ready[i]`` completes when slot i is filled, ``empty[i]`` when it may be refilled."""

    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    num_stages: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, ready, empty, num_stages):
        self.ready = ready
        self.empty = empty
        self.num_stages = gl.constexpr(num_stages)

    @gluon.jit
    def producer_acquire(self, st):
        mbarrier.wait(self.empty.index(st.index), st.phase)

    @gluon.jit
    def ready_bar(self, st):
        """The barrier a TMA fill of slot ``st`` signals (after ``mbarrier.expect``)."""
        return self.ready.index(st.index)

    @gluon.jit
    def producer_commit(self, st):
        """Software fill done (the caller has issued ``fence_async_shared`` after its SMEM stores)."""
        mbarrier.arrive(self.ready.index(st.index))

    @gluon.jit
    def consumer_wait(self, st):
        mbarrier.wait(self.ready.index(st.index), st.phase)

    @gluon.jit
    def consumer_release(self, st, pred=True):
        mbarrier.arrive(self.empty.index(st.index), pred=pred)


@gluon.jit
def make_pipeline(num_stages: gl.constexpr, ready_count: gl.constexpr, empty_count: gl.constexpr):
    """``ready_count``: arrivals that fill a slot (an ``expect`` counts as one); ``empty_count``:
    roles that release it."""
    return Pipeline(alloc_barriers(num_stages, ready_count), alloc_barriers(num_stages, empty_count), num_stages)


@aggregate
class ConsumerOrder:
    """Hand-off of a shared ring between the two consumers (module docstring, parity soundness).
    ``bars[c]`` completes its phase j when the other consumer finished the K loop of its j-th tile,
    so consumer c waits for phase ((t-1)//2) before local tile t ≥ 1 — never more than one phase
    ahead, since the other consumer cannot finish tile t+1 before this one finished tile t."""

    bars: gl.shared_memory_descriptor
    ENABLED: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, bars, ENABLED):
        self.bars = bars
        self.ENABLED = gl.constexpr(ENABLED)

    @gluon.jit
    def acquire(self, CONSUMER: gl.constexpr, t):
        if self.ENABLED:
            mbarrier.wait(self.bars.index(CONSUMER), ((t - 1) // 2) & 1, pred=t > 0)

    @gluon.jit
    def release(self, CONSUMER: gl.constexpr):
        if self.ENABLED:
            mbarrier.arrive(self.bars.index(1 - CONSUMER))


@gluon.jit
def make_consumer_order(ENABLED: gl.constexpr):
    return ConsumerOrder(alloc_barriers(_NUM_CONSUMERS, 1), ENABLED)


# ---------------------------------------------------------------------------------------------
@aggregate
class GroupedTileScheduler:
    """Static persistent schedule in grouped order: local tile ``idx`` of program ``pid`` is global
    tile ``pid + idx * nprog``, mapped to (pid_m, pid_n) by ``schedule.grouped_tile``."""

    pid: gl.tensor
    nprog: gl.tensor
    num_pid_m: gl.tensor
    num_pid_n: gl.tensor
    GROUP_M: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, pid, nprog, num_pid_m, num_pid_n, GROUP_M):
        self.pid = pid
        self.nprog = nprog
        self.num_pid_m = num_pid_m
        self.num_pid_n = num_pid_n
        self.GROUP_M = gl.constexpr(GROUP_M)

    @gluon.jit
    def initialize(M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
        return GroupedTileScheduler(gl.program_id(0), gl.num_programs(0), gl.cdiv(M, BLOCK_M),
                                    gl.cdiv(N, BLOCK_N), GROUP_M)

    @gluon.jit
    def get_num_tiles(self):
        total = self.num_pid_m * self.num_pid_n
        return (total - self.pid + self.nprog - 1) // self.nprog

    @gluon.jit
    def get_tile(self, idx):
        return grouped_tile(self.pid + idx * self.nprog, self.num_pid_m, self.num_pid_n, self.GROUP_M)


def program_tiles_host(pid: int, nprog: int, M: int, N: int, block_m: int, block_n: int,
                       group_m: int) -> list[tuple[int, int]]:
    """Host mirror of :class:`GroupedTileScheduler`: the (pid_m, pid_n) program ``pid`` visits."""
    num_pid_m, num_pid_n = cdiv(M, block_m), cdiv(N, block_n)
    total = num_pid_m * num_pid_n
    return [grouped_tile_host(t, num_pid_m, num_pid_n, group_m) for t in range(pid, total, nprog)]


def expected_states_host(uses: list[int], num_stages: int, producer: bool) -> list[tuple[int, int]]:
    """(index, phase) a role must see at each of its slot uses, given the ring's global use counters."""
    start = PRODUCER_START_PHASE if producer else CONSUMER_START_PHASE
    return [(n % num_stages, ((n // num_stages) & 1) ^ start) for n in uses]


def consumer_uses_host(c: int, n_local: int, k_tiles: int, paired: bool = False) -> list:
    """MAIN-ring use numbers consumer ``c`` takes: its local tiles c, c + 2, … in order; ``paired``: tile
    pair q owns uses [2q·k_tiles, …) with the pair's K steps interleaved (stride 1 for a lone last tile)."""
    out = []
    for t in range(c, n_local, NUM_CONSUMERS):
        if paired:
            q = t // 2
            stride = 2 if 2 * q + 1 < n_local else 1
            out += [2 * q * k_tiles + c + stride * kk for kk in range(k_tiles)]
        else:
            out += [t * k_tiles + kk for kk in range(k_tiles)]
    return out


def expected_role_states(grid: int, M: int, N: int, K: int, cfg, producers: dict, consumer_stages: int,
                         pid: int = 0, paired: bool = False) -> dict:
    """What each role of program ``pid`` must record in DEBUG mode: role name → [(index, phase)] per K-step
    slot use. ``producers``: name → stages of the ring that role fills once per K step of every local tile;
    consumer c takes local tiles c, c + NUM_CONSUMERS, … of the ring with ``consumer_stages`` slots
    (:func:`consumer_uses_host`)."""
    k_tiles = cdiv(K, cfg.block_k)
    n_local = len(program_tiles_host(pid, grid, M, N, cfg.block_m, cfg.block_n, cfg.group_m))
    uses = list(range(n_local * k_tiles))
    want = {name: expected_states_host(uses, stages, True) for name, stages in producers.items()}
    for c in range(NUM_CONSUMERS):
        want[f"consumer{c}"] = expected_states_host(consumer_uses_host(c, n_local, k_tiles, paired),
                                                    consumer_stages, False)
    return want


# ---------------------------------------------------------------------------------------------
@gluon.jit
def debug_record(dbg_ptr, role: gl.constexpr, it, st, DEBUG_ITERS: gl.constexpr):
    """dbg int32 [nprog, NUM_ROLES, DEBUG_ITERS, 2] ← (index, phase) of ``role``'s ``it``-th slot use.
    Every thread of the role writes the same value (benign)."""
    if it < DEBUG_ITERS:
        base = dbg_ptr + ((gl.program_id(0) * NUM_ROLES + role) * DEBUG_ITERS + it) * 2
        gl.store(base, st.index)
        gl.store(base + 1, st.phase)


@gluon.jit
def consumer_step(p, st, ROLE: gl.constexpr, it):
    """Entry of a consumer's K step on the MAIN ring: record (index, phase) in DEBUG mode, wait until the slot
    is full. Returns ``it + 1`` (the role's slot-use counter for the trace)."""
    if p.DEBUG:
        debug_record(p.dbg_ptr, ROLE, it, st, p.DEBUG_ITERS)
    p.main.consumer_wait(st)
    return it + 1


@gluon.jit
def reads_done_before_refill():
    """Before one thread refills, by TMA, a ring slot that every warp has just read with plain loads (the kernels
    without warp roles): each thread's proxy fence orders its loads before async-proxy writes, then the barrier
    orders every thread before the issuing one. A barrier or an mbarrier arrive alone does not: the TMA write is not
    in the loads' proxy. The rule everywhere: a slot read with plain loads goes back to a TMA producer (arrive) or
    is refilled only behind ``fence_async_shared()`` — warp-specialized consumers fence before their arrive. Without
    it the H200 refilled W4A4 v2 slots whose scale rows were still being read: nondeterministic outputs, up to 12 %
    of elements wrong (NOTES.md, session 24)."""
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def bias_and_store(p, acc, off_m, off_n, CONSUMER: gl.constexpr, mma: gl.constexpr, ROWS: gl.constexpr = 0):
    """The epilogue tail every consumer shares: + bias[N] → store the tile, by TMA from this consumer's
    staging buffer (``p.EPI_TMA``) or masked from registers. ``p``: a kernel's argument aggregate with
    HAS_BIAS, bias_ptr, M, N, BLOCK_M, BLOCK_N, EPI_TMA, epi_bufs, out_desc, out_ptr, stride_om. ``ROWS``: the
    rows ``acc`` holds when a consumer owns part of the tile (0: all BLOCK_M)."""
    offs_n = off_n + gl.arange(0, p.BLOCK_N, gl.SliceLayout(0, mma))
    if p.HAS_BIAS:
        bias = gl.load(p.bias_ptr + offs_n, mask=offs_n < p.N, other=0.0).to(gl.float32)
        acc = acc + bias[None, :]
    if p.EPI_TMA:
        epi = p.epi_bufs.index(CONSUMER)
        tma.store_wait(0)            # this consumer's previous tile has left its staging buffer
        epi.store(acc.to(p.out_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(p.out_desc, [off_m, off_n], epi)
    else:
        offs_m = off_m + gl.arange(0, p.BLOCK_M if ROWS == 0 else ROWS, gl.SliceLayout(1, mma))
        mask = (offs_m[:, None] < p.M) & (offs_n[None, :] < p.N)
        gl.store(p.out_ptr + offs_m[:, None] * p.stride_om + offs_n[None, :],
                 acc.to(p.out_ptr.dtype.element_ty), mask=mask)
