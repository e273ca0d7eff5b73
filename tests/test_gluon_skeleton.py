"""CPU checks of the Gluon v2 kernels: skeleton math, tile order, SMEM ledger, AOT compile + PTX.

Gluon does not run in the interpreter, so the device behaviour (hangs, races, numerics) is covered by
tests/test_gluon_gpu.py; here we pin everything that can be decided on the host.
"""

import functools

import pytest
import torch
import triton
import triton.language as tl

from lowrank_gemm.kernels.gluon import skeleton as sk
from lowrank_gemm.kernels.gluon import w4a4_ws as w4
from lowrank_gemm.kernels.schedule import grouped_tile
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.plan.smem import SM90_SMEM_LIMIT, Scope, SmemError

# The warp-specialize op passes its captured arguments to the worker partitions through SMEM; the
# allocator adds that buffer (and alignment) on top of the declared buffers. It is a few hundred
# bytes, far below any real term (≥ 2 KiB), so a double-counted term still fails the check.
WS_CAPTURE_SLACK = 512


# ---------------------------------------------------------------------------------------------
# Tile order: the Gluon scheduler calls schedule.grouped_tile; its host mirror must agree with the
# Triton function as the interpreter runs it, over the persistent stride.
@triton.jit
def _walk_tiles(out_ptr, num_pid_m, num_pid_n, MAX_LOCAL: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    total = num_pid_m * num_pid_n
    for i in range(MAX_LOCAL):
        t = pid + i * nprog
        if t < total:
            pm, pn = grouped_tile(t, num_pid_m, num_pid_n, GROUP_M)
            tl.store(out_ptr + (pid * MAX_LOCAL + i) * 2, pm)
            tl.store(out_ptr + (pid * MAX_LOCAL + i) * 2 + 1, pn)


@pytest.mark.parametrize("M,N,bm,bn,group_m,nprog", [(300, 200, 64, 32, 4, 5), (64, 1000, 64, 128, 8, 3),
                                                      (1000, 64, 128, 64, 3, 7), (129, 129, 64, 64, 1, 2)])
def test_scheduler_host_mirror_matches_triton_grouped_tile(M, N, bm, bn, group_m, nprog):
    npm, npn = triton.cdiv(M, bm), triton.cdiv(N, bn)
    max_local = triton.cdiv(npm * npn, nprog)
    out = torch.full((nprog, max_local, 2), -1, dtype=torch.int32)
    _walk_tiles[(nprog, )](out, npm, npn, MAX_LOCAL=max_local, GROUP_M=group_m)
    seen = set()
    for pid in range(nprog):
        host = sk.program_tiles_host(pid, nprog, M, N, bm, bn, group_m)
        dev = [tuple(v) for v in out[pid, :len(host)].tolist()]
        assert dev == host, f"pid {pid}: interpreter {dev} vs host {host}"
        assert (out[pid, len(host):] == -1).all()
        seen.update(host)
    assert seen == {(m, n) for m in range(npm) for n in range(npn)}, "every tile exactly once"


# ---------------------------------------------------------------------------------------------
# Pipeline states: a Python model of PipelineState.next/advance (same arithmetic) checked against the
# closed form the GPU debug test compares the device trace with.
class _PyState:
    def __init__(self, index, phase, n):
        self.index, self.phase, self.n = index, phase, n

    def next(self):
        i = self.index + 1
        return _PyState(0, self.phase ^ 1, self.n) if i == self.n else _PyState(i, self.phase, self.n)

    def advance(self, k):
        total = self.index + k
        return _PyState(total % self.n, self.phase ^ ((total // self.n) & 1), self.n)

    def prev(self):   # PipelineState.prev
        return _PyState(self.n - 1, self.phase ^ 1, self.n) if self.index == 0 else _PyState(self.index - 1, self.phase, self.n)


@pytest.mark.parametrize("stages", [1, 2, 3, 5])
def test_prev_inverts_next(stages):
    s = _PyState(0, sk.CONSUMER_START_PHASE, stages)
    for _ in range(3 * stages):
        n = s.next()
        assert (n.prev().index, n.prev().phase) == (s.index, s.phase)
        s = n


@pytest.mark.parametrize("stages", [1, 2, 3, 5])
@pytest.mark.parametrize("k", [0, 1, 2, 3, 7, 11])
def test_advance_equals_repeated_next(stages, k):
    for start in range(2 * stages):
        s = _PyState(0, sk.CONSUMER_START_PHASE, stages).advance(start)
        a, b = s.advance(k), s
        for _ in range(k):
            b = b.next()
        assert (a.index, a.phase) == (b.index, b.phase)


def test_phase_rule_stated_once():
    assert sk.PRODUCER_START_PHASE == 1 - sk.CONSUMER_START_PHASE == 1
    assert sk.expected_states_host([0, 1, 2, 3], 2, producer=True) == [(0, 1), (1, 1), (0, 0), (1, 0)]
    assert sk.expected_states_host([0, 1, 2, 3], 2, producer=False) == [(0, 0), (1, 0), (0, 1), (1, 1)]


@pytest.mark.parametrize("n_tiles,k_tiles,stages", [(1, 1, 3), (2, 5, 3), (5, 2, 4), (7, 3, 2)])
def test_pingpong_consumers_partition_the_ring(n_tiles, k_tiles, stages):
    """Consumer c walks tiles c, c+2, ... with advance(c·k) then advance(k) after each tile (as in
    _consumer_partition): together they must see every slot use once, in ring order."""
    seen = {}
    for c in range(sk.NUM_CONSUMERS):
        st = _PyState(0, sk.CONSUMER_START_PHASE, stages).advance(c * k_tiles)
        for t in range(c, n_tiles, 2):
            for kk in range(k_tiles):
                seen[t * k_tiles + kk] = (st.index, st.phase)
                st = st.next()
            st = st.advance(k_tiles)
    uses = list(range(n_tiles * k_tiles))
    assert sorted(seen) == uses
    assert [seen[u] for u in uses] == sk.expected_states_host(uses, stages, producer=False)


# Protocol model (real mbarrier parity semantics, random interleavings, TMA landing out of order).
SMOKE = dict(n_tiles=2, k_tiles=8, stages=5, lr_stages=4)   # smoke.py: 250×300×1024, grid 3, 2l defaults


@pytest.mark.parametrize("fmt", ["int4_2l", "int4_g64"])
def test_model_reproduces_the_h200_hang_without_consumer_order(fmt):
    """The first H200 run hung on the smoke launch: consumer1's first wait is k_tiles ≥ STAGES slot
    uses ahead, passes on parity, releases a slot nobody filled, and the ring deadlocks."""
    from lowrank_gemm.kernels.gluon.protocol_model import simulate
    for seed in range(5):
        r = simulate(**SMOKE, fmt=fmt, order=False, seed=seed, stop_on_spurious=False)
        assert not r.ok and r.why.startswith("deadlock") and "spurious" in r.why, r.why


@pytest.mark.parametrize("fmt", ["int4_2l", "int4_g64"])
@pytest.mark.parametrize("n_tiles,k_tiles,stages,lr_stages", [(2, 8, 5, 4), (1, 8, 5, 4), (3, 1, 4, 2), (5, 3, 2, 2),
                                                              (7, 16, 3, 3), (4, 5, 5, 2), (9, 2, 8, 4)])
def test_model_consumer_order_is_sound(fmt, n_tiles, k_tiles, stages, lr_stages):
    from lowrank_gemm.kernels.gluon.protocol_model import simulate
    for seed in range(12):
        for has_lr in (True, False):
            r = simulate(n_tiles, k_tiles, stages, lr_stages, fmt=fmt, has_lowrank=has_lr, order=True, seed=seed)
            assert r.ok, r.why


# Local tiles of program 0, k_tiles, STAGES, LOWRANK_STAGES, has_lowrank of the H200 bisect rungs r3–r7
# (scripts/bisect_gluon.py, benchmarks/results/h200/logs/bisect_gluon.log: r3 wrong numbers, r4–r7 HANG).
BISECT_2L = {"r3": (1, 2, 6, 1, False), "r4": (1, 8, 6, 1, False), "r5": (3, 8, 6, 1, False),
             "r6": (2, 8, 5, 4, True), "r7": (3, 5, 3, 4, True)}


@pytest.mark.parametrize("rung", sorted(BISECT_2L))
def test_model_reproduces_the_2l_stale_release_hang(rung):
    """2l consumer as compiled before the fix: ``prev = main`` was not loop-carried, so every MAIN
    release hit the tile's first slot. The model hangs exactly where the H200 did (r4–r7: loader
    stuck on a MAIN.empty slot nobody releases) and not on r3 (k_tiles < STAGES: no slot is reused); the lagged release
    the kernel now does is sound on every rung."""
    from lowrank_gemm.kernels.gluon.protocol_model import simulate
    n, k, st, lr, has_lr = BISECT_2L[rung]
    for seed in range(4):
        stale = simulate(n, k, st, lr, fmt="int4_2l", has_lowrank=has_lr, seed=seed, release="stale",
                         stop_on_spurious=False)
        if rung == "r3":
            assert stale.ok, stale.why
        else:
            assert not stale.ok and stale.why.startswith("deadlock") and "'loader': 'main.empty[" in stale.why, stale.why
        fixed = simulate(n, k, st, lr, fmt="int4_2l", has_lowrank=has_lr, seed=seed)
        assert fixed.ok, fixed.why


def _ptx_loops(ptx: str):
    """[(label, body lines)] of every PTX loop (a label with a later branch back to it)."""
    lines = ptx.splitlines()
    loops = []
    for i, line in enumerate(lines):
        if line.startswith("$L__BB") and line.split(":")[0] and ":" in line:
            label = line.split(":")[0]
            for j in range(i + 1, len(lines)):
                if lines[j].strip().endswith(f"bra \t{label};") or lines[j].strip().endswith(f"bra.uni \t{label};"):
                    loops.append((label, lines[i:j + 1]))
                    break
    return loops


def _defined_in(reg: str, body) -> bool:
    import re
    pat = re.compile(r"^\s*(@%p\d+\s+)?[a-z][\w.:]*\s+" + re.escape(reg) + r"\s*,")
    return any(pat.match(line) for line in body)


def test_2l_ptx_releases_the_right_slots_and_multipliers():
    """Pins both 2l bugs the H200 bisect found, on the sm_90 PTX of the r4 launch (BK=128, G2=64):
    (1) the consumer K loop (the one with ``wgmma.wait_group 1``) must compute its MAIN.empty arrive
    address inside the loop (before the fix it was loop-invariant: the stale ``prev``);
    (2) the expander must load one u row per 64-wide block (BK/64 groups × 2 rows per thread for
    BN=128), not one per K tile (which gave r3's normalized error 0.579)."""
    import re
    from lowrank_gemm.kernels.aot import compile_sm90
    cfg = KernelConfig(block_m=128, block_n=128, block_k=128, block_r=16, group_m=8, num_warps=4, num_stages=6,
                       lowrank_stages=1, persistent=True)
    sig, cx, _ = w4.aot_signature_v2("int4_2l", cfg, M=100, N=124, K=1024, rank=0, bias=False, col_scale=False,
                                     scale_tma=False, swar=False)   # the global-load path the bug was in
    assert cx["STAGES"] == 6 and cx["G2"] == 64
    ptx = compile_sm90("lowrank_gemm.kernels.gluon.w4a4_ws", "w4a4_ws_kernel", sig, cx, num_warps=sk.DEFAULT_WARPS).ptx
    loops = _ptx_loops(ptx)
    kloops = [body for _, body in loops if any("wgmma.wait_group.sync.aligned 1;" in x for x in body)]
    assert kloops, "2l consumer K loop (one wgmma in flight) not found"
    for body in kloops:
        arrives = [re.search(r"mbarrier\.arrive\.shared::cta\.b64 _, \[(%r\d+)\]", x) for x in body]
        regs = [m.group(1) for m in arrives if m]
        assert regs, "the K loop releases MAIN slots"
        for r in regs:
            assert _defined_in(r, body), f"MAIN release address {r} is loop-invariant: every release hits one slot"
    exp = [body for _, body in loops if any("fence.proxy.async.shared::cta" in x for x in body)
           and any("ld.global" in x for x in body)]
    assert exp, "expander loop not found"
    n_u = sum(bool(re.search(r"ld\.global(\.\w+)*\.b8 ", x)) for x in exp[0])
    assert n_u == (128 // 64) * (128 // 64), f"{n_u} u loads per K step, want one per 64-wide block and row"


@pytest.mark.parametrize("fmt", ["int4_2l", "int4_g64"])
def test_scale_rows_by_tma_and_swar_ptx(fmt):
    """SCALE_TMA: no per-step global loads of scales/multipliers left in the K loops (they were a DRAM
    round trip per step on the expander's / consumers' critical path); 1-D TMA copies instead. SWAR:
    the expansion is lop3 on whole registers, no per-element 16-bit shifts."""
    import re
    from lowrank_gemm.kernels.aot import compile_sm90
    extra = dict(f8=False, paired=False) if fmt == "int4_g64" else {}   # the int8 path (f8 has its own test)
    sig, cx, _ = w4.aot_signature_v2(fmt, M=96, N=128, K=1024, rank=0, bias=False, col_scale=False,
                                     scale_tma=True, swar=True, **extra)   # aligned row starts (scale_tma_ok)
    assert cx["SCALE_TMA"] and cx["SWAR"]
    ptx = compile_sm90("lowrank_gemm.kernels.gluon.w4a4_ws", "w4a4_ws_kernel", sig, cx, num_warps=sk.DEFAULT_WARPS).ptx
    assert "cp.async.bulk.tensor.1d" in ptx, "scale rows by 1-D TMA"
    assert "lop3.b32" in ptx and "shr.s16" not in ptx
    loops = _ptx_loops(ptx)
    # the K loops (consumer MMA, expander), not the tile loops around them whose epilogue loads the
    # per-row/column scales once per tile and stores the output
    epilogue = ("cp.async.bulk.tensor.2d.global.shared", "st.global")
    kbodies = [body for _, body in loops if any("wgmma.mma_async" in x or "fence.proxy.async.shared::cta" in x
                                                for x in body) and not any(e in x for x in body for e in epilogue)]
    assert kbodies
    for body in kbodies:
        glob = [x for x in body if re.search(r"ld\.global", x)]
        assert not glob, f"global loads left in a K loop: {glob[:3]}"


def test_role_table():
    assert sk.ROLES[0].regs is None, "the default partition comes first and takes the remainder"
    assert [r.name for r in sk.ROLES] == ["consumer0", "loader", "expander", "consumer1"]
    assert sk.ROLE_IDS == {r.name: i for i, r in enumerate(sk.ROLES)}
    assert list(sk.WORKER_WARPS.value) == [r.warps for r in sk.ROLES[1:]]
    assert list(sk.WORKER_REGS.value) == [r.regs for r in sk.ROLES[1:]]
    assert sk.DEFAULT_REGS + sum(r.regs for r in sk.ROLES[1:]) == sk.REGISTER_BUDGET
    assert all(r.regs is None or r.regs % 8 == 0 and 24 <= r.regs <= 256 for r in sk.ROLES), "setmaxnreg range"
    assert sk.ROLES[sk.ROLE_IDS["consumer0"]].warps == sk.ROLES[sk.ROLE_IDS["consumer1"]].warps == 4, "wgmma"


# ---------------------------------------------------------------------------------------------
# Ledger: every term, its scope, and the stage solver.
CFG_2L = w4.default_config_v2("int4_2l")
CFG_G = w4.default_config_v2("int4_g64")


def test_ledger_terms_2l():
    c = CFG_2L.replace(num_stages=3, lowrank_stages=2)
    led = w4.w4a4_ledger(c, fmt="int4_2l", out_dtype=torch.bfloat16, has_lowrank=True)
    t = {x.name: x for x in led.terms}
    assert t["main.x_int8"].total(2) == 128 * 128 * 3
    assert t["main.w_int8"].total(2) == 128 * 128 * 3
    assert "raw.x_packed" not in t, "2l activations land in MAIN directly"
    assert t["raw.w_packed"].total(2) == 128 * 64 * w4.RAW_STAGES
    assert t["lowrank.s_fp32"].total(2) == 128 * 16 * 4 * 2
    assert t["lowrank.lora_up"].total(2) == 128 * 16 * 2 * 2
    assert t["epilogue.out"].scope is Scope.PER_CONSUMER and t["epilogue.out"].total(2) == 2 * 128 * 128 * 2
    # ready + empty per slot, plus the consumers' two ORDER (ring hand-off) barriers
    assert t["barriers"].total(2) == 8 * (2 * (3 + w4.RAW_STAGES + 2) + sk.NUM_CONSUMERS)
    # only the epilogue buffer is per consumer: a CTA term counted per consumer would show here
    assert [x.name for x in led.terms if x.scope is Scope.PER_CONSUMER] == ["epilogue.out"]
    assert led.total() == sum(x.bytes_each * x.stages for x in led.terms) + t["epilogue.out"].bytes_each


def test_ledger_terms_g_and_variants():
    c = CFG_G.replace(num_stages=4, lowrank_stages=2)
    t = {x.name: x for x in w4.w4a4_ledger(c, fmt="int4_g64", out_dtype=torch.bfloat16).terms}
    assert t["raw.x_packed"].total(2) == 64 * 32 * w4.RAW_STAGES
    assert t["main.x_int8"].total(2) == 64 * 64 * 4
    no_lr = {x.name for x in w4.w4a4_ledger(c, fmt="int4_g64", has_lowrank=False).terms}
    assert not any(n.startswith("lowrank") for n in no_lr)
    fp32 = {x.name for x in w4.w4a4_ledger(c, fmt="int4_g64", out_dtype=torch.float32).terms}
    assert "epilogue.out" not in fp32, "fp32 output is stored from registers"


def test_scale_tma_needs_aligned_row_starts():
    """The H200 raised "illegal instruction" for 1-D scale boxes starting at unaligned offsets (M=60):
    such shapes take the global-load path, and asking for scale_tma there is a clear error."""
    ops = w4.make_operands_v2("int4_g64", 60, 128, 256, 0, 64, device="cpu")
    assert not w4.scale_tma_ok(ops["x_scale"], ops["w_scale"], ops["w_mul"], "int4_g64")
    with pytest.raises(ValueError, match="row starts"):
        w4.kernel_args_v2(**ops, scale_tma=True)
    ok = w4.make_operands_v2("int4_g64", 64, 128, 256, 0, 64, device="cpu")
    assert w4.scale_tma_ok(ok["x_scale"], ok["w_scale"], ok["w_mul"], "int4_g64")
    two = w4.make_operands_v2("int4_2l", 64, 120, 256, 0, 64, device="cpu")   # u rows of 120 B
    assert not w4.scale_tma_ok(two["x_scale"], two["w_scale"], two["w_mul"], "int4_2l")


def test_ledger_scale_row_terms():
    """SCALE_TMA rings: g's scale rows ride in MAIN (one per stage), 2l's u rows in RAW (BK/G2 rows per
    slot); all shared by the CTA, none per consumer."""
    c = CFG_G.replace(num_stages=4, lowrank_stages=2)
    t = {x.name: x for x in w4.w4a4_ledger(c, fmt="int4_g64", scale_tma=True).terms}
    assert t["main.x_scale_row"].total(2) == 64 * 2 * 4 and t["main.w_scale_row"].total(2) == 128 * 2 * 4
    c2 = CFG_2L.replace(num_stages=3, lowrank_stages=2)
    for g2, rows in ((64, 2), (128, 1)):
        t2 = {x.name: x for x in w4.w4a4_ledger(c2, fmt="int4_2l", scale_tma=True, group_size=g2).terms}
        assert t2["raw.u_rows"].total(2) == rows * 128 * w4.RAW_STAGES
        assert "main.x_scale_row" not in t2
    for led in (w4.w4a4_ledger(c, fmt="int4_g64", scale_tma=True), w4.w4a4_ledger(c2, fmt="int4_2l", scale_tma=True)):
        assert [x.name for x in led.terms if x.scope is Scope.PER_CONSUMER] == ["epilogue.out"]
    off = {x.name for x in w4.w4a4_ledger(c, fmt="int4_g64").terms}
    assert not any("scale_row" in n or "u_rows" in n for n in off)


def test_ledger_raw_stages_scale_the_raw_ring_only():
    c = CFG_2L.replace(num_stages=3, lowrank_stages=2)
    two = {x.name: x for x in w4.w4a4_ledger(c, fmt="int4_2l", scale_tma=True, raw_stages=2).terms}
    six = {x.name: x for x in w4.w4a4_ledger(c, fmt="int4_2l", scale_tma=True, raw_stages=6).terms}
    assert six["raw.w_packed"].total(2) == 3 * two["raw.w_packed"].total(2)
    assert six["raw.u_rows"].total(2) == 3 * two["raw.u_rows"].total(2)
    assert six["main.w_int8"].total(2) == two["main.w_int8"].total(2)
    assert six["barriers"].total(2) - two["barriers"].total(2) == 8 * 2 * 4   # ready + empty per extra slot


def test_strided_rings_get_even_slot_counts():
    """Two roles taking alternate uses of one ring need an even slot count (skeleton docstring, "Strided roles"):
    odd MAIN rings hung (group 128: 5 slots) or faulted (rank 128: 3) the paired two-expander kernel on the H200
    at M = 64, N = 28672 (session 26). The planner rounds MAIN (two expanders / paired) down to even, the launcher
    refuses an odd RAW ring under two expanders, and coop / one-role rings keep the ledger's deepest count."""
    from lowrank_gemm.kernels.gluon.skeleton import strided_ring_stages
    assert [strided_ring_stages(n) for n in (2, 3, 4, 5, 7, 8)] == [2, 2, 4, 4, 6, 8]
    with pytest.raises(ValueError, match="≥ 2 slots"):
        strided_ring_stages(1)
    kw = dict(f8=True, scale_tma=True, n_out=28672)
    for rank, group, raw in ((16, 128, 4), (128, 64, 4), (32, 64, 16), (96, 64, 4)):
        free = w4.plan_w4a4_v2("int4_g64", rank=rank, group_size=group, raw_stages=raw, expanders=1, **kw)
        c = w4.plan_w4a4_v2("int4_g64", rank=rank, group_size=group, raw_stages=raw, expanders=2, paired=True, **kw)
        assert c.num_stages % 2 == 0, (rank, group, raw, c)
        assert free.num_stages - 1 <= c.num_stages <= free.num_stages     # at most the one slot the rule drops
    coop = w4.plan_w4a4_v2("int4_g64", rank=48, group_size=64, expanders=0, coop=True, out_dtype=torch.float32,
                           ws_bits=32, **kw)
    assert coop.num_stages == 7      # coop consumers both take every use in order: no rounding
    ops = w4.make_operands_v2("int4_g64", 64, 256, 512, 16, 64, device="cpu")
    with pytest.raises(ValueError, match="raw_stages must be even"):
        w4.kernel_args_v2(**ops, f8=True, expanders=2, raw_stages=5)
    _, _, cx, cfg, _ = w4.kernel_args_v2(**ops, f8=True, expanders=2, raw_stages=16)
    assert cx["RAW_STAGES_N"] == 16 and cfg.num_stages % 2 == 0 and not cx.get("ODD_RINGS_OK", False)


def test_every_routed_plan_keeps_strided_rings_even():
    """Whatever the rank, group, output dtype and decode-size M, the launcher's plan gives the paired / two-expander
    kernel even MAIN and RAW rings (the ledger alone gave 3, 5 or 7 MAIN slots for some of these)."""
    seen = 0
    for m in (16, 64):
        for rank in (0, 8, 32, 48, 64, 96, 128):
            for group in (64, 128):
                for out in (torch.bfloat16, torch.float32):
                    ops = w4.make_operands_v2("int4_g64", m, 128, 256, rank, group, device="cpu", out_dtype=out)
                    try:
                        _, _, cx, cfg, _ = w4.kernel_args_v2(**ops, f8=True)
                    except (ValueError, w4.SmemError):
                        continue                      # no plan fits: refused before launch, nothing to check
                    if cx["PAIRED"] or cx["EXPANDERS"] == 2:
                        seen += 1
                        assert cfg.num_stages % 2 == 0 and (cx["EXPANDERS"] != 2 or cx["RAW_STAGES_N"] % 2 == 0), \
                            (m, rank, group, out, cfg, cx["RAW_STAGES_N"])
    assert seen >= 28


@pytest.mark.parametrize("stages,raw,lr,sound", [(8, 4, 4, True), (6, 16, 2, True), (4, 4, 3, True), (2, 2, 3, True),
                                                 (7, 16, 2, False), (5, 4, 4, False), (3, 4, 2, False),
                                                 (8, 5, 2, False), (8, 3, 2, False)])
def test_paired_protocol_model_needs_even_strided_rings(stages, raw, lr, sound):
    """The paired two-expander kernel's protocol on the host (mbarrier parity semantics, random interleavings, one
    role slowed at a time): even MAIN and RAW rings never go wrong, whatever LOWRANK's depth (program order covers
    it); an odd MAIN or RAW ring lets a role pass a parity wait one lap early in some run — the hang / fault the H200
    showed in session 26. The planner never builds the unsound ones (test above)."""
    from lowrank_gemm.kernels.gluon.protocol_model import simulate_paired
    runs = [simulate_paired(4, 12, stages, raw, lr, seed=seed, slow=slow)
            for seed in range(12) for slow in (None, {"expander1": 0.05}, {"expander0": 0.05}, {"tma": 0.05})]
    bad = [r.why for r in runs if not r.ok]
    if sound:
        assert not bad, bad[:2]
    else:
        assert bad and all("spurious" in w or "deadlock" in w for w in bad), bad[:2]


def test_plan_solves_main_then_lowrank_and_prints(capsys):
    cfg = w4.plan_w4a4_v2("int4_2l", rank=32, group_size=128, verbose=True)
    assert "SMEM ledger" in capsys.readouterr().out
    led = w4.w4a4_ledger(cfg, fmt="int4_2l", has_lowrank=True)
    assert led.fits()
    deeper = w4.w4a4_ledger(cfg.replace(num_stages=cfg.num_stages + 1, lowrank_stages=2), fmt="int4_2l")
    assert not deeper.fits(), "MAIN depth is maximal before LOWRANK gets anything beyond its minimum"
    assert cfg.block_r == 32 and cfg.lowrank_stages >= 2


def test_oversized_config_rejected_with_table():
    big = KernelConfig(block_m=128, block_n=256, block_k=256, block_r=16, num_warps=4, num_stages=2)
    with pytest.raises(SmemError, match="main.x_int8"):
        w4.plan_w4a4_v2("int4_2l", rank=16, group_size=128, config=big)
    assert not w4.can_implement_v2(big.replace(num_stages=6), dict(M=128, N=256, K=1024, rank=16, fmt="int4_2l",
                                                                   group_size=128))
    assert w4.can_implement_v2(CFG_2L.replace(num_stages=3, lowrank_stages=2),
                               dict(M=100, N=200, K=512, rank=16, fmt="int4_2l", group_size=128))


def test_register_and_shape_limits():
    shape = dict(M=64, N=64, K=256, rank=16, fmt="int4_g64", group_size=64)
    assert not w4.can_implement_v2(CFG_G.replace(block_m=128, num_stages=2), shape), "2×128 acc regs"
    assert not w4.can_implement_v2(CFG_G.replace(block_k=128, num_stages=2), shape), "BK must equal G"
    assert not w4.can_implement_v2(CFG_G.replace(num_stages=2), dict(shape, rank=24)), "rank > block_r"
    assert w4.can_implement_v2(CFG_G.replace(num_stages=2), dict(shape, rank=5)), "odd rank: padded"


# ---------------------------------------------------------------------------------------------
# Launcher validation (CPU tensors: everything up to the launch runs on the host).
def _ops(fmt, **kw):
    return w4.make_operands_v2(fmt, 40, 48, 192, 16, 64, device="cpu", **kw)


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
def test_repeated_launch_plans_from_the_cache(fmt, monkeypatch):
    """An eager call plans once per problem signature: a second identical launch builds no ledger (the stage search
    built ~13 per call, ~0.26 ms of a CPU core; scripts/probe_host_cpu.py). A config that does not fit still raises
    on every call."""
    ops = _ops(fmt)
    first = w4.kernel_args_v2(**ops)
    built = []
    ledger = w4.w4a4_ledger
    monkeypatch.setattr(w4, "w4a4_ledger", lambda *a, **k: built.append(1) or ledger(*a, **k))
    again = w4.kernel_args_v2(**ops)
    assert built == [] and again[2] == first[2] and again[3] == first[3]
    big = w4.default_config_v2(fmt).replace(block_n=256, block_k=256, num_stages=6)
    for _ in range(2):
        with pytest.raises((ValueError, SmemError)):
            w4.kernel_args_v2(**ops, config=big)


@pytest.mark.parametrize("fmt", ["int4_g64", "int4_2l"])
def test_launcher_validation_messages(fmt):
    ops = _ops(fmt)
    w4.kernel_args_v2(**ops)   # valid
    with pytest.raises(ValueError, match="activations"):
        w4.kernel_args_v2(**dict(ops, w_q=ops["w_q"][:, :-32].contiguous()))
    with pytest.raises(ValueError, match="lowrank_act must be float32"):
        w4.kernel_args_v2(**dict(ops, lowrank_act=ops["lowrank_act"].half()))
    with pytest.raises(ValueError, match="bias must be"):
        w4.kernel_args_v2(**dict(ops, bias=ops["bias"][:-1]))
    with pytest.raises(ValueError, match="contiguous"):
        w4.kernel_args_v2(**dict(ops, lora_up=ops["lora_up"].t().contiguous().t()))
    with pytest.raises(ValueError, match="out must be"):
        w4.kernel_args_v2(**dict(ops, out=ops["out"][:, :-1]))
    with pytest.raises(ValueError, match="col_scale"):
        w4.kernel_args_v2(**dict(ops, col_scale=torch.ones(3)))
    if fmt == "int4_2l":
        with pytest.raises(ValueError, match="w_mul"):
            w4.kernel_args_v2(**dict(ops, w_mul=None))
    else:
        with pytest.raises(ValueError, match="wscales"):
            w4.kernel_args_v2(**dict(ops, w_scale=ops["w_scale"][:, :-1].contiguous()))


def test_odd_rank_is_padded_for_tma():
    ops = w4.make_operands_v2("int4_2l", 40, 48, 192, 5, 64, device="cpu")
    _, args, cx, cfg, _ = w4.kernel_args_v2(**ops)
    s_desc, b_desc = args[2], args[3]
    assert list(s_desc.base.shape) == [40, 8] and list(b_desc.base.shape) == [48, 8]
    assert (s_desc.base[:, 5:] == 0).all() and (b_desc.base[:, 5:] == 0).all()
    assert cx["HAS_LOWRANK"] and cfg.block_r == 16


def test_unaligned_n_falls_back_to_register_store():
    _, _, cx, _, _ = w4.kernel_args_v2(**w4.make_operands_v2("int4_g64", 40, 45, 192, 16, 64, device="cpu"))
    assert not cx["EPI_TMA"]


def test_reference_matches_dequantized_matmul():
    from lowrank_gemm.formats.int4 import dequantize_int4, unpack_int4
    ops = _ops("int4_g64", col_scale=True)
    x = dequantize_int4(unpack_int4(ops["x_q"]), ops["x_scale"], 64).double()
    w = dequantize_int4(unpack_int4(ops["w_q"]), ops["w_scale"], 64).double()
    s16 = ops["lowrank_act"].to(torch.bfloat16).double()
    want = (x @ w.T) * ops["col_scale"].double() + s16 @ ops["lora_up"].double().T + ops["bias"].double()
    torch.testing.assert_close(w4.reference_v2(ops), want, rtol=1e-12, atol=1e-9)


# ---------------------------------------------------------------------------------------------
# Ahead-of-time compile for sm_90: instructions and SMEM against the ledger.
AOT_CASES = [
    dict(fmt="int4_2l"),
    dict(fmt="int4_g64"),
    dict(fmt="int4_2l", scale_tma=False, swar=False),
    dict(fmt="int4_g64", scale_tma=False, swar=False),
    dict(fmt="int4_2l", rank=0, bias=False, col_scale=False),
    dict(fmt="int4_2l", rank=5, N=165),
    dict(fmt="int4_g64", group_size=128, K=512),
    dict(fmt="int4_2l", group_size=128, K=512),
    dict(fmt="int4_g64", out_dtype=torch.float32),
    dict(fmt="int4_2l", debug=True),
    dict(fmt="int4_g64", f8=True, M=96, N=128),                  # e4m3 MMA, rows by TMA
    dict(fmt="int4_g64", f8=True, scale_tma=False, swar=False),  # e4m3 MMA, rows by global loads
    dict(fmt="int4_g64", f8=True, group_size=128, K=512, M=96, N=128),
    dict(fmt="int4_g64", f8=True, paired=True, M=96, N=128),
    dict(fmt="int4_g64", f8=True, paired=True, expanders=2, M=96, N=128),
    dict(fmt="int4_g64", f8=True, paired=False, expanders=1, M=96, N=128),
    dict(fmt="int4_g64", paired=True, M=96, N=128),
    dict(fmt="int4_g64", f8=True, paired=True, expanders=0, inflight=False, M=96, N=128),   # weights by TMA
    dict(fmt="int4_g64", f8=True, paired=True, expanders=0, inflight=True, M=96, N=128),
    dict(fmt="int4_g64", f8=True, paired=False, expanders=0, inflight=True, M=96, N=128),
    dict(fmt="int4_g64", f8=True, paired=False, expanders=0, inflight=False, coop=True, M=200, N=128),
    dict(fmt="int4_g64", f8=True, paired=False, expanders=0, inflight=True, coop=True, M=200, N=128),
    dict(fmt="int4_g64", f8=True, paired=False, expanders=0, inflight=True, coop=True, M=200, N=128, K=448),  # odd
    dict(fmt="int4_g64", f8=True, paired=False, expanders=0, inflight=True, coop=True, ws_f32=True, M=200, N=128),
    # four groups per in-flight body: K = 448 runs a body of four, a pair and a single group
    dict(fmt="int4_g64", f8=True, paired=False, expanders=0, inflight=4, coop=True, M=200, N=128, K=448),
]


@pytest.mark.parametrize("case", AOT_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_aot_compile_ptx_and_ledger(case):
    from lowrank_gemm.kernels.aot import compile_sm90
    case = dict(case)
    fmt = case.pop("fmt")
    sig, cx, cfg = w4.aot_signature_v2(fmt, **case)
    info = compile_sm90("lowrank_gemm.kernels.gluon.w4a4_ws", "w4a4_ws_kernel", sig, cx, num_warps=sk.DEFAULT_WARPS)
    if cx.get("F8"):
        assert info.has("wgmma.mma_async.sync.aligned", ".f32.e4m3.e4m3"), "e4m3 wgmma main product"
        assert ".s32.s8.s8" not in info.ptx and "cvt.rn.f32.s32" not in info.ptx, "no int32 partials to convert"
    else:
        assert info.has("wgmma.mma_async.sync.aligned", ".s32.s8.s8"), "8-bit wgmma main product"
    assert info.has("cp.async.bulk.tensor", "mbarrier.try_wait", "setmaxnreg")
    if cx["HAS_LOWRANK"]:
        assert info.has(".f32.bf16.bf16"), "bf16 wgmma for s·lora_upᵀ"
    if cx["EPI_TMA"]:
        assert "cp.async.bulk.tensor.2d.global.shared" in info.ptx, "TMA store epilogue"
    led = w4.w4a4_ledger(cfg, fmt=fmt, out_dtype=case.get("out_dtype", torch.bfloat16),
                         has_lowrank=cx["HAS_LOWRANK"], n_out=case.get("N", 160), scale_tma=cx["SCALE_TMA"],
                         group_size=case.get("group_size", 64), f8=cx.get("F8", False), raw_stages=cx["RAW_STAGES_N"],
                         expanders=cx["EXPANDERS"], coop=cx["COOP"], ws_bits=32 if sig["wscale_ptr"] == "*fp32" else 16)
    print(led.table(), "\ncompiled shared:", info.shared)
    assert led.total() <= info.shared <= led.total() + WS_CAPTURE_SLACK, (led.table(), info.shared)
    assert info.shared <= SM90_SMEM_LIMIT


def test_expected_role_states_split_tiles_between_consumers():
    """3 local tiles of 2 K steps on a 2-slot ring: the producer sees every use, consumer 0 tiles 0 and 2,
    consumer 1 tile 1 — each with the slot/phase of the ring's global use counter."""
    cfg = KernelConfig(block_m=64, block_n=64, block_k=64, group_m=1)
    want = sk.expected_role_states(1, 64, 3 * 64, 128, cfg, {"loader": 2}, 2)
    assert want["loader"] == sk.expected_states_host(list(range(6)), 2, True)
    assert want["consumer0"] == sk.expected_states_host([0, 1, 4, 5], 2, False)
    assert want["consumer1"] == sk.expected_states_host([2, 3], 2, False)


def test_f8_rescale_is_two_ffma_per_element_and_expander_one_lop3_per_word():
    """The fp8 path's reason to exist, checked in the sm_90 PTX: no int32 → fp32 conversion anywhere, two
    fma.rn.f32 per accumulator element per group in each consumer's K loop, and the weight expansion is
    one lop3 (low nibbles) or shr + lop3 (high nibbles) per 32-bit word."""
    import re
    from lowrank_gemm.kernels.aot import compile_sm90
    sig, cx, cfg = w4.aot_signature_v2("int4_g64", M=96, N=128, K=1024, rank=0, bias=False, col_scale=False,
                                       scale_tma=True, swar=True, f8=True, paired=False, expanders=1)
    ptx = compile_sm90("lowrank_gemm.kernels.gluon.w4a4_ws", "w4a4_ws_kernel", sig, cx, num_warps=sk.DEFAULT_WARPS).ptx
    assert "cvt.rn.f32.s32" not in ptx
    loops = _ptx_loops(ptx)
    kloops = [body for _, body in loops if any("wgmma.mma_async" in x and "e4m3" in x for x in body)]
    assert len(kloops) == 2, "one K loop per consumer"
    per_thread = cfg.block_m * cfg.block_n // 128
    for body in kloops:
        assert sum(x.strip().startswith("fma.rn.f32") for x in body) == 2 * per_thread
    exp = sorted((body for _, body in loops if any("fence.proxy.async.shared::cta" in x for x in body)
                  and any(x.strip().startswith("st.shared") for x in body)
                  and not any("wgmma" in x or "cp.async.bulk.tensor.2d.global.shared" in x for x in body)),
                 key=len)   # the expander's K loop (SMEM stores, fence), innermost first
    assert exp, "expander loop not found"
    lop3 = sum("lop3.b32" in x for x in exp[0])
    words = cfg.block_n * cfg.block_k // 2 // 4 // 128       # packed 32-bit words per expander thread
    assert lop3 == 2 * words, f"{lop3} lop3 for {words} packed words (want one per word and nibble half)"
    assert not any(re.search(r"\bmul\.lo|\bprmt", x) for x in exp[0]), "no multiplies or byte permutes"


def test_paired_consumer_uses_partition_the_ring_in_fill_order():
    """PAIRED: the two consumers' MAIN uses are disjoint, cover every fill exactly once, each consumer's uses
    increase by at most 2 (< any ring depth, so mbarrier parity cannot alias), and a lone last tile is walked
    with stride 1 by consumer 0."""
    for n_local in range(1, 8):
        for k_tiles in (1, 2, 5):
            u0 = sk.consumer_uses_host(0, n_local, k_tiles, paired=True)
            u1 = sk.consumer_uses_host(1, n_local, k_tiles, paired=True)
            assert sorted(u0 + u1) == list(range(n_local * k_tiles))
            for u in (u0, u1):
                assert all(0 < b - a <= 2 for a, b in zip(u, u[1:]))
            assert sk.consumer_uses_host(0, n_local, k_tiles) == [t * k_tiles + k for t in range(0, n_local, 2)
                                                                  for k in range(k_tiles)]


def test_paired_needs_int4_g():
    with pytest.raises(ValueError, match="paired"):
        w4.kernel_args_v2(**w4.make_operands_v2("int4_2l", 40, 48, 192, 16, 64, device="cpu"), paired=True)


def test_two_expander_role_table():
    """The fifth warpgroup stays inside the 512-register budget and setmaxnreg's range; both expanders share
    the expander's debug row, so NUM_ROLES (the debug buffer) does not change. The default partition's share is
    what Triton actually hands out (checked in the compiled PTX), not the budget's remainder."""
    from lowrank_gemm.kernels.aot import compile_sm90
    t = sk.ROLES_TWO_EXPANDERS
    assert [r.name for r in t] == ["consumer0", "loader", "expander", "consumer1", "expander1"]
    assert sk.DEFAULT_REGS_2X + sum(r.regs for r in t[1:]) <= sk.REGISTER_BUDGET
    sig, cx, _ = w4.aot_signature_v2("int4_g64", M=96, N=128, K=1024, scale_tma=True, f8=True, expanders=2)
    ptx = compile_sm90("lowrank_gemm.kernels.gluon.w4a4_ws", "w4a4_ws_kernel", sig, cx, num_warps=sk.DEFAULT_WARPS).ptx
    assert f"setmaxnreg.dec.sync.aligned.u32 \t{sk.DEFAULT_REGS_2X};" in ptx
    assert all(r.regs is None or r.regs % 8 == 0 and 24 <= r.regs <= 256 for r in t)
    assert list(sk.WORKER_WARPS_2X.value) == [r.warps for r in t[1:]]
    assert list(sk.WORKER_REGS_2X.value) == [r.regs for r in t[1:]]


def test_two_expanders_need_f8():
    ops = w4.make_operands_v2("int4_g64", 40, 48, 192, 16, 64, device="cpu")
    with pytest.raises(ValueError, match="expanders=2"):
        w4.kernel_args_v2(**ops, f8=False, expanders=2)


# ---------------------------------------------------------------------------------------------
# No expander (expanders=0): pre-expanded e4m3 weights by TMA, optionally two partials in flight.
def test_no_expander_role_table_and_ledger():
    """Three warpgroups inside the 512-register budget (the default partition's share as the compiled PTX hands it
    out); the ledger drops the RAW weight tiles, nothing else."""
    t = sk.ROLES_NO_EXPANDER
    assert [r.name for r in t] == ["consumer0", "loader", "consumer1"]
    assert sk.DEFAULT_REGS_0X + sum(r.regs for r in t[1:]) <= sk.REGISTER_BUDGET
    assert sk.DEFAULT_REGS_0X <= 256 and all(r.regs is None or r.regs % 8 == 0 for r in t)
    c = CFG_G.replace(num_stages=4, lowrank_stages=2)
    with_exp = {x.name for x in w4.w4a4_ledger(c, fmt="int4_g64", f8=True, scale_tma=True, expanders=2).terms}
    none = {x.name for x in w4.w4a4_ledger(c, fmt="int4_g64", f8=True, scale_tma=True, expanders=0).terms}
    assert with_exp - none == {"raw.w_packed"} and none <= with_exp


def _unfenced_releases(body, tma_issues: bool = False) -> list[str]:
    """The mbarrier arrives (``tma_issues``: the TMA loads) of a loop body that follow a plain ``ld.shared`` /
    ``ldmatrix`` with no proxy fence in between: a ring slot whose next fill is a TMA must not be released or refilled
    so (session 24's race)."""
    bad, unfenced = [], False
    for x in body:
        t = x.strip()
        unfenced = (unfenced or t.startswith(("ld.shared", "ldmatrix"))) and "fence.proxy.async" not in t
        hit = "cp.async.bulk.tensor" in t if tma_issues else ("mbarrier.arrive" in t and "expect_tx" not in t)
        if hit and unfenced:
            bad.append(t)
    return bad


@pytest.mark.parametrize("fmt,kw", [("int4_g64", dict(f8=True, expanders=2, paired=True)),
                                    ("int4_g64", dict(f8=True, expanders=1, paired=False)),
                                    ("int4_g64", dict(f8=True, expanders=0, coop=True, inflight=False)),
                                    ("int4_g64", dict(f8=True, expanders=0, coop=True, inflight=True)),
                                    ("int4_g64", dict(f8=True, expanders=0, paired=False, coop=False, inflight=True)),
                                    ("int4_g64", dict(f8=True, expanders=0, coop=True, inflight=4)),
                                    ("int4_g64", dict(f8=True, expanders=0, coop=True, inflight=8)),
                                    ("int4_g64", dict(f8=False)), ("int4_2l", dict())])
def test_consumer_and_expander_loops_fence_slot_reads_before_release(fmt, kw):
    """Every K loop that reads its slot with plain loads (consumers: the scale rows; expanders: the packed weights)
    fences them before it releases the slot (the loader refills it by TMA)."""
    from lowrank_gemm.kernels.aot import compile_sm90
    sig, cx, _ = w4.aot_signature_v2(fmt, M=256, N=128, K=1024, rank=32, **kw)
    assert cx["SCALE_TMA"]
    ptx = compile_sm90("lowrank_gemm.kernels.gluon.w4a4_ws", "w4a4_ws_kernel", sig, cx, num_warps=sk.DEFAULT_WARPS).ptx
    # the K loops (with a main-product wgmma) and the expander loops (with st.shared), not the tile loops around them,
    # whose epilogue's s·lora_upᵀ wgmma consumes its loads itself
    loops = [body for _, body in _ptx_loops(ptx)
             if (any("wgmma.mma_async" in x for x in body) or any(x.strip().startswith("st.shared") for x in body))
             and not any("wgmma.mma_async" in x and "bf16" in x for x in body)]
    assert loops
    for body in loops:
        assert not _unfenced_releases(body), _unfenced_releases(body)


def test_no_expander_ptx_k_loops():
    """expanders=0, inflight: no SMEM expansion loop anywhere (no st.shared + proxy fence loop), each consumer's K
    loop issues two groups' wgmma before waiting for the first (wait_group 1), rescales with two FMAs per element,
    and every MAIN fill is one TMA expect of the 8-bit weights with the rest."""
    from lowrank_gemm.kernels.aot import compile_sm90
    sig, cx, cfg = w4.aot_signature_v2("int4_g64", M=96, N=128, K=1024, rank=0, bias=False, col_scale=False,
                                       f8=True, paired=True, expanders=0, inflight=2)   # pairs (depth 4: test_inflight_depth_k_loop)
    ptx = compile_sm90("lowrank_gemm.kernels.gluon.w4a4_ws", "w4a4_ws_kernel", sig, cx, num_warps=sk.DEFAULT_WARPS).ptx
    assert f"setmaxnreg.dec.sync.aligned.u32 \t{sk.DEFAULT_REGS_0X};" in ptx
    loops = _ptx_loops(ptx)
    assert not any(any("fence.proxy.async.shared::cta" in x for x in body)
                   and any(x.strip().startswith("st.shared") for x in body) for _, body in loops), "an expander loop"
    mma_loops = [body for _, body in loops if any("wgmma.mma_async" in x and "e4m3" in x for x in body)]
    # the K loops: the next group's MMA stays in flight while the previous one is waited for
    # (two groups per iteration, each two k32 wgmma; the tile loops around them hold more)
    kloops = sorted((body for body in mma_loops if any("wgmma.wait_group.sync.aligned 1" in x for x in body)
                     and sum("wgmma.mma_async" in x for x in body) == 4), key=len)
    assert len(kloops) >= 2, "one K loop per consumer"
    kloops = kloops[:2]      # the innermost: a tile loop's span can cover its K loop's blocks
    per_thread = cfg.block_m * cfg.block_n // 128
    for body in kloops:   # two FMAs per element and group
        assert sum(x.strip().startswith("fma.rn.f32") for x in body) == 4 * per_thread
        # a slot's next fill is a TMA write: no release while plain loads of its rows are unfenced (session 24: the
        # H200 refilled slots whose rows were still being read)
        assert not _unfenced_releases(body), "a MAIN slot released after unfenced row loads"
        assert sum("mbarrier.arrive" in x for x in body) == 2, "two groups, two releases"
    w_box = cfg.block_n * cfg.block_k                    # e4m3 weight tile bytes in the loader's expect
    x_box = cfg.block_m * cfg.block_k
    rows = 2 * cfg.block_m * 4 + cfg.block_n * 4         # xab rows (fp32) + the w_scale row (fp32: ws_f32)
    assert f"{w_box + x_box + rows}" in ptx, "one expect covers x, the 8-bit weights and the scale rows"


@pytest.mark.parametrize("bn", [64, 128, 256])
def test_ws_row_order_matches_the_kernels_view(bn):
    """ws_row_order puts at each position of a block the column the kernel's shared layout (_ws_perm_layout) reads
    there. Triton layouts map hardware locations to logical indices (here: memory offset → column), so position o
    holds column XOR{bases[i] : bit i of o}; evaluated with Triton's own LinearLayout, and by hand."""
    from triton._C.libtriton.linear_layout import LinearLayout
    g, n = 3, 2 * bn
    ws = torch.randn(g, n).to(torch.bfloat16)
    out = w4.ws_row_order(ws, bn)
    assert out.dtype == torch.float32 and out.shape == (g, n)
    bases = [b[0] for b in w4._ws_perm_layout(bn).offset_bases]
    ll = LinearLayout.from_bases([("offset", [[b] for b in bases])], ["dim0"])
    assert ll.is_invertible()
    for o in range(bn):
        col = 0
        for i, b in enumerate(bases):
            if o >> i & 1:
                col ^= b
        assert dict(ll.apply({"offset": o}))["dim0"] == col
        for blk in range(n // bn):
            assert torch.equal(out[:, blk * bn + o], ws[:, blk * bn + col].float()), (o, col)
    # a thread's columns (fixed q = lane % 4: c = 8j + 2q + e) come in 16-byte runs, and for each run index the four
    # quads' runs are adjacent: one 128-bit load instruction reads 64 contiguous bytes (no bank conflict)
    where = {functools.reduce(lambda a, i: a ^ (bases[i] if o >> i & 1 else 0), range(len(bases)), 0): o
             for o in range(bn)}
    for k in range(bn // 16):
        starts = []
        for q in range(4):
            run = sorted(where[8 * j + 2 * q + e] for j in (2 * k, 2 * k + 1) for e in range(2))
            assert run == list(range(run[0], run[0] + 4)) and run[0] % 4 == 0, (k, q, run)
            starts.append(run[0])
        assert sorted(starts) == list(range(min(starts), min(starts) + 16, 4)), (k, starts)


def test_ws_perm_defaults_and_ptx(monkeypatch):
    """LOWRANK_GEMM_V2_WS_PERM=1: fp32 w_scale rows come permuted where N is a multiple of block_n (128-bit row loads
    in the consumers' K loops, no 64-bit ones), unpermuted elsewhere; asking for it where it cannot apply is an
    error. Off by default."""
    from lowrank_gemm.kernels.aot import compile_sm90
    monkeypatch.delenv("LOWRANK_GEMM_V2_WS_PERM", raising=False)
    assert w4.aot_signature_v2("int4_g64", M=256, N=256, K=512, rank=32, f8=True, expanders=0)[1]["WS_PERM"] is False
    monkeypatch.setenv("LOWRANK_GEMM_V2_WS_PERM", "1")
    sig, cx, cfg = w4.aot_signature_v2("int4_g64", M=256, N=256, K=512, rank=32, f8=True, expanders=0, coop=True,
                                       inflight=2)
    assert cx["WS_PERM"] is True and sig["wscale_ptr"] == "*fp32"
    ptx = compile_sm90("lowrank_gemm.kernels.gluon.w4a4_ws", "w4a4_ws_kernel", sig, cx, num_warps=sk.DEFAULT_WARPS).ptx
    kloops = [body for _, body in _ptx_loops(ptx) if sum("wgmma.mma_async" in x and "e4m3" in x for x in body) == 4
              and not any("bf16" in x and "wgmma.mma_async" in x for x in body)]
    assert kloops
    for body in sorted(kloops, key=len)[:2]:
        v4 = sum(x.strip().startswith("ld.shared.v4.f32") or x.strip().startswith("ld.shared.v4.b32") for x in body)
        v2 = sum(x.strip().startswith("ld.shared.v2") for x in body)
        assert v4 >= 2 * cfg.block_n // 16 and v2 == 0, (v4, v2)
    assert w4.aot_signature_v2("int4_g64", M=256, N=264, K=512, rank=32, f8=True, expanders=0, coop=True)[1][
        "WS_PERM"] is False, "N % block_n != 0: unpermuted fp32 rows"
    ops = w4.make_operands_v2("int4_g64", 256, 264, 512, 16, 64, device="cpu")
    with pytest.raises(ValueError, match="N % block_n"):
        w4.kernel_args_v2(**ops, f8=True, expanders=0, coop=True, ws_perm=True)


@pytest.mark.parametrize("depth", [4, 8])
def test_inflight_depth_k_loop(depth):
    """inflight=n: each consumer's K loop body holds n groups (2n e4m3 wgmma, 2n·64 FMAs per thread for a 64×128
    tile), waits with one group still in flight before every fold but the last, and gives its slots back in pairs
    behind one proxy fence each (n releases, n/2 fences)."""
    from lowrank_gemm.kernels.aot import compile_sm90
    sig, cx, cfg = w4.aot_signature_v2("int4_g64", M=256, N=128, K=1024, rank=32, f8=True, expanders=0, coop=True,
                                       inflight=depth)
    assert cx["INFLIGHT"] == depth
    ptx = compile_sm90("lowrank_gemm.kernels.gluon.w4a4_ws", "w4a4_ws_kernel", sig, cx, num_warps=sk.DEFAULT_WARPS).ptx
    per_thread = cfg.block_m * cfg.block_n // 128
    kloops = [body for _, body in _ptx_loops(ptx)
              if sum("wgmma.mma_async" in x and "e4m3" in x for x in body) == 2 * depth
              and not any("wgmma.mma_async" in x and "bf16" in x for x in body)]
    assert len(kloops) >= 2, "one K loop per consumer"
    for body in sorted(kloops, key=len)[:2]:
        assert sum("wgmma.wait_group.sync.aligned 1" in x for x in body) == depth - 1
        assert sum("wgmma.wait_group.sync.aligned 0" in x for x in body) == 1
        assert sum(x.strip().startswith("fma.rn.f32") for x in body) == 2 * depth * per_thread
        assert sum("mbarrier.arrive" in x for x in body) == depth
        assert sum("fence.proxy.async.shared::cta" in x for x in body) == depth // 2
        assert not _unfenced_releases(body)


@pytest.mark.parametrize("kw", [dict(paired=True, inflight=True), dict(paired=False, inflight=True, coop=True),
                                dict(paired=False, inflight=False, coop=True), dict(paired=True, inflight=False),
                                dict(paired=False, inflight=4, coop=True, ws_perm=False)])
def test_no_expander_wgmma_not_serialized(kw):
    """ptxas serializes every wgmma of a kernel when a non-wgmma instruction reads an in-flight accumulator (warning
    C7514): the first in-flight version did (a partial's registers handed from step to step) and ran 17 % slower
    than no overlap. The compiled variants must not trigger it, nor spill."""
    from _sm90 import ptxas_stats
    from lowrank_gemm.kernels.aot import compile_sm90
    sig, cx, _ = w4.aot_signature_v2("int4_g64", M=256, N=128, K=1024, rank=32, f8=True, expanders=0, **kw)
    ptx = compile_sm90("lowrank_gemm.kernels.gluon.w4a4_ws", "w4a4_ws_kernel", sig, cx, num_warps=sk.DEFAULT_WARPS).ptx
    stats = ptxas_stats(ptx)
    if stats is None:
        pytest.skip("no ptxas in this triton install")
    regs, spill, log = stats
    assert "C7514" not in log, log
    assert spill == 0


def test_no_expander_and_inflight_validation():
    ops = w4.make_operands_v2("int4_g64", 64, 128, 256, 16, 64, device="cpu")
    w4.kernel_args_v2(**ops, f8=True, expanders=0)                       # valid: expands w itself
    with pytest.raises(ValueError, match="expanders=0 the f8 path with TMA'd scale rows"):
        w4.kernel_args_v2(**ops, f8=True, expanders=0, scale_tma=False)
    with pytest.raises(ValueError, match="expanders=0 the f8 path"):
        w4.kernel_args_v2(**ops, f8=False, expanders=0)
    w8 = torch.zeros(128, 256, dtype=torch.float8_e4m3fn)
    w4.kernel_args_v2(**ops, f8=True, expanders=0, w_f8=w8)
    with pytest.raises(ValueError, match=r"w_f8 must be .* e4m3 \[N, K\] = \[128, 256\]"):
        w4.kernel_args_v2(**ops, f8=True, expanders=0, w_f8=w8[:, :192])
    with pytest.raises(ValueError, match="w_f8 must be"):
        w4.kernel_args_v2(**ops, f8=True, expanders=0, w_f8=w8.view(torch.int8))
    with pytest.raises(ValueError, match="only with expanders=0"):
        w4.kernel_args_v2(**ops, f8=True, expanders=2, w_f8=w8)
    # two partials in flight do not fit next to the expanders' register share
    with pytest.raises(ValueError, match="192 registers/thread per consumer"):
        w4.kernel_args_v2(**ops, f8=True, expanders=2, inflight=True)
    with pytest.raises(ValueError, match="in-flight partials need the f8 path"):
        w4.kernel_args_v2(**ops, f8=False, inflight=True)
    with pytest.raises(ValueError, match="ws_f32 is an expanders=0 option"):
        w4.kernel_args_v2(**ops, f8=True, expanders=2, ws_f32=True)
    args = w4.kernel_args_v2(**ops, f8=True, expanders=0, ws_f32=True, ws_perm=False)[1]
    assert args[10].dtype == torch.float32 and torch.equal(args[10], ops["w_scale"].float())   # exact
    args = w4.kernel_args_v2(**ops, f8=True, expanders=0, ws_f32=True, ws_perm=True)[1]
    assert torch.equal(args[10], w4.ws_row_order(ops["w_scale"], 128))
    # the fp32 rows from the weight expansion's launch (fuse_ws) or a conversion of their own: the same values
    fused = w4.kernel_args_v2(**ops, f8=True, expanders=0, ws_f32=True, fuse_ws=True)[1]
    apart = w4.kernel_args_v2(**ops, f8=True, expanders=0, ws_f32=True, fuse_ws=False)[1]
    assert fused[10].dtype == apart[10].dtype == torch.float32 and torch.equal(fused[10], apart[10])


def test_no_expander_defaults(monkeypatch):
    """From W8_MIN_M tokens (where the per-call weight expansion pays, probes/s24/call5) the f8 path runs without
    expanders, coop, in flight; below it the two-expander paired kernel. Each knob's variable pins it."""
    for v in ("LOWRANK_GEMM_V2_INFLIGHT", "LOWRANK_GEMM_V2_COOP", "LOWRANK_GEMM_V2_F8_EXPANDERS",
              "LOWRANK_GEMM_V2_WS_F32"):
        monkeypatch.delenv(v, raising=False)
    assert w4.inflight_default(0) and not w4.inflight_default(2)
    assert w4.coop_default(0) and not w4.coop_default(2)
    assert w4.f8_expanders_default(w4.W8_MIN_M) == 0 and w4.f8_expanders_default(w4.W8_MIN_M - 8) == 2
    big = w4.make_operands_v2("int4_g64", w4.W8_MIN_M, 128, 256, 16, 64, device="cpu")
    args, cx = w4.kernel_args_v2(**big)[1:3]
    assert (cx["EXPANDERS"], cx["COOP"], cx["INFLIGHT"], cx["PAIRED"]) == (0, True, w4.INFLIGHT_DEPTH, False)
    assert args[10].dtype == torch.float32, "no expander: fp32 w_scale rows (ws_f32)"
    small = w4.make_operands_v2("int4_g64", 256, 128, 256, 16, 64, device="cpu")
    args, cx = w4.kernel_args_v2(**small)[1:3]
    assert (cx["EXPANDERS"], cx["COOP"], cx["INFLIGHT"], cx["PAIRED"]) == (2, False, False, True)
    assert args[10].dtype == small["w_scale"].dtype, "expanders read the 16-bit rows"
    assert w4.kernel_args_v2(**big, paired=True)[2]["COOP"] is False     # an explicit paired kernel
    assert w4.kernel_args_v2(**big, inflight=True)[2]["INFLIGHT"] == w4.INFLIGHT_DEPTH
    assert w4.kernel_args_v2(**big, inflight=4)[2]["INFLIGHT"] == 4
    with pytest.raises(ValueError, match="group count"):
        w4.kernel_args_v2(**big, inflight=-1)
    monkeypatch.setenv("LOWRANK_GEMM_V2_INFLIGHT", "8")
    assert w4.inflight_default(0) == 8 and w4.inflight_default(2) == 8
    monkeypatch.setenv("LOWRANK_GEMM_V2_INFLIGHT", "1")
    assert w4.inflight_default(0) == w4.INFLIGHT_DEPTH
    monkeypatch.setenv("LOWRANK_GEMM_V2_INFLIGHT", "0")
    monkeypatch.setenv("LOWRANK_GEMM_V2_COOP", "0")
    assert not w4.inflight_default(0) and not w4.coop_default(0)
    monkeypatch.setenv("LOWRANK_GEMM_V2_WS_F32", "0")
    assert w4.kernel_args_v2(**big)[1][10].dtype == big["w_scale"].dtype
    monkeypatch.setenv("LOWRANK_GEMM_V2_F8_EXPANDERS", "2")
    assert w4.kernel_args_v2(**big)[2]["EXPANDERS"] == 2
