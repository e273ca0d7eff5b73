"""One-launch deterministic split-K ("fixup": park partials, ticket, the last arriver sums in split
order) in the single-adapter LoRA kernel, on CPU under Triton's interpreter (fp16), plus the
planner's split-mode rules and the sm_90 lowering (registers are read by ptxas where available).

Tolerance as in test_lora_gemm.py (2e-3 of ‖ref‖ for fp16 in, fp32 accumulate, fp16 out).
"""

import os
import subprocess

import pytest
import torch

from lowrank_gemm.kernels import lora_gemm as LG
from lowrank_gemm.kernels.lora_gemm import lora_linear
from lowrank_gemm.plan import planner as P
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.plan.planner import block_r_for, can_implement, pinned, plan_lora
from lowrank_gemm.reference import lora_linear_ref

from _lora import make, rel_err, run, tickets_zero  # noqa: E402

REL_TOL = 2e-3
CPU = torch.device("cpu")


def cfg(r, split_k, mode="fixup", bm=16, bn=32, bk=16):
    return KernelConfig(block_m=bm, block_n=bn, block_k=bk, block_r=block_r_for(r), group_m=2,
                        num_warps=4, num_stages=2, split_k=split_k, split_mode=mode)


@pytest.fixture
def poisoned_workspaces(monkeypatch):
    """Partials start as NaN: reading a slot no split wrote poisons the result."""
    real = LG._empty_f32
    monkeypatch.setattr(LG, "_empty_f32", lambda device, *shape: real(device, *shape).fill_(float("nan")))


# ---------------------------------------------------------------------------- results

@pytest.mark.parametrize("split_k", [1, 2, 3, 4])
@pytest.mark.parametrize("strategy", ["kloop", "split", "merged"])
def test_fixup_matches_reference(strategy, split_k, poisoned_workspaces):
    # K=88 → 6 K tiles of 16: split 4 gives 2+2+2+0 (an empty split parks zeros), split 3 2+2+2;
    # M=37, N=70 ragged against 16×32 tiles (3 × 3 tiles)
    M, N, K, r = 37, 70, 88, 8
    x, w, a, b, bias = make(M, N, K, r, seed=split_k)
    y = run(strategy, x, w, a, b, 0.7, bias, cfg(r, split_k))
    assert not y.isnan().any()
    assert rel_err(y, lora_linear_ref(x, w, a, b, 0.7, bias)) < REL_TOL
    assert tickets_zero()


@pytest.mark.parametrize("r", [1, 8, 16, 64])
def test_fixup_ranks_decode_rows(r, poisoned_workspaces):
    # M=5 < block_m=32: the last arriver reduces only EPI_M=16 rows (fixup_meta) of the tile
    M, N, K = 5, 45, 100
    x, w, a, b, bias = make(M, N, K, r, seed=r)
    c = cfg(r, 3, bm=32, bn=16, bk=16)
    assert LG.fixup_meta(M, c)["EPI_M"] == 16
    y = run("kloop", x, w, a, b, -1.3, bias, c)
    assert not y.isnan().any()
    assert rel_err(y, lora_linear_ref(x, w, a, b, -1.3, bias)) < REL_TOL
    assert tickets_zero()


@pytest.mark.parametrize("M", [1, 16, 17, 40])
def test_fixup_epi_rows_cover_m(M, poisoned_workspaces):
    x, w, a, b, _ = make(M, 33, 64, 4, bias=False, seed=M)
    c = cfg(4, 2, bm=32, bn=16)
    meta = LG.fixup_meta(M, c)
    assert meta["EPI_M"] >= min(M, 32) and meta["EPI_M"] in (16, 32)
    y = run("kloop", x, w, a, b, 0.5, None, c)
    assert rel_err(y, lora_linear_ref(x, w, a, b, 0.5)) < REL_TOL


def test_fixup_repeats_bit_identical_and_equal_to_reduce():
    x, w, a, b, bias = make(37, 70, 88, 8)
    c = cfg(8, 4)
    ys = [run("kloop", x, w, a, b, 0.7, bias, c) for _ in range(3)]
    assert all(torch.equal(ys[0], y) for y in ys[1:])
    assert tickets_zero()
    # the plain GEMM part is summed in the same order by both modes: same bits
    g_fix = run("merged", x, w, a, b, 0.7, bias, c)
    g_red = run("merged", x, w, a, b, 0.7, bias, c.replace(split_mode="reduce"))
    assert torch.equal(g_fix, g_red)


def test_fixup_rank_zero_and_nan_inf():
    x, w, _, _, bias = make(20, 24, 64, 1)
    a0, b0 = torch.empty(0, 64, dtype=x.dtype), torch.empty(24, 0, dtype=x.dtype)
    with pinned(config=cfg(1, 3)):
        y = lora_linear(x, w, a0, b0, bias=bias, strategy="kloop")
    assert rel_err(y, x.double() @ w.double().T + bias.double()) < REL_TOL
    x2, w2, a2, b2, bias2 = make(20, 24, 64, 4)
    x2[3, 5] = float("inf")
    x2[7, 0] = float("nan")
    ref = lora_linear_ref(x2, w2, a2, b2, 1.0, bias2)
    with pinned(config=cfg(4, 2)):
        y2 = lora_linear(x2, w2, a2, b2, bias=bias2, strategy="kloop")
    assert torch.equal(y2.isnan(), ref.isnan()) and torch.equal(y2.isinf(), ref.isinf())
    assert tickets_zero()


def test_ticket_regions_reused_and_private_when_large():
    t1 = LG._TICKETS.get(CPU, 9)
    t2 = LG._TICKETS.get(CPU, 3)
    assert t1.data_ptr() == t2.data_ptr() and t1.dtype == torch.int32 and not t1.any()
    big = LG._TICKETS.get(CPU, LG.TICKET_SLOTS + 1)
    assert big.numel() == LG.TICKET_SLOTS + 1 and not big.any()
    assert big.data_ptr() != t1.data_ptr()


def test_ticket_regions_one_per_stream_beyond_a_block(monkeypatch):
    """Every stream its own region, however many streams (launches on two streams may overlap; until session 31 the
    17th stream shared the first one's region). Handing out a block's last region outside a capture adds the next
    block; a stream first seen while capturing takes a free region, or, with none left, private zeroed tickets per
    call."""
    tickets, stream, capturing = LG._Tickets(), [0], [False]
    monkeypatch.setattr(LG, "_capturing", lambda device: capturing[0])
    monkeypatch.setattr(tickets, "_stream", lambda device: stream[0])
    seen = set()

    def new_stream(s):
        stream[0] = s
        t = tickets.get(CPU, 5)
        assert t.data_ptr() not in seen and not t.any()
        assert tickets.get(CPU, 5).data_ptr() == t.data_ptr()       # the same stream: the same region
        seen.add(t.data_ptr())

    for s in range(LG._REGIONS_PER_BLOCK):
        new_stream(1000 + s)
    assert len(tickets.blocks[CPU]) == 2                            # the 16th region out: the next block
    for s in range(3):
        new_stream(1100 + s)
    capturing[0] = True
    for s in range(LG._REGIONS_PER_BLOCK - 3):                      # the second block's free regions
        new_stream(2000 + s)
    stream[0] = 3000                                                # none left in a capture: private tickets
    private = tickets.get(CPU, 5)
    assert private.data_ptr() not in seen and not private.any()
    assert (CPU, 3000) not in tickets.regions and len(tickets.blocks[CPU]) == 2
    capturing[0] = False
    new_stream(4000)
    assert len(tickets.blocks[CPU]) == 3
    assert tickets.all_zero(CPU)
    tickets.blocks[CPU][0][4, 1] = 1
    assert not tickets.all_zero(CPU)


# ---------------------------------------------------------------------------- planner

def test_config_validates_split_mode():
    with pytest.raises(ValueError, match="split_mode must be one of"):
        KernelConfig(split_mode="atomic")
    assert KernelConfig.from_dict({"split_k": 4}).split_mode == "reduce"     # old tuned entries


def test_heuristic_small_m_uses_fixup_and_wide_tiles():
    # 8192² at M=1: 64 tiles of 64×128 split 2 (not 128 narrow 64×64 tiles, split 1) — the unswapped kloop plan, which
    # a pinned kloop gets (unpinned M ≤ 16 plans split + swap_ab: test_planner.test_heuristic_decode_size_split_is_swap_ab)
    s, c = P.heuristic_lora(1, 8192, 8192, 16, 16, gpu=True, sms=132, strategy="kloop")
    assert (s, c.block_n, c.split_k, c.split_mode) == ("kloop", 128, 2, "fixup")
    s, c = P.heuristic_lora(16, 4096, 4096, 16, 16, gpu=True, sms=132, strategy="kloop")
    assert (c.block_n, c.split_k, c.split_mode) == (128, 4, "fixup")
    assert 32 * c.split_k <= 132 * 1.1 < 32 * c.split_k * 2            # ≈ one wave of CTAs
    # today's 2-launch choice stays selectable: narrow tiles first, then split with reduce
    s, c = P.heuristic_lora(1, 4096, 4096, 16, 16, gpu=True, sms=132, split_mode="reduce")
    assert (c.block_n, c.split_k, c.split_mode) == (64, 2, "reduce")
    s, c = P.heuristic_lora(64, 28672, 4096, 16, 16, gpu=True, sms=132)
    assert c.split_k == 1 and c.split_mode == "reduce"
    s, c = P.heuristic_lora(1, 4096, 4096, 16, 16, gpu=True, sms=132, strategy="concat")
    assert c.split_mode == "reduce"


def test_env_override_and_pins(monkeypatch):
    x, w, a, b, _ = make(8, 40, 64, 4)
    seen = []
    real = LG.run_strategy
    monkeypatch.setattr(LG, "run_strategy", lambda s, *a_, **k: seen.append(a_[-1]) or real(s, *a_, **k))
    with pinned(strategy="kloop"):
        lora_linear(x, w, a, b)
    base = seen[-1]
    if base.split_k > 1:
        assert base.split_mode == "fixup"
    monkeypatch.setenv(P.SPLIT_MODE_ENV, "reduce")
    s, c = plan_lora(1, 4096, 4096, 16, torch.float16, CPU)
    assert c.split_k == 1 or c.split_mode == "reduce"
    monkeypatch.setenv(P.SPLIT_MODE_ENV, "bogus")
    with pytest.raises(ValueError, match="LOWRANK_GEMM_SPLITK_MODE must be one of"):
        plan_lora(1, 4096, 4096, 16, torch.float16, CPU)
    monkeypatch.delenv(P.SPLIT_MODE_ENV)
    pin = cfg(4, 2, mode="reduce")
    with pinned(strategy="kloop", config=pin):       # a pinned config is taken as given
        assert plan_lora(8, 40, 64, 4, torch.float16, CPU) == ("kloop", pin)


def test_env_override_applies_to_tuned_entries(monkeypatch, tmp_path):
    import json
    key = P.tuned_key(1, 4096, 4096, 16, torch.bfloat16)
    entry = {"strategy": "kloop", "config": cfg(16, 4, mode="fixup", bm=64, bn=128, bk=128).to_dict()}
    path = tmp_path / "lora_h200.json"
    path.write_text(json.dumps({"version": 1, "lora": {key: entry}}))
    monkeypatch.setattr(P, "tuned_file", lambda family, device: path)
    P.clear_plan_cache()
    try:
        assert plan_lora(1, 4096, 4096, 16, torch.bfloat16, CPU)[1].split_mode == "fixup"
        monkeypatch.setenv(P.SPLIT_MODE_ENV, "reduce")
        assert plan_lora(1, 4096, 4096, 16, torch.bfloat16, CPU)[1].split_mode == "reduce"
    finally:
        P.clear_plan_cache()


def test_can_implement_rejects_fixup_where_unsupported():
    ok = can_implement("concat", (16, 64, 64, 4), cfg(4, 2))
    assert not ok and "no in-launch split-K reduction" in ok.reason
    assert can_implement("concat", (16, 64, 64, 4), cfg(4, 2, mode="reduce"))
    assert can_implement("concat", (16, 64, 64, 4), cfg(4, 1))   # no split: the mode is moot


# ---------------------------------------------------------------------------- sm_90 lowering

def _ptxas_regs(ptx: str):
    import tempfile
    import triton
    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(exe):
        return None
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        open(src, "w").write(ptx)
        out = subprocess.run([exe, "-arch=sm_90a", "-v", src, "-o", os.path.join(d, "k.o")],
                             capture_output=True, text=True).stderr
    import re
    regs = [int(v) for v in re.findall(r"Used (\d+) registers", out)]
    spills = [int(v) for v in re.findall(r"(\d+) bytes spill stores", out)]
    return (max(regs), max(spills or [0])) if regs else None


@pytest.mark.parametrize("bn, M, r", [(128, 1, 16), (64, 16, 16), (128, 1, 64)])
def test_sm90_fixup_lowering(bn, M, r):
    from test_lora_gemm import compile_main
    c = KernelConfig(block_m=64, block_n=bn, block_k=128, block_r=block_r_for(r), num_warps=4,
                     num_stages=4 if r <= 16 else 3, split_k=4, split_mode="fixup")
    info = compile_main(c, LG.K_.LOWRANK_KLOOP, fixup_m=M)
    assert info.has("wgmma.mma_async", "cp.async.bulk.tensor")
    assert info.has("atom.global.gpu.acq_rel.add", "atom.global.gpu.relaxed.exch", "ld.global.cg")
    # the ledger (epilogue B/S tiles inside the pipeline's footprint) vs the compiler
    assert abs(P.lora_ledger("kloop", c).total() - info.shared) <= 64
    rs = _ptxas_regs(info.ptx)
    if rs is not None:      # decode EPI_M=16: two partials in flight, still no spill
        assert rs[1] == 0, f"ptxas spills {rs[1]} B ({rs[0]} registers)"
