"""The W4A4 decode kernel (kernels/gluon/w4a4_decode.py): sm_90 compile checks and bad-input errors on the CPU;
correctness vs the float64 reference, repeat bit-identity and CUDA-graph replay on the GPU."""

import re

import pytest
import torch
import triton

from lowrank_gemm.bench.common import capture_graph
from lowrank_gemm.kernels.gluon import w4a4_decode as d
from lowrank_gemm.kernels.gluon import w4a4_ws as w4
from lowrank_gemm.plan.smem import SmemError

from _sm90 import ptxas_stats  # noqa: E402

MOD = "lowrank_gemm.kernels.gluon.w4a4_decode"


@pytest.mark.parametrize("fmt,cfg", [("int4_2l", None), ("int4_2l", dict(block_n=128, block_k=128, num_stages=6)),
                                     ("int4_g64", None), ("int4_g64", dict(block_n=64, block_k=128, num_stages=3))])
def test_sm90_ptx_register_a_wgmma_tma_and_ledger(fmt, cfg):
    """The int8 MMA path (int4_g64's f8 path has its own checks below)."""
    from lowrank_gemm.kernels.aot import compile_sm90
    config = d.default_decode_config(5, 64, fmt).replace(**cfg) if cfg else None
    sig, cx, c = d.aot_signature_decode(config, fmt=fmt, f8=False)
    info = compile_sm90(MOD, "w4a4_decode_kernel", sig, cx, num_warps=d.WARPS)
    # register A operand: the second wgmma operand is a register list, not a shared-memory descriptor
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n16k32\.s32\.s8\.s8 \{[^}]+\}, \{[^}]+\}", info.ptx)
    assert "cp.async.bulk.tensor.2d" in info.ptx and "cp.async.bulk.tensor.1d" in info.ptx
    assert "ld.local" not in info.ptx
    assert _ledger_total(cx, c, 64, fmt) == info.shared


_ptxas = ptxas_stats


def _ledger_total(cx, config, *args, **kw):
    """The decode ledger's total for a compile's constexprs ``cx`` (its epilogue S tile and xab table)."""
    return d.decode_ledger(config, *args, lowrank_block=cx["BLOCK_R"], xab_rows=cx["XAB_ROWS"], **kw).total()


@pytest.mark.parametrize("fmt,f8", [("int4_2l", False), ("int4_g64", False), ("int4_g64", True)])
def test_sm90_slot_refill_after_fenced_reads(fmt, f8):
    """One thread refills a ring slot by TMA right after every warp read it with plain loads: each K loop's TMA
    issues follow a proxy fence since the last ld.shared / ldmatrix (a barrier alone does not order them: session
    24's race in the warp-specialized kernel, NOTES.md)."""
    from lowrank_gemm.kernels.aot import compile_sm90
    from test_gluon_skeleton import _ptx_loops, _unfenced_releases
    sig, cx, _ = d.aot_signature_decode(None, fmt=fmt, f8=f8, M=16, K=1024)
    ptx = compile_sm90(MOD, "w4a4_decode_kernel", sig, cx, num_warps=d.WARPS).ptx
    loops = [body for _, body in _ptx_loops(ptx) if any("wgmma.mma_async" in x for x in body)]
    assert loops
    for body in loops:
        assert not _unfenced_releases(body, tma_issues=True), "a TMA refill after unfenced slot reads"


# (M, config overrides, group size): M ≤ 16 → 16-token tiles (the default 128×256×4 and other rings),
# M > 16 → 64-token tiles (64 weight rows: two fp32 partials beside acc), G = 128 (two 64-blocks chain per
# partial)
F8_CASES = [(5, None, 64), (5, dict(block_k=128, num_stages=6), 64),
            (5, dict(block_n=64, block_k=512, num_stages=3), 64), (40, None, 64), (16, None, 128)]


@pytest.mark.parametrize("M,cfg,gs", F8_CASES, ids=lambda v: str(v))
def test_sm90_f8_e4m3_register_a_wgmma_no_i2f_no_spills(M, cfg, gs):
    from lowrank_gemm.kernels.aot import compile_sm90
    config = d.default_decode_config(M, gs, "int4_g64", f8=True).replace(**cfg) if cfg else None
    sig, cx, c = d.aot_signature_decode(config, fmt="int4_g64", f8=True, M=M, K=1024, group_size=gs)
    assert cx["F8"] and sig["xscale_ptr"] == "*fp32"      # the a, b rows replace the 16-bit x scales
    info = compile_sm90(MOD, "w4a4_decode_kernel", sig, cx, num_warps=d.WARPS)
    bt = c.block_m
    # e4m3 wgmma with a REGISTER A operand ({..} list, not a descriptor) and the token tile as B
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{bt}k32\.f32\.e4m3\.e4m3 \{{[^}}]+\}}, \{{[^}}]+\}}",
                     info.ptx)
    assert ".s32.s8.s8" not in info.ptx and "cvt.rn.f32.s32" not in info.ptx     # no int8 MMA, no I2F
    assert "lop3.b32" in info.ptx and "0x08080808" in info.ptx                    # the offset-nibble LOP3
    assert "cp.async.bulk.tensor.2d" in info.ptx and "cp.async.bulk.tensor.1d" in info.ptx
    from test_gluon_skeleton import _ptx_loops
    loops = [body for _, body in _ptx_loops(info.ptx) if any("wgmma.mma_async" in x for x in body)]
    assert loops and not any("st.shared" in x for body in loops for x in body)   # no per-step token expansion
    assert info.ptx.count("st.shared") <= 4          # (the epilogue's S tile, the low-rank wgmma's B operand)
    assert "ld.local" not in info.ptx
    assert _ledger_total(cx, c, gs, "int4_g64", f8=True) == info.shared
    rs = _ptxas(info.ptx)
    if rs is not None:
        regs, spills, log = rs
        assert spills == 0, f"ptxas spills {spills} B ({regs} registers)"
        # an accumulator read while its wgmma may be in flight makes ptxas serialize every wgmma
        assert "C7514" not in log and "serialized" not in log, log


def test_f8_ledger_itemizes_its_ring():
    c = d.default_decode_config(1, 64, "int4_g64", f8=True)
    names = {t.name for t in d.decode_ledger(c, 64, "int4_g64", f8=True).terms}
    assert "ring.x_e4m3" in names and "x_int8" not in names and "ring.x_packed" not in names
    names8 = {t.name for t in d.decode_ledger(c, 64, "int4_g64").terms}
    assert {"ring.x_packed", "x_int8"} <= names8
    # f8 means nothing for int4_2l (its tokens are int8 already)
    assert d.decode_ledger(c, 64, "int4_2l", f8=True).total() == d.decode_ledger(c, 64, "int4_2l").total()
    for m in (1, 16, 33, 64):
        c = d.default_decode_config(m, 64, "int4_g64", f8=True)
        assert d.CTAS_PER_SM * d.decode_ledger(c, 64, "int4_g64", f8=True).total() <= 228 * 1024


def test_f8_switch(monkeypatch):
    monkeypatch.delenv("LOWRANK_GEMM_DECODE_F8", raising=False)
    assert d.F8_DEFAULT is True and d.decode_f8_default()      # measured faster on the H200 (session 4)
    monkeypatch.setattr(d, "F8_DEFAULT", False)
    assert not d.decode_f8_default()
    monkeypatch.setattr(d, "F8_DEFAULT", True)
    monkeypatch.setenv("LOWRANK_GEMM_DECODE_F8", "0")
    assert not d.decode_f8_default()
    monkeypatch.setattr(d, "F8_DEFAULT", False)
    monkeypatch.setenv("LOWRANK_GEMM_DECODE_F8", "1")
    assert d.decode_f8_default()
    ops = w4.make_operands_v2("int4_g64", 3, 160, 512, 16, 64, device="cpu")
    assert d._args(**ops, config=None)[2]["F8"]                         # None → the env default
    assert not d._args(**ops, config=None, f8=False)[2]["F8"]
    assert not d._args(**_ops(), config=None)[2]["F8"]                  # int4_2l never takes it by default
    with pytest.raises(ValueError, match="f8=True"):
        d._args(**_ops(), config=None, f8=True)


def test_f8_algebra_matches_reference_cpu():
    """The kernel's arithmetic, emulated in float64 with the host's operands: offset nibbles as e4m3 bit patterns
    (0x00–0x0F = n'·2⁻⁹), per-group partial P' = Σ q_x·e4m3(n'), rows a, b read from xab as [2·K/G, M] rows
    2g, 2g + 1 (the kernel's indexing), acc = Σ_g fma(P', a, b)·ws."""
    import torch
    from lowrank_gemm.formats.int4 import unpack_int4
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    from lowrank_gemm.reference import w4a4_gemm_ref
    n = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(n.view(torch.float8_e4m3fn).double(), n.double() / 512)
    M, N, K, G = 5, 48, 384, 64
    ops = w4.make_operands_v2("int4_g64", M, N, K, 0, G, device="cpu", bias=False)
    x8, xab = expand_act_f8(ops["x_q"], ops["x_scale"], G)
    qw = unpack_int4(ops["w_q"]).to(torch.int16)
    wf8 = (qw + 8).to(torch.uint8).view(torch.float8_e4m3fn).double()         # what the LOP3 bytes mean
    rows = xab.reshape(2 * K // G, M).double()
    acc = torch.zeros(N, M, dtype=torch.float64)
    for g in range(K // G):
        ks = slice(g * G, (g + 1) * G)
        part = wf8[:, ks] @ x8.double()[:, ks].t()                             # [N, M]
        acc += (part * rows[2 * g] + rows[2 * g + 1]) * ops["w_scale"][g].double()[:, None]
    ref = w4a4_gemm_ref(ops["x_q"], ops["x_scale"], ops["w_q"], ops["w_scale"], group_size=G, fmt="int4_g64")
    assert torch.allclose(acc.t(), ref, rtol=1e-6, atol=1e-6)


def test_defaults_fit_several_ctas_per_sm():
    for m in (1, 16, 33, 64):
        c = d.default_decode_config(m)
        assert c.block_m >= min(m, 64) and c.block_m in (16, 32, 64)
        assert d.CTAS_PER_SM * d.decode_ledger(c).total() <= 228 * 1024


def _ops(M=3, N=160, K=512, rank=16):
    return w4.make_operands_v2("int4_2l", M, N, K, rank, 64, device="cpu")


@pytest.mark.parametrize("kw,match", [
    (dict(block_n=256), "block_n"),
    (dict(block_k=32), "multiple of 64"),
    (dict(num_stages=1), "num_stages"),
    (dict(num_warps=8, block_n=64), "num_warps"),
    (dict(num_warps=2), "num_warps"),
    (dict(num_stages=40), None),
])
def test_bad_configs_are_rejected_before_launch(kw, match):
    cfg = d.default_decode_config(3).replace(**kw)
    with pytest.raises((ValueError, SmemError), match=match):
        d.check_decode_config(cfg, 3, 160, 512, 64)


def test_repeated_launch_plans_from_the_cache(monkeypatch):
    """A second identical launch builds no ledger (the default config's stage cut and the config check each built
    ledgers on every call: ~65 µs of a CPU core at M = 16; scripts/probe_host_cpu.py)."""
    ops = _ops()
    first = d._args(**ops, config=None)
    built = []
    ledger = d.decode_ledger
    monkeypatch.setattr(d, "decode_ledger", lambda *a, **k: built.append(1) or ledger(*a, **k))
    again = d._args(**ops, config=None)
    assert built == [] and again[2] == first[2] and again[3] == first[3]


def test_bad_inputs():
    ops = _ops()
    with pytest.raises(ValueError, match="fmt must be one of"):
        d._args(**{**ops, "fmt": "int4_g32"}, config=None)
    with pytest.raises(ValueError, match="activations must be uint8"):   # 2l operands under the g64 contract
        d._args(**{**ops, "fmt": "int4_g64"}, config=None)
    with pytest.raises(ValueError, match="N must be a multiple of 16"):
        o = w4.make_operands_v2("int4_2l", 3, 152, 512, 16, 64, device="cpu")
        d._args(**o, config=None)
    with pytest.raises(ValueError, match="out must be"):
        d._args(**{**ops, "out": ops["out"][:, :8]}, config=None)


def test_auto_routing(monkeypatch):
    from lowrank_gemm.kernels import w4a4_gemm as g
    assert "decode" in g.IMPLS and g.AUTO_DECODE
    ops = _ops()
    assert g._use_decode("decode", ops["x_q"], 160, "int4_2l")
    assert not g._use_decode("auto", ops["x_q"], 160, "int4_2l")    # CPU tensors never take a GPU kernel
    assert not g._use_decode("v2", ops["x_q"], 160, "int4_2l")


# ---------------------------------------------------------------------------------------------- split-K / stream-K
# The work split and the ticket protocol on the host (DecodeWork mirrors the kernel's STREAM arithmetic), then the
# sm_90 compiles of the new variants.

WORK_CASES = [(224, 1, 16, 264), (224, 1, 16, 448), (224, 1, 16, 672), (224, 1, 16, 896), (224, 1, 32, 264),
              (448, 1, 32, 264), (3, 1, 3, 9), (5, 2, 7, 13), (1, 1, 1, 1), (7, 3, 5, 4), (2, 1, 16, 31),
              (10, 1, 8, 80), (33, 4, 2, 50)]


@pytest.mark.parametrize("tiles_n,tiles_t,k_tiles,programs", WORK_CASES)
def test_work_split_covers_every_iteration_once(tiles_n, tiles_t, k_tiles, programs):
    w = d.DecodeWork(tiles_n, tiles_t, k_tiles, programs)
    T = w.total
    ranges = [w.range_of(p) for p in range(programs)]
    assert ranges[0][0] == 0 and ranges[-1][1] == T
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert all(hi - lo in (T // programs, -(-T // programs)) for lo, hi in ranges)   # equal shares ± 1
    for p, (lo, hi) in enumerate(ranges):
        assert all(w.owner(it) == p for it in (lo, hi - 1))
    seen = {}
    for p in range(programs):
        for tile, k_lo, k_hi in w.segments(p):
            assert 0 <= k_lo < k_hi <= k_tiles
            for k in range(k_lo, k_hi):
                assert (tile, k) not in seen
                seen[(tile, k)] = p
    assert len(seen) == T
    contrib = {t: sorted({seen[(t, k)] for k in range(k_tiles)}) for t in range(w.tiles)}
    for t in range(w.tiles):
        assert list(w.contributors(t)) == contrib[t]      # consecutive programs, in iteration order
    assert w.max_contrib == max(len(c) for c in contrib.values())
    assert w.workspace_numel(128, 16) == (w.tiles * w.max_contrib * 128 * 16 if w.max_contrib > 1 else 0)


@pytest.mark.parametrize("tiles_n,tiles_t,k_tiles,programs", WORK_CASES)
@pytest.mark.parametrize("kind", ["fp32", "int"])
def test_ticket_protocol_model_is_order_independent(tiles_n, tiles_t, k_tiles, programs, kind):
    """Random interleavings of the programs: every tile finished once, tickets back at 0, and the finished values
    bit-identical whatever the arrival order (fp32 partials summed from zero in slot order; int partials — the 2l
    int32 path — equal the unsplit sum)."""
    import random
    w = d.DecodeWork(tiles_n, tiles_t, k_tiles, programs)
    gen = torch.Generator().manual_seed(tiles_n * 1000 + programs)
    vals = torch.randn(w.tiles, k_tiles, 8, generator=gen)          # per (tile, K step) contribution (8 lanes)
    ivals = torch.randint(-2**20, 2**20, (w.tiles, k_tiles), generator=gen)

    def partial(tile, k_lo, k_hi):   # a program's in-register accumulation over its K steps, from zero
        if kind == "int":
            return int(ivals[tile, k_lo:k_hi].sum())
        acc = torch.zeros(8, dtype=torch.float32)
        for k in range(k_lo, k_hi):
            acc = acc + vals[tile, k]
        return acc

    results = []
    for seed in range(4):
        rng = random.Random(seed)
        schedule = (lambda ready: ready[0]) if seed == 0 else (lambda ready: rng.choice(ready))
        done, tickets, slots = d.simulate_decode_work(w, partial, schedule)
        assert sorted(done) == list(range(w.tiles)) and not any(tickets)
        assert all(s < w.max_contrib for _, s in slots)
        results.append(done)
    for t in range(w.tiles):
        if kind == "int":
            assert all(r[t] == int(ivals[t].sum()) for r in results)
        else:
            assert all(torch.equal(r[t], results[0][t]) for r in results[1:])


def test_plan_decode_work_modes():
    c = d.default_decode_config(1)
    base = d.plan_decode_work(1, 28672, 4096, c)
    assert not base.stream and base.grid == (224, 1) and base.max_contrib == 1 and base.workspace_numel(128, 16) == 0
    for split in (2, 3, 4):
        w = d.plan_decode_work(1, 28672, 4096, c.replace(split_k=split))
        assert w.grid == (224 * split, ) and w.max_contrib == split
        assert all(len(w.segments(p)) == 1 for p in range(w.programs))        # split-K: inside one tile
    w = d.plan_decode_work(1, 28672, 4096, c.replace(split_k=64))             # split beyond the K steps
    assert w.programs == 224 * 16 and w.max_contrib == 16
    sk = d.plan_decode_work(1, 28672, 4096, c.replace(persistent=True), num_sms=132)
    assert sk.grid == (132 * d.CTAS_PER_SM, ) and sk.max_contrib == 3       # 13–14 steps per program, 16 per tile
    steps = [hi - lo for lo, hi in map(sk.range_of, range(sk.programs))]
    assert set(steps) == {13, 14} and max(len(sk.segments(p)) for p in range(sk.programs)) == 2
    tiny = d.plan_decode_work(1, 160, 512, c.replace(persistent=True), num_sms=132)   # fewer iterations than slots
    assert tiny.programs == tiny.total == 4 and tiny.max_contrib == 2
    with pytest.raises(ValueError, match="pick one"):
        d.check_decode_config(c.replace(split_k=2, persistent=True), 1, 160, 512, 64)
    with pytest.raises(ValueError, match="overflows int32"):
        d.DecodeWork(4096, 1, 4096, 4096 * 4096)


def test_ctas_per_sm_of_the_defaults():
    for fmt, f8 in (("int4_2l", False), ("int4_g64", False), ("int4_g64", True)):
        for m in (1, 16, 33, 64):
            c = d.default_decode_config(m, 64, fmt, f8)
            assert d.decode_ctas_per_sm(c, 64, fmt, f8) == d.CTAS_PER_SM
            assert d.decode_ctas_per_sm(c.replace(persistent=True), 64, fmt, f8) == d.CTAS_PER_SM
            # a 3-slot ring: three 2l CTAs per SM at 16-token tiles (registers ≤ REGS_2L_16), else still two
            three = c.replace(persistent=True, num_stages=3)
            assert d.decode_ctas_per_sm(three, 64, fmt, f8) == (3 if fmt == "int4_2l" and m <= 16 else 2)
    sk = d.plan_decode_work(1, 28672, 4096, d.default_decode_config(1).replace(persistent=True, num_stages=3))
    assert sk.programs == 396 and sk.max_contrib == 3


def test_split_env_and_launch_args(monkeypatch):
    monkeypatch.delenv(d.SPLIT_ENV, raising=False)
    assert d.plan_decode(1) == d.default_decode_config(1)
    monkeypatch.setenv(d.SPLIT_ENV, "3")
    assert d.plan_decode(1).split_k == 3
    cfg = d.default_decode_config(1).replace(block_k=128, num_stages=6)
    assert d.plan_decode(1, cfg) is cfg                                      # explicit configs win
    monkeypatch.setenv(d.SPLIT_ENV, "stream")
    assert d.plan_decode(1).persistent
    monkeypatch.setenv(d.SPLIT_ENV, "stream:3")
    assert d.plan_decode(1).persistent and d.plan_decode(1).num_stages == 3
    monkeypatch.setenv(d.SPLIT_ENV, "many")
    with pytest.raises(ValueError, match=d.SPLIT_ENV):
        d.plan_decode(1)
    monkeypatch.delenv(d.SPLIT_ENV)
    for fmt, dtype in (("int4_2l", torch.int32), ("int4_g64", torch.float32)):
        ops = w4.make_operands_v2(fmt, 3, 160, 1024, 16, 64, device="cpu")
        c = d.default_decode_config(3, 64, fmt, fmt != "int4_2l")
        grid, args, cx, _ = d._args(**ops, config=c.replace(split_k=2), pdl=False)
        work = d.plan_decode_work(3, 160, 1024, c.replace(split_k=2))
        assert cx["STREAM"] and grid == (work.programs, ) == (4, )     # 2 tiles × split 2
        names = [n for n in __import__("inspect").signature(d.w4a4_decode_kernel.fn).parameters if n not in cx]
        a = dict(zip(names, args))
        assert a["ws_ptr"].dtype == dtype and a["ws_ptr"].numel() == work.workspace_numel(c.block_n, c.block_m)
        assert a["cnt_ptr"].dtype == torch.int32 and not a["cnt_ptr"].any()
        assert (a["n_programs"], a["max_contrib"]) == (4, 2)
        grid, args, cx, _ = d._args(**ops, config=None, pdl=False)
        assert not cx["STREAM"] and grid == (2, 1)


def test_pre_expanded_e4m3_activations_are_accepted():
    """act_quant may hand the e4m3 operands over directly (x8, xab): no expansion launch, xab as the scale rows."""
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    ops = w4.make_operands_v2("int4_g64", 3, 160, 512, 16, 64, device="cpu")
    x8, xab = expand_act_f8(ops["x_q"], ops["x_scale"], 64)
    _, args, cx, _ = d._args(**{**ops, "x_q": x8, "x_scale": xab}, config=None, f8=True)
    assert cx["F8"] and args[5] is xab
    with pytest.raises(ValueError, match="e4m3 path"):
        d._args(**{**ops, "x_q": x8, "x_scale": xab}, config=None, f8=False)


def test_nonempty_k_switch(monkeypatch):
    monkeypatch.delenv("LOWRANK_GEMM_DECODE_NONEMPTY_K", raising=False)
    assert d.NONEMPTY_K_DEFAULT is True and d.decode_nonempty_k_default()     # H200 session 5: 47.0 → 45.2 µs at M=64
    monkeypatch.setenv("LOWRANK_GEMM_DECODE_NONEMPTY_K", "0")
    assert not d.decode_nonempty_k_default() and not d._args(**_ops(), config=None)[2]["NONEMPTY_K"]
    monkeypatch.setenv("LOWRANK_GEMM_DECODE_NONEMPTY_K", "1")
    assert d.decode_nonempty_k_default()
    assert d._args(**_ops(), config=None)[2]["NONEMPTY_K"]
    g = w4.make_operands_v2("int4_g64", 3, 160, 512, 16, 64, device="cpu")
    assert not d._args(**g, config=None)[2]["NONEMPTY_K"]                  # 2l only (the g loops wait per step)
    assert not d._args(**_ops(), config=None, nonempty_k=False)[2]["NONEMPTY_K"]


def _compile(M, fmt, f8, mode, pdl=False, nonempty_k=False, row_box=False, **cfg):
    from lowrank_gemm.kernels.aot import compile_sm90
    config = d.default_decode_config(M, 64, fmt, f8).replace(**cfg)
    if mode.startswith("stream"):
        config = config.replace(persistent=True, num_stages=int(mode[7:]) if ":" in mode else config.num_stages)
    elif mode.startswith("split"):
        config = config.replace(split_k=int(mode[5:]))
    sig, cx, c = d.aot_signature_decode(config, fmt=fmt, f8=f8, M=M, K=1024, pdl=pdl, nonempty_k=nonempty_k,
                                        row_box=row_box)
    return compile_sm90(MOD, "w4a4_decode_kernel", sig, cx, num_warps=d.WARPS), cx, c


# (M, fmt, f8, mode, pdl): the stream variants of every main loop, PDL with and without them
# (trimmed for CPU time: split/stream-K are measured, off-by-default options — one case per loop they touch)
VARIANTS = [(5, "int4_2l", False, "split2", False), (5, "int4_2l", False, "stream", True),
            (16, "int4_2l", False, "stream:3", False), (5, "int4_2l", False, "tile", True),
            (5, "int4_g64", True, "stream", True), (5, "int4_g64", True, "tile", True)]


@pytest.mark.parametrize("M,fmt,f8,mode,pdl", VARIANTS, ids=lambda v: str(v))
def test_sm90_split_stream_pdl_variants(M, fmt, f8, mode, pdl):
    info, cx, c = _compile(M, fmt, f8, mode, pdl)
    ptx = info.ptx
    kind = "f32.e4m3.e4m3" if f8 else "s32.s8.s8"
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{c.block_m}k32\.{kind} \{{[^}}]+\}}, \{{[^}}]+\}}", ptx)
    assert "cp.async.bulk.tensor.2d" in ptx and "cp.async.bulk.tensor.1d" in ptx and "ld.local" not in ptx
    assert _ledger_total(cx, c, 64, fmt, f8) == info.shared
    stream = mode != "tile"
    assert cx["STREAM"] == stream
    # the ticket protocol of kernels/splitk.py: acq_rel ticket, L2 (.cg) reads of the partials, relaxed reset
    assert ("atom.global.gpu.acq_rel.add" in ptx) == stream and ("atom.global.gpu.relaxed.exch" in ptx) == stream
    assert ("ld.global.cg" in ptx) == stream
    assert ("griddepcontrol" in ptx) == pdl
    if pdl:
        ur = c.block_k // 64
        launch, wait = ptx.index("griddepcontrol.launch_dependents"), ptx.index("griddepcontrol.wait")
        before = ptx[:wait]
        assert launch < ptx.index("cp.async.bulk.tensor")
        # all STAGES steps' expects, weight tiles and row-table rows are out; no token tile, load or store yet
        assert before.count("mbarrier.arrive.expect_tx") == c.num_stages
        assert before.count("cp.async.bulk.tensor") == c.num_stages * (1 + ur)
        assert not re.search(r"ld\.global|st\.global|atom\.", before)
        after = re.findall(r"cp\.async\.bulk\.tensor\.(\dd)", ptx[wait:])
        assert after[:c.num_stages] == ["2d"] * c.num_stages     # the token tiles [BT, BK], then the main loop
    rs = _ptxas(ptx)
    if rs is not None:
        regs, spills, log = rs
        assert "C7514" not in log and "C7515" not in log and "serialized" not in log, log
        if not (f8 and c.block_m > 16):   # f8 at 64 tokens sits at 255 registers already (8 B spill in stream)
            assert spills == 0, f"ptxas spills {spills} B ({regs} registers)"
        if fmt == "int4_2l" and c.block_m == 16:   # what decode_ctas_per_sm budgets (three CTAs per SM)
            assert regs <= d.REGS_2L_16, regs


@pytest.mark.parametrize("M,cfg", [(40, {}), (20, {}), (5, dict(block_k=512, num_stages=2))])
def test_sm90_nonempty_k_pipelines_the_2l_wgmmas(M, cfg):
    """The 2l K loop with a provable trip count ≥ 1: ptxas keeps the wgmmas in flight (no C7515) where the one-tile
    kernel serializes them (M > 16: the default configs of M = 17..64)."""
    info, cx, c = _compile(M, "int4_2l", False, "tile", nonempty_k=True, **cfg)
    assert cx["NONEMPTY_K"] and _ledger_total(cx, c) == info.shared
    rs = _ptxas(info.ptx)
    if rs is not None:
        regs, spills, log = rs
        assert spills == 0 and "C7515" not in log and "serialized" not in log, log


def test_split_stream_ledger_terms():
    for fmt, f8 in (("int4_2l", False), ("int4_g64", True)):
        c = d.default_decode_config(1, 64, fmt, f8)
        base = d.decode_ledger(c, 64, fmt, f8)
        for cfg in (c.replace(split_k=2), c.replace(persistent=True)):
            led = d.decode_ledger(cfg, 64, fmt, f8)
            scratch = led.term("ticket_scratch").bytes_each
            assert led.total() == -(-base.total() // 128) * 128 + 4 and 4 <= scratch < 132
            assert d.CTAS_PER_SM * led.total() <= d.SM90_SMEM_PER_SM


# ---- row box: the step's row table (u / w_scale) in one 2-D TMA box
def _bar_syncs(ptx: str) -> int:
    return len(re.findall(r"\bbar\.sync|\bbarrier\.sync", ptx))


# (M, fmt, f8, mode, pdl, config overrides): every main loop; stream-K (the ring crosses tiles); PDL (the box goes
# out before griddepcontrol.wait); 2l with 64 weight rows (64-byte rows: slots padded to 128 bytes, odd BK/G)
# (trimmed for CPU time: row_box is a measured, off-by-default option)
ROW_BOX_VARIANTS = [(5, "int4_2l", False, "tile", True, {}),
                    (5, "int4_2l", False, "tile", False, dict(block_n=64, block_k=64, num_stages=4)),
                    (40, "int4_g64", True, "tile", False, {})]


@pytest.mark.parametrize("M,fmt,f8,mode,pdl,cfg", ROW_BOX_VARIANTS, ids=lambda v: str(v))
def test_sm90_row_box_one_copy_per_step(M, fmt, f8, mode, pdl, cfg):
    """row_box: no 1-D copies left, three 2-D copies per step (tokens, weights, rows), fewer bar.syncs than the
    1-D rows (Triton's barrier pass puts one before each copy), ledger == compiled shared, no spills / C7514 /
    C7515; with PDL the STAGES weight + row boxes precede griddepcontrol.wait."""
    info, cx, c = _compile(M, fmt, f8, mode, pdl, nonempty_k=True, row_box=True, **cfg)
    base, bcx, _ = _compile(M, fmt, f8, mode, pdl, nonempty_k=True, **cfg)
    ptx = info.ptx
    assert "cp.async.bulk.tensor.1d" not in ptx and "cp.async.bulk.tensor.2d" in ptx and "ld.local" not in ptx
    assert _ledger_total(cx, c, 64, fmt, f8, row_box=True) == info.shared
    assert _ledger_total(bcx, c, 64, fmt, f8) == base.shared
    ur = c.block_k // 64
    assert ptx.count("cp.async.bulk.tensor") * (2 + ur) == base.ptx.count("cp.async.bulk.tensor") * 3
    if ur > 1:
        assert _bar_syncs(ptx) < _bar_syncs(base.ptx), (_bar_syncs(ptx), _bar_syncs(base.ptx))
    if pdl:
        before = ptx[:ptx.index("griddepcontrol.wait")]
        assert before.count("cp.async.bulk.tensor.2d") == 2 * c.num_stages
        assert not re.search(r"ld\.global|st\.global|atom\.", before)
    rs = _ptxas(ptx)
    if rs is not None:
        regs, spills, log = rs
        assert "C7514" not in log and "C7515" not in log and "serialized" not in log, log
        if not (f8 and c.block_m > 16):   # f8 at 64 tokens sits at 255 registers already (as without row_box)
            assert spills == 0, f"ptxas spills {spills} B ({regs} registers)"


def test_row_box_ledger_and_switch(monkeypatch):
    c = d.default_decode_config(5, 64, "int4_2l")
    # the defaults' rows are ≥ 128 bytes (2l 128 u bytes, g 64/128 16-bit scales): the same SMEM either way
    for fmt, f8, m in (("int4_2l", False, 5), ("int4_2l", False, 40), ("int4_g64", True, 5), ("int4_g64", True, 40)):
        cfg = d.default_decode_config(m, 64, fmt, f8)
        assert d.decode_ledger(cfg, 64, fmt, f8, row_box=True).total() == d.decode_ledger(cfg, 64, fmt, f8).total()
    # 64 u bytes per row: dense rows, each slot padded to 128 bytes (one step of BK = 64 → two rows)
    small = c.replace(block_n=64, block_k=64, num_stages=4)
    assert d.decode_ledger(small, row_box=True).term("ring.u_rows").bytes_each == 128
    assert d.decode_ledger(c.replace(block_n=64), row_box=True).term("ring.u_rows").bytes_each == 4 * 64
    assert d.decode_ledger(c.replace(block_n=64)).term("ring.u_rows").bytes_each == 4 * 128
    monkeypatch.delenv("LOWRANK_GEMM_DECODE_ROW_BOX", raising=False)
    assert d.ROW_BOX_DEFAULT is True and d.decode_row_box_default()      # session 34's H200 A/B
    _, args, _, cfg = d._args(**_ops(), config=None)
    assert list(args[2].block_shape) == [cfg.block_k // 64, cfg.block_n]
    monkeypatch.setenv("LOWRANK_GEMM_DECODE_ROW_BOX", "0")
    _, args, _, _ = d._args(**_ops(), config=None)
    assert len(args[2].block_shape) == 1
    _, args, _, cfg = d._args(**_ops(), config=None, row_box=True)
    assert list(args[2].block_shape) == [cfg.block_k // 64, cfg.block_n]


EPI_CASES = [("int4_g64", True, 16, 32, "bf16"), ("int4_2l", False, 5, 16, "f16"), ("int4_2l", False, 40, 64, "bf16"),
             ("int4_g64", False, 5, 24, "bf16"), ("int4_2l", False, 64, 128, "bf16")]


@pytest.mark.parametrize("fmt,f8,M,rank,up", EPI_CASES, ids=lambda v: str(v))
def test_sm90_epilogue_lowrank_is_one_wgmma(fmt, f8, M, rank, up):
    """epi_mma: the low-rank term is 16-bit wgmmas in lora_up's dtype (K = 16 each, rank rounded up to a power of
    two) on the accumulator, with no loop over the rank left; S's 16-bit tile is a ledger term; no spills.
    epi_mma=False keeps the per-rank loop (no 16-bit wgmma)."""
    from lowrank_gemm.kernels.aot import compile_sm90
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[up]
    sig, cx, c = d.aot_signature_decode(None, fmt=fmt, f8=f8, M=M, K=1024, rank=rank, epi_mma=True,
                                        lowrank_dtype=dtype)
    info = compile_sm90(MOD, "w4a4_decode_kernel", sig, cx, num_warps=d.WARPS)
    br = cx["BLOCK_R"]
    assert br == max(16, 1 << (rank - 1).bit_length())
    bf16 = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{c.block_m}k16\.f32\.{up}\.{up}", info.ptx)
    assert len(bf16) == (c.block_n // 64) * (br // 16)
    led = d.decode_ledger(c, 64, fmt, f8, lowrank_block=br, xab_rows=cx["XAB_ROWS"])
    assert led.term("lowrank.s16").bytes_each == c.block_m * br * 2 and led.total() == info.shared
    assert "ld.local" not in info.ptx
    rs = _ptxas(info.ptx)
    if rs is not None:
        assert rs[1] == 0, f"ptxas spills {rs[1]} B ({rs[0]} registers)"
    sig, cx, c = d.aot_signature_decode(None, fmt=fmt, f8=f8, M=M, K=1024, rank=rank, epi_mma=False,
                                        lowrank_dtype=dtype)
    loop = compile_sm90(MOD, "w4a4_decode_kernel", sig, cx, num_warps=d.WARPS)
    assert cx["BLOCK_R"] == 0 and f".{up}.{up}" not in loop.ptx
    assert d.decode_ledger(c, 64, fmt, f8, xab_rows=cx["XAB_ROWS"]).total() == loop.shared


def test_epilogue_mma_switch_and_fallbacks(monkeypatch):
    """Default on (EPI_MMA_DEFAULT), env LOWRANK_GEMM_DECODE_EPI_MMA=0 turns it off; ranks above EPI_MMA_MAX_RANK,
    rank 0 and f8 on 32/64-token tiles (already at the register limit) keep the loop."""
    def block_r(**kw):
        kw = {"fmt": "int4_2l", "M": 5, "K": 1024, "rank": 16, **kw}
        return d.aot_signature_decode(None, **kw)[1]["BLOCK_R"]
    assert d.EPI_MMA_DEFAULT and d.decode_epi_mma_default()
    assert block_r() == 16 and block_r(rank=33) == 64 and block_r(rank=128) == 128
    assert block_r(rank=129) == 0 and block_r(rank=0) == 0
    assert block_r(fmt="int4_g64", f8=True, M=16, rank=32) == 32
    assert block_r(fmt="int4_g64", f8=True, M=40, rank=32) == 0
    assert block_r(fmt="int4_g64", f8=False, M=40, rank=32) == 32
    monkeypatch.setenv("LOWRANK_GEMM_DECODE_EPI_MMA", "0")
    assert not d.decode_epi_mma_default() and block_r() == 0
    assert block_r(epi_mma=True) == 16


@pytest.mark.parametrize("M,K,mode", [(16, 4096, "tile"), (5, 640, "tile"), (16, 1024, "stream"), (3, 3072, "tile"),
                                     (16, 6144, "tile")])
def test_sm90_f8_xab_rows_from_shared_memory(M, K, mode):
    """xab_smem: the a/b rows of every group are copied into shared memory once (rows for every group of every K
    step, rounded up to a power of two ≥ 32: K = 3072 / 6144 need 96 / 192, which Triton 3.6 aborted the process
    on), the wgmma K loop has no global load left, the table is a ledger term, fewer registers than the L2 path, no
    spills."""
    from lowrank_gemm.kernels.aot import compile_sm90
    from test_gluon_skeleton import _ptx_loops
    cfg = d.default_decode_config(M, 64, "int4_g64", True)
    if mode == "stream":
        cfg = cfg.replace(persistent=True)
    info, in_loops = {}, {}
    for xs in (True, False):
        sig, cx, c = d.aot_signature_decode(cfg, fmt="int4_g64", f8=True, M=M, K=K, rank=32, xab_smem=xs)
        info[xs] = compile_sm90(MOD, "w4a4_decode_kernel", sig, cx, num_warps=d.WARPS)
        rows = cx["XAB_ROWS"]
        assert rows == (max(32, triton.next_power_of_2(2 * (-(-K // c.block_k)) * (c.block_k // 64))) if xs else 0)
        led = d.decode_ledger(c, 64, "int4_g64", True, lowrank_block=cx["BLOCK_R"], xab_rows=rows)
        assert led.total() == info[xs].shared
        if xs:
            assert led.term("xab_table").bytes_each == rows * c.block_m * 4
        loops = [body for _, body in _ptx_loops(info[xs].ptx) if any("wgmma.mma_async" in x for x in body)]
        assert loops
        in_loops[xs] = sum("ld.global" in x for b in loops for x in b)
    # one tile per program: no global load left in the K loop; stream-K: the tile loop around it keeps the
    # epilogue's and the split-K partials' loads
    assert in_loops[True] < in_loops[False] and (mode == "stream" or in_loops[True] == 0), in_loops
    rs, rs_l2 = _ptxas(info[True].ptx), _ptxas(info[False].ptx)
    if rs is not None:
        assert rs[1] == 0 and rs[0] < rs_l2[0], (rs[:2], rs_l2[:2])
    # with the rows' 2-D box (session 5's option; sm_90 SASS per K step at M = 16: 608 → 476 with the table → 417)
    sig, cx, c = d.aot_signature_decode(cfg, fmt="int4_g64", f8=True, M=M, K=K, rank=32, xab_smem=True, row_box=True)
    boxed = compile_sm90(MOD, "w4a4_decode_kernel", sig, cx, num_warps=d.WARPS)
    assert d.decode_ledger(c, 64, "int4_g64", True, row_box=True, lowrank_block=cx["BLOCK_R"],
                           xab_rows=cx["XAB_ROWS"]).total() == boxed.shared
    assert "cp.async.bulk.tensor.1d" not in boxed.ptx


def test_xab_table_rules(monkeypatch):
    """Only where it fits: f8, one token tile, CTAS_PER_SM CTAs per SM with the table (K = 14336 at 16 tokens is
    28 KB more: off with a rank-32 branch); on by default since session 34's H200 A/B (env
    LOWRANK_GEMM_DECODE_XAB_SMEM=0 turns it off); a table that a launch cannot use is refused by check_decode_config."""
    c16 = d.default_decode_config(16, 64, "int4_g64", True)
    assert d.decode_xab_smem_default() == d.XAB_SMEM_DEFAULT
    monkeypatch.setenv("LOWRANK_GEMM_DECODE_XAB_SMEM", "1")
    assert d.xab_table_rows(16, 4096, c16, 64, True) == 128
    assert d.xab_table_rows(16, 3072, c16, 64, True) == 128           # 96 rows needed: shapes are powers of two
    assert d.xab_table_rows(16, 6144, c16, 64, True, lowrank_block=32) == 256
    for k in (12288, 14336):       # 384 / 448 needed → 512 rows: two CTAs no longer fit, the rows stay L2 loads
        assert d.xab_table_rows(16, k, c16, 64, True) == 0
    assert d.xab_table_rows(16, 4096, c16, 64, False) == 0
    assert d.xab_table_rows(17, 4096, c16, 64, True) == 0            # two token tiles
    assert d.aot_signature_decode(None, fmt="int4_g64", f8=True, M=16, K=4096, rank=32)[1]["XAB_ROWS"] == 128
    monkeypatch.setenv("LOWRANK_GEMM_DECODE_XAB_SMEM", "0")
    assert d.aot_signature_decode(None, fmt="int4_g64", f8=True, M=16, K=4096, rank=32)[1]["XAB_ROWS"] == 0
    with pytest.raises(ValueError, match="xab table"):
        d.check_decode_config(c16, 17, 4096, 4096, 64, "int4_g64", True, xab_rows=128)
    with pytest.raises(ValueError, match="xab table"):
        d.check_decode_config(c16, 16, 4096, 4096, 64, "int4_g64", True, xab_rows=64)
    with pytest.raises(ValueError, match="power of two"):
        d.check_decode_config(c16, 16, 4096, 3072, 64, "int4_g64", True, xab_rows=96)


# ---------------------------------------------------------------------------------------------- GPU
CASES = [dict(M=1, N=160, K=512, rank=16, bias=True, col_scale=True, cfg=None, fmt="int4_g64"),
         dict(M=7, N=4112, K=4096, rank=32, bias=True, col_scale=False, cfg=None, fmt="int4_g64"),
         dict(M=64, N=28672, K=4096, rank=32, bias=False, col_scale=True, cfg=None, fmt="int4_g64"),
         dict(M=1, N=160, K=512, rank=16, bias=True, col_scale=True, cfg=None),
         dict(M=5, N=336, K=1024, rank=32, bias=False, col_scale=False, cfg=dict(block_n=128, block_k=128, num_stages=6)),
         dict(M=16, N=272, K=192, rank=0, bias=True, col_scale=False, cfg=dict(block_k=64, num_stages=8)),
         dict(M=33, N=4112, K=4096, rank=32, bias=True, col_scale=True, cfg=None),
         dict(M=64, N=28672, K=4096, rank=32, bias=True, col_scale=False, cfg=dict(block_k=512, num_stages=3))]


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.get('fmt', 'int4_2l')}-M{c['M']}N{c['N']}K{c['K']}r{c['rank']}")
def test_decode_matches_reference_gpu(case):
    c = dict(case)
    cfg = c.pop("cfg")
    fmt = c.pop("fmt", "int4_2l")
    ops = w4.make_operands_v2(fmt, c["M"], c["N"], c["K"], c["rank"], 64, device="cuda", bias=c["bias"],
                              col_scale=c["col_scale"])
    config = d.default_decode_config(c["M"], 64, fmt).replace(**cfg) if cfg else None
    out = d.launch_w4a4_decode(**ops, config=config).clone()
    ref = w4.reference_v2(ops)
    assert torch.isfinite(out).all(), "unwritten (NaN-poisoned) outputs"
    err = float((out.double().cpu() - ref).norm() / ref.norm())
    assert err < 1e-2, err
    assert torch.equal(d.launch_w4a4_decode(**ops, config=config), out)


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_decode_graph_capture_and_op_routing_gpu():
    from lowrank_gemm.kernels.w4a4_gemm import w4a4_gemm
    ops = w4.make_operands_v2("int4_2l", 16, 4096, 4096, 32, 64, device="cuda")
    want = d.launch_w4a4_decode(**ops).clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        d.launch_w4a4_decode(**ops)
    ops["out"].fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(ops["out"], want)
    for impl in ("decode", "auto"):   # auto routes int4_2l 3 ≤ M ≤ 64 here (the GEMV takes M ≤ 2)
        y = w4a4_gemm(ops["x_q"], ops["x_scale"], ops["w_q"], ops["w_scale"], ops["lowrank_act"], ops["lora_up"],
                      ops["bias"], w_mul=ops["w_mul"], fmt="int4_2l", impl=impl)
        assert torch.equal(y, want)


# ---- the e4m3 path (f8=True, int4_g64) on the GPU
F8_GPU_CASES = [dict(M=1, N=160, K=512, rank=16, bias=True, col_scale=True, gs=64, cfg=None),
                dict(M=5, N=4112, K=4096, rank=32, bias=True, col_scale=False, gs=64, cfg=None),
                dict(M=16, N=336, K=1024, rank=0, bias=False, col_scale=True, gs=64, cfg=None),
                dict(M=16, N=28672, K=4096, rank=32, bias=True, col_scale=False, gs=64, cfg=None),
                # ragged K: the last 256-wide step is half past K (groups past K/G must add exactly 0)
                dict(M=5, N=272, K=640, rank=16, bias=True, col_scale=False, gs=64, cfg=None),
                # K loop shorter than the ring
                dict(M=1, N=272, K=192, rank=0, bias=True, col_scale=False, gs=64, cfg=dict(block_k=64, num_stages=8)),
                dict(M=5, N=336, K=1024, rank=32, bias=False, col_scale=False, gs=64,
                     cfg=dict(block_k=128, num_stages=6)),
                dict(M=5, N=4112, K=4096, rank=16, bias=True, col_scale=False, gs=128, cfg=None),
                dict(M=40, N=4112, K=4096, rank=32, bias=True, col_scale=True, gs=64, cfg=None),
                dict(M=40, N=336, K=1024, rank=0, bias=False, col_scale=True, gs=64, cfg=None)]


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", F8_GPU_CASES, ids=lambda c: f"M{c['M']}N{c['N']}K{c['K']}r{c['rank']}g{c['gs']}"
                                                         + ("" if c["cfg"] is None else "-cfg"))
def test_decode_f8_matches_reference_and_int8_gpu(case):
    c = dict(case)
    cfg, gs = c.pop("cfg"), c.pop("gs")
    ops = w4.make_operands_v2("int4_g64", c["M"], c["N"], c["K"], c["rank"], gs, device="cuda", bias=c["bias"],
                              col_scale=c["col_scale"])
    config = d.default_decode_config(c["M"], gs, "int4_g64", f8=True).replace(**cfg) if cfg else None
    out = d.launch_w4a4_decode(**ops, config=config, f8=True).clone()
    torch.cuda.synchronize()
    ref = w4.reference_v2(ops)
    assert torch.isfinite(out).all(), f"unwritten (NaN-poisoned) outputs: {(~torch.isfinite(out)).sum().item()}"
    err = float((out.double().cpu() - ref).norm() / ref.norm())
    assert err < 1e-2, f"f8 vs float64 reference: rel err {err:.3e}"
    again = d.launch_w4a4_decode(**ops, config=config, f8=True)
    assert torch.equal(again, out), "f8 not bit-identical over repeats"
    # f8 vs the int8 path in fp32: both sum the same exact integers per group (int32 / exact fp32 partials),
    # they differ only in fp32 rounding of the rescale (and in the fp8 MMA's accumulation, if it were inexact)
    o32 = {**ops, "out": torch.full_like(ops["out"], float("nan"), dtype=torch.float32)}
    y8 = d.launch_w4a4_decode(**o32, config=config, f8=True).clone()
    o32["out"].fill_(float("nan"))
    cfg8 = d.default_decode_config(c["M"], gs, "int4_g64").replace(**cfg) if cfg else None
    yi = d.launch_w4a4_decode(**o32, config=cfg8, f8=False).clone()
    diff = float((y8.double() - yi.double()).norm() / yi.double().norm())
    assert diff < 1e-5, f"f8 vs int8 path (fp32 out): rel diff {diff:.3e}"


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_decode_f8_graph_capture_and_default_switch_gpu(monkeypatch):
    """The f8 launch (expand_act_f8 + kernel) replays from a CUDA graph; F8_DEFAULT / the env switch route
    int4_g64 through it (the op's impl='decode' included)."""
    from lowrank_gemm.kernels.w4a4_gemm import w4a4_gemm
    ops = w4.make_operands_v2("int4_g64", 16, 4096, 4096, 32, 64, device="cuda")
    want = d.launch_w4a4_decode(**ops, f8=True).clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        d.launch_w4a4_decode(**ops, f8=True)
    ops["out"].fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(ops["out"], want)
    monkeypatch.setenv("LOWRANK_GEMM_DECODE_F8", "1")
    assert torch.equal(d.launch_w4a4_decode(**ops), want)
    y = w4a4_gemm(ops["x_q"], ops["x_scale"], ops["w_q"], ops["w_scale"], ops["lowrank_act"], ops["lora_up"],
                  ops["bias"], fmt="int4_g64", impl="decode")
    assert torch.equal(y, want)


# ---- split-K / stream-K, PDL and nonempty_k on the GPU
SPLIT_MODES = ["split2", "split3", "split4", "stream"]
SPLIT_FMTS = [("int4_2l", False), ("int4_g64", True), ("int4_g64", False)]
SPLIT_SHAPES = [dict(M=1, N=160, K=512, rank=16, bias=True, col_scale=True),
                dict(M=5, N=336, K=640, rank=32, bias=False, col_scale=False),     # ragged K: the last step half past K
                dict(M=16, N=28672, K=4096, rank=32, bias=True, col_scale=False),  # the decode shape (224 tiles)
                dict(M=40, N=4112, K=4096, rank=32, bias=True, col_scale=True)]    # 64-token tiles, ragged N


def _mode_config(M, fmt, f8, mode, **over):
    c = d.default_decode_config(M, 64, fmt, f8).replace(**over)
    if mode == "stream":
        return c.replace(persistent=True)
    return c.replace(split_k=int(mode[5:])) if mode.startswith("split") else c


def _tickets_zero():
    from lowrank_gemm.kernels import lora_gemm as LG
    torch.cuda.synchronize()
    return LG._TICKETS.all_zero(torch.device("cuda", torch.cuda.current_device()))


@pytest.mark.gpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=lambda c: f"M{c['M']}N{c['N']}K{c['K']}")
@pytest.mark.parametrize("fmt,f8", SPLIT_FMTS, ids=["2l", "g64f8", "g64int8"])
@pytest.mark.parametrize("mode", SPLIT_MODES)
def test_decode_split_stream_matches_reference_gpu(mode, fmt, f8, shape):
    """Each split / stream-K plan vs the float64 reference (NaN-poisoned out), bit-identical over repeats, against
    the one-tile-per-program kernel (2l: bit-identical — int32 partials; g: the fp32 sums differ in order only),
    tickets back at zero."""
    c = dict(shape)
    ops = w4.make_operands_v2(fmt, c["M"], c["N"], c["K"], c["rank"], 64, device="cuda", bias=c["bias"],
                              col_scale=c["col_scale"])
    config = _mode_config(c["M"], fmt, f8, mode)
    out = d.launch_w4a4_decode(**ops, config=config, f8=f8).clone()
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), f"unwritten (NaN-poisoned) outputs: {(~torch.isfinite(out)).sum().item()}"
    ref = w4.reference_v2(ops)
    err = float((out.double().cpu() - ref).norm() / ref.norm())
    assert err < 1e-2, err
    for _ in range(2):
        ops["out"].fill_(float("nan"))
        assert torch.equal(d.launch_w4a4_decode(**ops, config=config, f8=f8), out), "not bit-identical over repeats"
    o32 = {**ops, "out": torch.full_like(ops["out"], float("nan"), dtype=torch.float32)}
    ys = d.launch_w4a4_decode(**o32, config=config, f8=f8).clone()
    o32["out"].fill_(float("nan"))
    y1 = d.launch_w4a4_decode(**o32, config=_mode_config(c["M"], fmt, f8, "tile"), f8=f8).clone()
    if fmt == "int4_2l":
        assert torch.equal(ys, y1), "2l split partials are int32: the sum must equal the unsplit kernel's"
    else:
        diff = float((ys.double() - y1.double()).norm() / y1.double().norm())
        assert diff < 1e-5, f"split vs unsplit (fp32 out): rel diff {diff:.3e}"
    assert _tickets_zero()


@pytest.mark.gpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt,f8", SPLIT_FMTS[:2], ids=["2l", "g64f8"])
@pytest.mark.parametrize("mode", ["split3", "stream"])
def test_decode_split_graph_replay_reuses_tickets_gpu(mode, fmt, f8):
    """Three split launches back to back in one CUDA graph (one ticket region), replayed: the same bits as eager,
    and every ticket back at zero after each replay."""
    ops = [w4.make_operands_v2(fmt, 16, 4096, 4096, 32, 64, device="cuda", seed=s) for s in range(3)]
    config = _mode_config(16, fmt, f8, mode)
    want = [d.launch_w4a4_decode(**o, config=config, f8=f8).clone() for o in ops]
    _, g, _ = capture_graph(lambda: [d.launch_w4a4_decode(**o, config=config, f8=f8) for o in ops])
    for _ in range(3):
        for o in ops:
            o["out"].fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(o["out"], w) for o, w in zip(ops, want))
        assert _tickets_zero()


@pytest.mark.gpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("fmt,f8", SPLIT_FMTS[:2], ids=["2l", "g64f8"])
@pytest.mark.parametrize("mode", ["tile", "stream"])
def test_decode_pdl_gpu(mode, fmt, f8):
    """PDL launches (eager, and in a CUDA graph behind a producer that writes the activations the GEMM reads)
    give the non-PDL bits."""
    ops = w4.make_operands_v2(fmt, 16, 4096, 4096, 32, 64, device="cuda")
    config = _mode_config(16, fmt, f8, mode)
    want = d.launch_w4a4_decode(**ops, config=config, f8=f8, pdl=False).clone()
    ops["out"].fill_(float("nan"))
    assert torch.equal(d.launch_w4a4_decode(**ops, config=config, f8=f8, pdl=True), want)
    if f8:   # the producer: expand_act_f8 into the buffers the GEMM reads (pre-expanded e4m3 operands)
        from lowrank_gemm.kernels.w4_expand import expand_act_f8
        x8, xab = expand_act_f8(ops["x_q"], ops["x_scale"], 64)
        src, dst = (ops["x_q"], ops["x_scale"]), (torch.zeros_like(x8), torch.zeros_like(xab))
        produce = lambda: [t.copy_(s) for t, s in zip(dst, expand_act_f8(*src, 64))]
    else:    # the producer: a copy of the int8 tokens
        src, dst = (ops["x_q"], ), (torch.zeros_like(ops["x_q"]), )
        produce = lambda: dst[0].copy_(src[0])
    gops = {**ops, "x_q": dst[0], "x_scale": dst[1] if f8 else ops["x_scale"]}

    def layer():
        produce()
        d.launch_w4a4_decode(**gops, config=config, f8=f8, pdl=True)
    _, g, _ = capture_graph(layer)
    for t in dst:
        t.zero_()
    gops["out"].fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(gops["out"], want)
    assert _tickets_zero()


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("M", [20, 40, 64])
def test_decode_nonempty_k_bit_identical_gpu(M):
    """The 2l K loop that ptxas keeps pipelined (nonempty_k) gives the default kernel's bits (int32 sums)."""
    ops = w4.make_operands_v2("int4_2l", M, 4112, 4096, 32, 64, device="cuda", col_scale=True)
    want = d.launch_w4a4_decode(**ops, nonempty_k=False).clone()
    ops["out"].fill_(float("nan"))
    got = d.launch_w4a4_decode(**ops, nonempty_k=True)
    assert torch.equal(got, want)
    ref = w4.reference_v2(ops)
    assert float((got.double().cpu() - ref).norm() / ref.norm()) < 1e-2


# ---- row box on the GPU
ROW_BOX_GPU = [dict(M=1, N=160, K=512), dict(M=5, N=336, K=640),          # ragged K: the last box half past K/G
               dict(M=16, N=4112, K=4096), dict(M=40, N=4112, K=4096)]   # ragged N (the box's last columns: OOB)


@pytest.mark.gpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("shape", ROW_BOX_GPU, ids=lambda c: f"M{c['M']}N{c['N']}K{c['K']}")
@pytest.mark.parametrize("fmt,f8,over", [("int4_2l", False, {}), ("int4_g64", True, {}), ("int4_g64", False, {}),
                                         ("int4_2l", False, dict(block_n=64, block_k=64, num_stages=4))],
                         ids=["2l", "g64f8", "g64int8", "2l-64rows"])
@pytest.mark.parametrize("mode", ["tile", "stream"])
def test_decode_row_box_matches_1d_rows_gpu(mode, fmt, f8, over, shape):
    """The 2-D row box gives the 1-D rows' bits (same products, same order), NaN-poisoned out fully written,
    bit-identical over repeats, PDL bits = non-PDL bits."""
    M, N, K = shape["M"], shape["N"], shape["K"]
    ops = w4.make_operands_v2(fmt, M, N, K, 32, 64, device="cuda", bias=True, col_scale=True)
    config = _mode_config(M, fmt, f8, mode, **over)
    want = d.launch_w4a4_decode(**ops, config=config, f8=f8, row_box=False).clone()
    for pdl in (False, True):
        for _ in range(2):
            ops["out"].fill_(float("nan"))
            got = d.launch_w4a4_decode(**ops, config=config, f8=f8, row_box=True, pdl=pdl)
            torch.cuda.synchronize()
            assert torch.isfinite(got).all()
            assert torch.equal(got, want)
    ref = w4.reference_v2(ops)
    assert float((got.double().cpu() - ref).norm() / ref.norm()) < 1e-2
    assert _tickets_zero()


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt,f8", SPLIT_FMTS[:2], ids=["2l", "g64f8"])
def test_decode_row_box_graph_replay_gpu(fmt, f8):
    ops = [w4.make_operands_v2(fmt, 16, 4096, 4096, 32, 64, device="cuda", seed=s) for s in range(2)]
    want = [d.launch_w4a4_decode(**o, f8=f8, row_box=True).clone() for o in ops]
    _, g, _ = capture_graph(lambda: [d.launch_w4a4_decode(**o, f8=f8, row_box=True) for o in ops])
    for _ in range(2):
        for o in ops:
            o["out"].fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(o["out"], w) for o, w in zip(ops, want))



def _checked_outputs(ops, config, ref, option, values, **fixed):
    """One launch per value of the launcher option ``option`` (plus the options ``fixed``), each into a NaN-poisoned
    output: every element written, within 1e-2 of the float64 reference, a repeat bit-identical. The outputs, in
    ``values`` order."""
    outs = []
    for v in values:
        ops["out"].fill_(float("nan"))
        out = d.launch_w4a4_decode(**ops, config=config, **fixed, **{option: v}).clone()
        assert torch.isfinite(out).all(), "unwritten (NaN-poisoned) outputs"
        err = float((out.double().cpu() - ref).norm() / ref.norm())
        assert err < 1e-2, (option, v, err)
        assert torch.equal(d.launch_w4a4_decode(**ops, config=config, **fixed, **{option: v}), out)
        outs.append(out)
    return outs

EPI_GPU = [dict(M=16, N=28672, K=4096, rank=32, fmt="int4_g64", mode="tile"),
           dict(M=5, N=4112, K=1024, rank=24, fmt="int4_g64", mode="tile"),
           dict(M=3, N=336, K=640, rank=64, fmt="int4_g64", mode="stream"),
           dict(M=40, N=4112, K=4096, rank=128, fmt="int4_2l", mode="tile"),
           dict(M=7, N=336, K=640, rank=40, fmt="int4_2l", mode="stream", up=torch.float16),
           dict(M=64, N=28672, K=4096, rank=32, fmt="int4_2l", mode="tile")]


@pytest.mark.gpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", EPI_GPU,
                         ids=lambda c: f"{c['fmt']}-{c['mode']}-M{c['M']}N{c['N']}K{c['K']}r{c['rank']}")
def test_decode_epilogue_mma_matches_reference_and_loop_gpu(case):
    """The low-rank term as one wgmma and as the per-rank loop: both against the float64 reference (ragged ranks,
    stream-K programs that finish several tiles, an fp16 lora_up, NaN-poisoned outputs), each repeat bit-identical,
    and the two within 16-bit rounding of each other. (The fp16 case has not run on a GPU yet: added in session 32
    after the device went away.)"""
    c = dict(case)
    ops = w4.make_operands_v2(c["fmt"], c["M"], c["N"], c["K"], c["rank"], 64, device="cuda", bias=True,
                              col_scale=True, lowrank_dtype=c.get("up", torch.bfloat16))
    config = _mode_config(c["M"], c["fmt"], c["fmt"] == "int4_g64", c["mode"])
    mma, loop = (o.float() for o in _checked_outputs(ops, config, w4.reference_v2(ops), "epi_mma", (True, False)))
    assert float((mma - loop).norm() / loop.norm()) < 1e-2


XAB_GPU = [dict(M=16, N=28672, K=4096, mode="tile"), dict(M=3, N=4112, K=640, mode="tile"),
           dict(M=9, N=336, K=1152, mode="stream"), dict(M=16, N=4096, K=14336, mode="tile"),
           dict(M=3, N=4096, K=3072, mode="tile"), dict(M=1, N=3072, K=12288, mode="tile")]


@pytest.mark.gpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", XAB_GPU, ids=lambda c: f"{c['mode']}-M{c['M']}N{c['N']}K{c['K']}")
def test_decode_f8_xab_table_bit_identical_gpu(case):
    """The a/b rows from the shared-memory table and from L2: the same fp32 values in the same FMA order, so the
    outputs are bit-identical (K = 12288 / 14336 fall back to L2 by the SMEM rule; ragged K; stream-K programs that
    span tiles; K = 3072, whose 96 needed rows aborted the process in Triton's compiler until session 44 rounded the
    table up to a power of two; with the rows' 2-D box too), and both match the float64 reference into a
    NaN-poisoned output."""
    c = dict(case)
    ops = w4.make_operands_v2("int4_g64", c["M"], c["N"], c["K"], 32, 64, device="cuda", bias=True)
    config = _mode_config(c["M"], "int4_g64", True, c["mode"])
    ref = w4.reference_v2(ops)
    table, l2 = _checked_outputs(ops, config, ref, "xab_smem", (True, False))
    assert torch.equal(table, l2)
    boxed, = _checked_outputs(ops, config, ref, "xab_smem", (True, ), row_box=True)   # the rows' 2-D box beside it
    assert torch.equal(boxed, l2)


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_decode_smoke_paths():
    """The sanitizer target (``smoke --fmt decode``): the decode kernel's default paths (e4m3 tokens also at K = 3072,
    the padded xab table) and the W4A8 layer at M ≤ 16 pass their checks."""
    from lowrank_gemm.kernels.gluon.smoke import main
    assert main(["--fmt", "decode"]) == 0
