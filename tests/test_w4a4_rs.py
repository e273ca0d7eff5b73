"""The register-A W4A4 kernel (kernels/gluon/w4a4_rs.py): sm_90 compiles (PTX, ptxas registers/spills, SMEM ledger),
the pipeline protocol's host model, a float64 emulation of the kernel's data path (TMA boxes with zero fill,
token chunks, the e4m3 offset algebra) and bad-input errors on the CPU; numerics, repeats, graph replay and the
agreement with v2 on the GPU (each config in a child process under a timeout: a wrong mbarrier phase hangs).

    CPU:  PYTHONPATH=src python -m pytest -q tests/test_w4a4_rs.py
    GPU:  PYTHONPATH=src python -m pytest -m gpu -q tests/test_w4a4_rs.py
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lowrank_gemm.kernels.gluon import w4a4_rs as rs
from lowrank_gemm.kernels.gluon import w4a4_ws as w4
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.plan.smem import SmemError

from _sm90 import ptxas_stats  # noqa: E402

MOD = "lowrank_gemm.kernels.gluon.w4a4_rs"
ROOT = Path(__file__).resolve().parents[1]


def _cfg(bt, bn, bk, stages=None, group_m=8):
    return KernelConfig(block_m=bt, block_n=bn, block_k=bk, block_r=16, group_m=group_m, num_warps=bn // 16,
                        num_stages=stages or 3, persistent=True)


# The configurations the probe times (scripts/probe_w4a4_rs.py): tag → (config, nsplit, stages).
CONFIGS = {tag: rs.config_from_tag(tag) for tag in rs.PROBE_TAGS}


_ptxas = ptxas_stats


def _ptx_loops(ptx: str):
    """[(label, body lines)] of every PTX loop (a label with a later branch back to it)."""
    lines = ptx.splitlines()
    loops = []
    for i, line in enumerate(lines):
        if line.startswith("$L__BB") and ":" in line:
            label = line.split(":")[0]
            for j in range(i + 1, len(lines)):
                if lines[j].strip().endswith((f"bra \t{label};", f"bra.uni \t{label};")):
                    loops.append((label, lines[i:j + 1]))
                    break
    return loops


def _compile(tag, **kw):
    from lowrank_gemm.kernels.aot import compile_sm90
    config, opts = CONFIGS[tag]
    sig, cx, cfg = rs.aot_signature_rs(config, **{**opts, **kw})
    return compile_sm90(MOD, "w4a4_rs_kernel", sig, cx, num_warps=cfg.num_warps), cx, cfg


# ---------------------------------------------------------------------------------------------- sm_90 compiles
# the kernel is experimental (not routed): CI compiles the default and the fastest measured config
# (probes/probe_w4a4_rs.md); LOWRANK_GEMM_TEST_ALL_RS=1 compiles every probe config
CI_CONFIGS = sorted(CONFIGS) if os.environ.get("LOWRANK_GEMM_TEST_ALL_RS") == "1" else ["default", "t64n64k256",
                                                                                      "t128n64k128r"]


@pytest.mark.parametrize("tag", CI_CONFIGS)
def test_sm90_register_a_e4m3_wgmma_tma_no_spills_and_ledger(tag):
    """Every timed config: e4m3 wgmmas with a REGISTER A operand (the packed weights never go back to SMEM), the
    token tile as the B descriptor, TMA for every ring, no local memory, ptxas 0 spills and no serialized wgmmas,
    and the ledger equal to the compiled shared memory."""
    info, cx, cfg = _compile(tag)
    btc = cfg.block_m // cx["NSPLIT"]
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{btc}k32\.f32\.e4m3\.e4m3 \{{[^}}]+\}}, \{{[^}}]+\}}, %rd",
                     info.ptx), "register-A e4m3 wgmma"
    assert ".s32.s8.s8" not in info.ptx and "cvt.rn.f32.s32" not in info.ptx, "no int8 MMA, no I2F"
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16", info.ptx), "s·lora_upᵀ wgmma"
    assert "lop3.b32" in info.ptx and "0x08080808" in info.ptx, "offset-nibble LOP3"
    assert "cp.async.bulk.tensor.2d" in info.ptx and "ld.local" not in info.ptx
    led = rs.rs_ledger(cfg, group_size=64, has_lowrank=cx["HAS_LOWRANK"], ratio=cx["RATIO"])
    assert led.total() == info.shared, (led.table(), info.shared)
    res = _ptxas(info.ptx)
    if res is not None:
        regs, spills, log = res
        print(f"{tag}: {regs} registers, {spills} B spills, shared {info.shared}")
        assert spills == 0, f"ptxas spills {spills} B ({regs} registers)"
        assert "C7514" not in log and "serialized" not in log, log


@pytest.mark.parametrize("kw", [dict(rank=0, bias=False, col_scale=False), dict(rank=64), dict(group_size=128, K=512)],
                         ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_sm90_variants_compile_and_match_the_ledger(kw):
    info, cx, cfg = _compile("default", **kw)
    led = rs.rs_ledger(cfg, group_size=kw.get("group_size", 64), has_lowrank=cx["HAS_LOWRANK"])
    assert led.total() == info.shared, (led.table(), info.shared)
    assert ("bf16.bf16" in info.ptx) == cx["HAS_LOWRANK"]
    res = _ptxas(info.ptx)
    if res is not None:
        assert res[1] == 0, f"ptxas spills {res[1]} B"


def test_k_loop_is_two_ffma_per_element_per_group_no_global_loads_no_smem_stores():
    """The K loop (the loop with the e4m3 wgmmas): 2·UR FFMAs per accumulator element, the scale rows from SMEM
    (no global loads), no SMEM stores (nothing expanded is written back), and one wait that leaves this unit's
    wgmmas in flight per later unit."""
    info, cx, cfg = _compile("default", rank=0, bias=False, col_scale=False)
    kloops = [body for _, body in _ptx_loops(info.ptx) if any("e4m3.e4m3" in x for x in body)]
    assert len(kloops) == 1, "one K loop"
    body = kloops[0]
    ur = cfg.block_k // 64
    per_thread = cfg.block_m * cfg.block_n // (32 * cfg.num_warps)
    assert sum(x.strip().startswith("fma.rn.f32") for x in body) == 2 * ur * per_thread
    assert not any(re.search(r"\bld\.global", x) for x in body), "scale rows come through the ring"
    assert not any(x.strip().startswith("st.shared") for x in body), "no expanded operand goes back to SMEM"
    units = ur * cx["NSPLIT"]
    assert sum("wgmma.wait_group.sync.aligned 2;" in x for x in body) == units - 1
    assert sum("wgmma.wait_group.sync.aligned 0;" in x for x in body) == 1


# ---------------------------------------------------------------------------------------------- protocol model
@pytest.mark.parametrize("n_local,k_tiles,stages", [(1, 1, 3), (1, 2, 3), (3, 1, 3), (4, 2, 3), (2, 12, 3), (5, 3, 7),
                                                    (3, 48, 3), (9, 1, 2), (2, 5, 8)])
def test_cursor_transcription_matches_the_closed_forms(n_local, k_tiles, stages):
    """The kernel's incremental loop variables give every flat step the slot step % S and the wait parity
    (step // S) & 1, and refill a slot with exactly flat step + S (its tile and K step), never past the end."""
    ev = rs.rs_cursor_host(n_local, k_tiles, stages)
    total = n_local * k_tiles
    assert len(ev) == total
    assert ev[0]["prologue"] == [(i // k_tiles, i % k_tiles) for i in range(min(stages, total))]
    for step, e in enumerate(ev):
        assert (e["slot"], e["phase"]) == (step % stages, (step // stages) & 1)
        nxt = step + stages
        assert e["refill"] == ((nxt // k_tiles, nxt % k_tiles) if nxt < total else None)


def test_steps_host_follow_the_grouped_tile_order():
    from lowrank_gemm.kernels.gluon.skeleton import program_tiles_host
    cfg = _cfg(128, 128, 256, stages=3)
    M, N, K, grid = 4608, 12288, 3072, 132
    for pid in (0, 1, 131):
        steps = rs.rs_steps_host(pid, grid, M, N, K, cfg)
        tiles = program_tiles_host(pid, grid, M, N, 128, 128, 8)
        assert len(steps) == len(tiles) * 12
        assert [(s["off_t"] // 128, s["off_n"] // 128) for s in steps[::12]] == tiles
        assert [s["slot"] for s in steps[:7]] == [0, 1, 2, 0, 1, 2, 0]


@pytest.mark.parametrize("n_tiles,k_tiles,stages", [(1, 1, 3), (3, 2, 3), (2, 7, 3), (5, 1, 4), (4, 3, 2), (3, 5, 7),
                                                    (6, 2, 8)])
def test_protocol_model_is_sound(n_tiles, k_tiles, stages):
    """Real mbarrier parity semantics, random interleavings of the warps and of TMA landings: every wait passes on
    the fill it wants, no slot or low-rank buffer is refilled while a warp may read it, nothing deadlocks."""
    for seed in range(8):
        for warps in (2, 4, 8):
            for has_lr in (True, False):
                r = rs.simulate_rs(n_tiles, k_tiles, stages, has_lowrank=has_lr, warps=warps, seed=seed)
                assert r.ok, r.why


def test_protocol_model_catches_a_refill_before_the_step_barrier():
    """Without the per-step thread barrier the elected warp refills a slot another warp may still read (the race
    the barrier is there for): the model must see it."""
    bad = [rs.simulate_rs(3, 4, 3, warps=4, seed=s, refill_early=True) for s in range(10)]
    assert any(not r.ok and "may still read" in r.why for r in bad)


# ---------------------------------------------------------------------------------------------- host emulation
def _box(t, r0, c0, rows, cols):
    """A TMA box [rows, cols] of 2-D ``t`` at (r0, c0): out-of-bounds elements read as zero."""
    out = torch.zeros(rows, cols, dtype=t.dtype)
    r1, c1 = min(r0 + rows, t.shape[0]), min(c0 + cols, t.shape[1])
    if r1 > r0 and c1 > c0:
        out[:r1 - r0, :c1 - c0] = t[r0:r1, c0:c1]
    return out


def _emulate(ops, config, nsplit, grid):
    """float64 replay of the kernel on the host: each program's flat steps (rs_steps_host), the four TMA boxes per
    step with zero fill, per group j and token chunk c the offset-nibble partial P' = W'·Xᵀ (W' = (q_w + 8)·2⁻⁹, as
    the LOP3 bytes mean in e4m3, zero bytes → n' = 8), acc = (P'·a + b)·ws + acc, then the epilogue and the masked
    transposed store."""
    from lowrank_gemm.formats.int4 import unpack_int4
    from lowrank_gemm.kernels.w4_expand import expand_act_f8_ref
    G = ops["group_size"]
    M, K = ops["x_q"].shape[0], 2 * ops["x_q"].shape[1]
    N = ops["w_q"].shape[0]
    bt, bn, bk = config.block_m, config.block_n, config.block_k
    ur, btc = bk // G, bt // nsplit
    x8, xab = expand_act_f8_ref(ops["x_q"], ops["x_scale"], G)
    x8, ab_rows = x8.double(), xab.reshape(2 * K // G, M).double()
    ws = ops["w_scale"].double()
    out = torch.full((M, N), float("nan"), dtype=torch.float64)
    k_tiles = -(-K // bk)
    for pid in range(grid):
        steps = rs.rs_steps_host(pid, grid, M, N, K, config)
        for t0 in range(0, len(steps), k_tiles):
            off_t, off_n = steps[t0]["off_t"], steps[t0]["off_n"]
            acc = torch.zeros(bn, bt, dtype=torch.float64)
            for st in steps[t0:t0 + k_tiles]:
                kk = st["kk"]
                xb = _box(x8, off_t, kk * bk, bt, bk)
                wb = _box(ops["w_q"], off_n, kk * bk // 2, bn, bk // 2)
                wn = (unpack_int4(wb).double() + 8) / 512                       # zero bytes → n' = 8
                abb = _box(ab_rows, 2 * ur * kk, off_t, 2 * ur, bt)
                wsb = _box(ws, ur * kk, off_n, ur, bn)
                for j in range(ur):
                    ks = slice(j * G, (j + 1) * G)
                    for c in range(nsplit):
                        cs = slice(c * btc, (c + 1) * btc)
                        part = wn[:, ks] @ xb[cs, ks].t()
                        acc[:, cs] += (part * abb[2 * j, cs] + abb[2 * j + 1, cs]) * wsb[j][:, None]
            if ops.get("col_scale") is not None:
                acc *= _box(ops["col_scale"].double()[:, None], off_n, 0, bn, 1)
            if ops["lowrank_act"] is not None:
                s = ops["lowrank_act"].to(ops["lora_up"].dtype).double()
                acc += _box(ops["lora_up"].double(), off_n, 0, bn, s.shape[1]) @ _box(s, off_t, 0, bt, s.shape[1]).t()
            if ops["bias"] is not None:
                acc += _box(ops["bias"].double()[:, None], off_n, 0, bn, 1)
            rows, cols = min(bt, M - off_t), min(bn, N - off_n)
            out[off_t:off_t + rows, off_n:off_n + cols] = acc[:cols, :rows].t()
    return out


@pytest.mark.parametrize("tag,M,N,K,rank,G,grid", [
    ("default", 300, 320, 448, 32, 64, 2),      # ragged M, N and K (the last 256-wide step is 3/4 past K)
    ("default", 300, 320, 448, 32, 64, 5),
    ("t128n128k128", 132, 136, 192, 5, 64, 1),  # one program walking four tiles (the ring crosses tiles)
    ("t64n64k256", 200, 264, 512, 16, 128, 3),  # G = 128: two 64-wide blocks chain per partial
    ("t128n64k128", 64, 72, 64, 0, 64, 1),      # K = one group, no low-rank
])
def test_host_emulation_of_the_data_path_matches_the_reference(tag, M, N, K, rank, G, grid):
    config, opts = CONFIGS[tag]
    ops = w4.make_operands_v2("int4_g64", M, N, K, rank, G, device="cpu", bias=rank > 0, col_scale=rank > 0)
    cfg = rs.plan_rs(rank, G, config)
    got = _emulate(ops, cfg, opts.get("nsplit") or rs.default_nsplit(cfg.block_m), grid)
    ref = w4.reference_v2(ops)
    assert torch.isfinite(got).all(), "every output element is stored exactly once"
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-12


def _emulate_ratio(ops, G, bk=512):
    """float64 replay of the RATIO arithmetic over the K steps of a BLOCK_K = bk config: per group (the last step's
    groups past K included, their rows read as TMA would: zero past the table) U = U·ρa·ρw + cb + P', then
    Y = U·a_last·ws_last — from the tables the launcher builds (ratio_act_tables / ratio_weight_tables)."""
    from lowrank_gemm.formats.int4 import unpack_int4
    from lowrank_gemm.kernels.w4_expand import expand_act_f8_ref
    x8, xab = expand_act_f8_ref(ops["x_q"], ops["x_scale"], G)
    K = x8.shape[1]
    rab, a_last = rs.ratio_act_tables(xab, G)
    rw, w_last = rs.ratio_weight_tables(ops["w_scale"], G)
    pad = rs.ratio_groups(K // G, G) - K // G
    assert rab.shape[0] == rw.shape[0] == K // G + pad
    assert bool((rab[K // G:, 0] == 1).all() and (rab[K // G:, 1] == 0).all() and (rw[K // G:] == 1).all()), \
        "padded groups leave the running sum alone"
    rab, a_last, rw, w_last = (t.double() for t in (rab, a_last, rw, w_last))
    wn = (unpack_int4(ops["w_q"]).double() + 8) / 512
    kp = -(-K // bk) * bk                     # the K the steps cover: tokens past K are 0, weight bytes 0 → n' = 8
    x8 = torch.nn.functional.pad(x8.double(), (0, kp - K))
    wn = torch.nn.functional.pad(wn, (0, kp - K), value=8 / 512)
    u = torch.zeros(x8.shape[0], wn.shape[0], dtype=torch.float64)
    for g in range(kp // G):
        ks = slice(g * G, (g + 1) * G)
        ra, cb, rwg = ((t[g] if g < t.shape[0] else torch.zeros_like(t[0])) for t in (rab[:, 0], rab[:, 1], rw))
        u = u * ra[:, None] * rwg[None, :] + cb[:, None] + x8[:, ks] @ wn[:, ks].t()
    return u * a_last[:, None] * w_last[None, :]


@pytest.mark.parametrize("case", ["random", "zero_groups", "tiny_groups", "ragged_k"])
def test_ratio_chain_matches_the_reference(case):
    """RATIO's math (module doc) in float64 against w4a4_gemm_ref on the same quantized operands — including
    all-zero activation groups (scale 0: ρ stays finite through the floor), a zero weight-scale group, and groups
    2⁻⁶⁰ below their row's largest (raised to the floor: their error stays below fp32 resolution)."""
    from lowrank_gemm.reference import w4a4_gemm_ref
    M, N, K, G = 24, 40, 448 if case == "ragged_k" else 512, 64   # 448: the last 512-wide step has one group
    ops = w4.make_operands_v2("int4_g64", M, N, K, 0, G, device="cpu", bias=False)
    if case == "zero_groups":
        ops["x_scale"][2, :5] = 0
        ops["x_q"][:5, G:3 * G // 2] = 0          # group 2's packed bytes of tokens 0-4 (32 bytes per group)
        ops["w_scale"][3, 7] = 0
    elif case == "tiny_groups":
        ops["x_scale"][1, 3] = ops["x_scale"][1, 3] * 2.0 ** -60
        ops["w_scale"][5, 9] = ops["w_scale"][5, 9] * 2.0 ** -60
    ref = w4a4_gemm_ref(ops["x_q"], ops["x_scale"], ops["w_q"], ops["w_scale"], group_size=G, fmt="int4_g64")
    got = _emulate_ratio(ops, G)
    # the ratios are fp32 (one rounding each, compounded over the K/G = 8 groups): ~1e-7; a wrong term is O(1)
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-6


def test_ratio_tables():
    """ρ[0] = 0 and ρ[g] = s[g−1]/s[g] on the floored scales; cb = −R/64 with R the exact integer group row sum;
    a NaN scale poisons its whole column (row of the output), as the reference does."""
    a = torch.tensor([[512.0, 0.0, 2.0 ** -50], [256.0, 0.0, 1.0], [1024.0, 0.0, 1.0]])   # [K/G=3, M=3], a = 2⁹·xs
    r_int = torch.tensor([[3.0, 0.0, -7.0], [-100.0, 0.0, 2.0], [0.0, 0.0, 5.0]])
    xab = torch.stack((a, -8.0 * r_int * a / 512.0), dim=1)
    rab, a_last = rs.ratio_act_tables(xab)
    assert rab.shape == (8, 2, 3) and torch.equal(rab[3:, 0], torch.ones(5, 3)) and torch.equal(rab[3:, 1],
                                                                                                torch.zeros(5, 3))
    rab = rab[:3]
    assert torch.equal(rab[0, 0], torch.zeros(3))
    assert torch.equal(rab[1:, 0, 0], torch.tensor([2.0, 0.25]))
    assert torch.equal(rab[:, 0, 1], torch.tensor([0.0, 1.0, 1.0]))          # all-zero column: floor 1, ratio 1
    assert rab[1, 0, 2] == 2.0 ** -40                                       # 2⁻⁵⁰ raised to 2⁻⁴⁰ · max
    assert torch.equal(rab[:, 1], -r_int / 64.0)
    assert torch.equal(a_last, torch.tensor([1024.0, 1.0, 1.0]))
    xab[1, 0, 0] = float("nan")
    rab, a_last = rs.ratio_act_tables(xab)
    assert torch.isnan(a_last[0]) and not torch.isnan(a_last[1:]).any()
    rw, w_last = rs.ratio_weight_tables(torch.tensor([[2.0, 3.0], [4.0, 3.0]], dtype=torch.bfloat16), 128)
    assert torch.equal(rw, torch.tensor([[0.0, 0.0], [0.5, 1.0], [1.0, 1.0], [1.0, 1.0]]))
    assert torch.equal(w_last, torch.tensor([4.0, 3.0]))


def test_ratio_k_loop_is_one_fmul_one_ffma_per_element_per_group_and_no_partials():
    """RATIO's K loop: per group and accumulator element one mul (× ρa) and one fma (× ρw + cb), every wgmma
    accumulating in place (none starts from zero), and no ptxas-injected waits (C7517 would serialize chunk 0's
    wgmmas with chunk 1's rescale)."""
    info, cx, cfg = _compile("t128n64k128r", rank=0, bias=False, col_scale=False)
    kloops = [body for _, body in _ptx_loops(info.ptx) if any("e4m3.e4m3" in x for x in body)]
    assert len(kloops) == 1
    body = kloops[0]
    ur = cfg.block_k // 64
    per_thread = cfg.block_m * cfg.block_n // (32 * cfg.num_warps)
    assert sum(x.strip().startswith("fma.rn.f32") for x in body) == ur * per_thread
    assert sum(x.strip().startswith("mul.f32") for x in body) >= ur * per_thread
    wg = [x for x in body if "wgmma.mma_async" in x]
    assert wg and all(re.search(r", %p\d+, 1, 1;", x) or x.rstrip().endswith("1, 1, 1;") for x in wg), wg[:2]
    res = _ptxas(info.ptx)
    if res is not None:
        assert res[1] == 0 and "C7517" not in res[2] and "C7514" not in res[2], res[2]


# ---------------------------------------------------------------------------------------------- host side
def test_plan_and_ledger():
    c = rs.plan_rs(32)
    assert (c.block_m, c.block_n, c.block_k, c.num_warps, c.block_r) == (128, 128, 256, 8, 32)
    assert c.num_stages == 3 and rs.ctas_per_sm(c) == 1
    assert rs.rs_ledger(c.replace(num_stages=4)).total() > 232_448 >= rs.rs_ledger(c).total()
    names = {t.name for t in rs.rs_ledger(c).terms}
    assert {"ring.x_e4m3", "ring.w_packed", "ring.xab_rows", "ring.w_scale_rows", "lowrank.s_rounded"} <= names
    assert not any("expanded" in n or "w_e4m3" in n for n in names), "no expanded weight tile in SMEM"
    # one warpgroup per CTA: the ring is cut so that two CTAs share an SM
    c4 = rs.plan_rs(32, config=_cfg(128, 64, 128))
    assert c4.num_warps == 4 and rs.ctas_per_sm(c4) == 2 and c4.num_stages >= 3
    assert rs.plan_rs(0, config=_cfg(64, 64, 256)).num_stages >= 3


def _ops(M=96, N=128, K=512, rank=16, **kw):
    return w4.make_operands_v2("int4_g64", M, N, K, rank, 64, device="cpu", **kw)


@pytest.mark.parametrize("kw,match", [
    (dict(config=_cfg(32, 128, 256)), "block_m"),
    (dict(config=_cfg(256, 64, 128)), "block_m"),
    (dict(config=_cfg(128, 256, 256)), "block_n"),
    (dict(config=_cfg(128, 128, 32)), "block_k"),
    (dict(config=_cfg(128, 128, 1024)), "block_k"),
    (dict(nsplit=3), "nsplit"),
    (dict(config=_cfg(64, 128, 256), nsplit=2), "nsplit"),
    (dict(stages=1), "num_stages"),
])
def test_bad_configs_are_rejected_before_launch(kw, match):
    with pytest.raises(ValueError, match=match):
        rs.rs_args(**_ops(), **kw)


def test_oversized_ring_is_an_smem_error_with_the_table():
    with pytest.raises(SmemError, match="ring.x_e4m3"):
        rs.rs_args(**_ops(), stages=8)


def test_bad_inputs():
    with pytest.raises(ValueError, match="int4_g64"):
        rs.rs_args(**w4.make_operands_v2("int4_2l", 96, 128, 512, 16, 64, device="cpu"))
    with pytest.raises(ValueError, match="M % 4"):
        rs.rs_args(**_ops(M=98))
    with pytest.raises(ValueError, match="N % 8"):
        rs.rs_args(**_ops(N=124))
    ops = _ops()
    with pytest.raises(ValueError, match="out must be"):
        rs.rs_args(**{**ops, "out": ops["out"][:, :64]})
    with pytest.raises(ValueError, match="col_scale"):
        rs.rs_args(**{**ops, "col_scale": torch.ones(7)})
    with pytest.raises(ValueError, match="contiguous"):
        rs.rs_args(**{**ops, "w_scale": ops["w_scale"].t().contiguous().t()})


def test_pre_expanded_activations_are_accepted_and_checked():
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    ops = _ops()
    x8, xab = expand_act_f8(ops["x_q"], ops["x_scale"], 64)
    g1, a1, cx1, _ = rs.rs_args(**ops)
    g2, a2, cx2, _ = rs.rs_args(**{**ops, "x_q": x8, "x_scale": xab})
    assert (g1, cx1) == (g2, cx2)
    with pytest.raises(ValueError, match="xab"):
        rs.rs_args(**{**ops, "x_q": x8, "x_scale": xab[:, :1]})


def test_default_nsplit_and_grid():
    assert rs.default_nsplit(128) == 2 and rs.default_nsplit(64) == 1
    ops = _ops(M=300, N=320, K=448)
    g, _, cx, cfg = rs.rs_args(**ops)
    assert g == min(9, 4 * rs.ctas_per_sm(cfg))          # 3 × 3 tiles; CPU tensors: num_sms() = 4
    assert rs.rs_args(**ops, grid=2)[0] == 2 and rs.rs_args(**ops, grid=100)[0] == 9


# ---------------------------------------------------------------------------------------------- probe watchdog
_FAKE_CHECK_CHILD = """
import json, sys, time
print("READY", flush=True)
for tag in sys.argv[1].split(","):
    print("START " + tag, flush=True)
    if tag == "hang":
        time.sleep(60)
    if tag == "boom":
        print("ROW " + json.dumps(dict(tag=tag, ok=False, error="CUDA error")), flush=True)
        sys.exit(3)
    print("ROW " + json.dumps(dict(tag=tag, ok=True)), flush=True)
"""


def _load_probe():
    import importlib.util
    spec = importlib.util.spec_from_file_location("probe_w4a4_rs", ROOT / "scripts" / "probe_w4a4_rs.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    return probe


def test_probe_reference_where_the_operands_are_equals_reference_v2():
    """The probe computes the FLUX references in float64 on the GPU; on the CPU its composition is reference_v2."""
    probe = _load_probe()
    for cs in (True, False):
        ops = w4.make_operands_v2("int4_g64", 300, 320, 448, 32, 64, device="cpu", col_scale=cs)
        assert torch.equal(probe._reference_cuda(ops), w4.reference_v2(ops))


def test_probe_check_survives_a_hanging_and_a_crashing_config():
    """The probe's one chance on the GPU: a config that hangs is killed after its deadline and recorded as HANG, a
    config that raises ends its child, and fresh children carry on with the configs left (no config is lost)."""
    import time
    probe = _load_probe()
    t0 = time.time()
    res = probe.check(["a", "hang", "b", "boom", "c"], dict(os.environ), 20, 3, time.time() + 60,
                      child_cmd=lambda left: [sys.executable, "-c", _FAKE_CHECK_CHILD, ",".join(left)])
    assert {t: r["ok"] for t, r in res.items()} == dict(a=True, hang=False, b=True, boom=False, c=True)
    assert res["hang"]["error"] == "HANG" and res["boom"]["error"] == "CUDA error"
    assert time.time() - t0 < 30


# ---------------------------------------------------------------------------------------------- GPU
# Each config runs in a child process under a timeout (a wrong phase would hang the kernel, not fail it).
GPU_TIMEOUT = 240
GPU_CASES = [  # (M, N, K, rank, G, grid, extra): ragged, few programs (ring across tiles), K shorter than a step …
    dict(M=300, N=320, K=448, rank=32, G=64, grid=None, bias=True, col_scale=True),
    dict(M=300, N=320, K=448, rank=32, G=64, grid=1, bias=True, col_scale=True),
    dict(M=300, N=320, K=448, rank=32, G=64, grid=2, bias=False, col_scale=False),
    dict(M=132, N=136, K=192, rank=5, G=64, grid=3, bias=True, col_scale=False),
    dict(M=200, N=264, K=512, rank=0, G=64, grid=None, bias=False, col_scale=False),
    dict(M=200, N=264, K=512, rank=16, G=128, grid=None, bias=True, col_scale=True),
    dict(M=200, N=264, K=1024, rank=32, G=64, grid=None, bias=True, col_scale=False, out=torch.float32),
    dict(M=1024, N=3072, K=3072, rank=32, G=64, grid=None, bias=True, col_scale=False),
]
TILE_COUNTS = ("1", "sms-1", "sms", "sms+1", "2sms+3")   # persistent tile counts (tests/_tiles.py), × CTAs per SM


def _child(tag: str) -> dict:
    """Run every GPU_CASES shape with config ``tag``: NaN-poisoned out vs the float64 reference, a bit-identical
    repeat; on one shape also CUDA-graph replay, the pre-expanded path and the fp32 agreement with v2's f8 path."""
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    from lowrank_gemm.kernels.schedule import num_sms
    config, opts = CONFIGS[tag]
    ratio = bool(opts.get("ratio"))
    cfg = rs.plan_rs(16, 64, config, ratio=ratio, ctas=opts.get("ctas"))
    sms = num_sms(torch.device("cuda")) * rs.ctas_per_sm(cfg, rs.rs_ledger(cfg, ratio=ratio), opts.get("ctas"))
    counts = {"1": 1, "sms-1": sms - 1, "sms": sms, "sms+1": sms + 1, "2sms+3": 2 * sms + 3}
    # one tile column, ragged in M and N
    tiles = [dict(M=cfg.block_m * counts[w] - 4, N=cfg.block_n - 8, K=256, rank=16, G=64, grid=None, bias=True,
                  col_scale=False) for w in TILE_COUNTS]
    res = []
    for case in GPU_CASES + tiles:
        c = dict(case)
        out_dtype = c.pop("out", torch.bfloat16)
        ops = w4.make_operands_v2("int4_g64", c["M"], c["N"], c["K"], c["rank"], c["G"], device="cuda",
                                  bias=c["bias"], col_scale=c["col_scale"], out_dtype=out_dtype)
        print(f"[rs {tag}] {case}", flush=True)
        y = rs.launch_w4a4_rs(**ops, config=config, **opts, grid=c["grid"]).clone()
        torch.cuda.synchronize()
        ref = w4.reference_v2(ops)
        got = y.double().cpu()
        finite = bool(torch.isfinite(got).all())
        err = float((got - ref).abs().max() / ref.abs().max()) if finite else float("inf")
        ops["out"].fill_(float("nan"))
        again = rs.launch_w4a4_rs(**ops, config=config, **opts, grid=c["grid"])
        res.append(dict(case={k: str(v) for k, v in case.items()}, finite=finite, err=err,
                        same=bool(torch.equal(again, y))))
    # graph replay, pre-expanded activations, and v2's f8 path on the same exact integers (fp32 out)
    ops = w4.make_operands_v2("int4_g64", 512, 1024, 1024, 32, 64, device="cuda", out_dtype=torch.float32)
    want = rs.launch_w4a4_rs(**ops, config=config, **opts).clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        rs.launch_w4a4_rs(**ops, config=config, **opts)
    ops["out"].fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    graph_ok = bool(torch.equal(ops["out"], want))
    x8, xab = expand_act_f8(ops["x_q"], ops["x_scale"], 64)
    pre = rs.launch_w4a4_rs(**{**ops, "x_q": x8, "x_scale": xab}, config=config, **opts).clone()
    v2 = w4.launch_w4a4_v2(**ops, f8=True).clone()
    v2_rel = float((want.double() - v2.double()).norm() / v2.double().norm())
    return dict(cases=res, graph_ok=graph_ok, pre_expanded_equal=bool(torch.equal(pre, want)), v2_rel=v2_rel)


@pytest.mark.gpu
@pytest.mark.timeout(GPU_TIMEOUT + 30)
@pytest.mark.parametrize("tag", sorted(CONFIGS))
def test_gpu_matches_reference_repeats_and_replays(tag):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", tag], capture_output=True, text=True, env=env,
                              timeout=GPU_TIMEOUT, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        last = (exc.stdout or b"").decode(errors="replace").strip().splitlines()[-1:] if exc.stdout else []
        pytest.fail(f"HANG after {GPU_TIMEOUT} s; last case started: {last}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"child failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    res = json.loads(lines[-1][len("RESULT "):])
    for r in res["cases"]:
        assert r["finite"], f"unwritten (NaN-poisoned) outputs: {r['case']}"
        assert r["err"] < 1e-2, f"normalized max error {r['err']:.3e}: {r['case']}"
        assert r["same"], f"not bit-identical over repeats: {r['case']}"
    assert res["graph_ok"], "CUDA-graph replay differs from the eager launch"
    assert res["pre_expanded_equal"], "pre-expanded (x8, xab) launch differs from the packed one"
    # both paths sum the same exact integer partials; only the fp32 rounding order of the rescale differs. RATIO
    # accumulates each group's partial onto the running sum inside the e4m3 wgmma (its adder keeps fewer bits than
    # fp32): held to the 1e-3 on the fp32 result
    assert res["v2_rel"] < (1e-3 if CONFIGS[tag][1].get("ratio") else 1e-5), res["v2_rel"]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print("RESULT " + json.dumps(_child(sys.argv[2])), flush=True)
