"""Session 5 (issue 2) LoRA kernel variants on the CPU: the FIXUP split of the partial last wave only
("hybrid" grid), the row-chunked FIXUP reduction, and the launch options (``LoraOptions``: epilogue
prefetch, PDL for ``split``, full-rank down kernel) — interpreter results against the float64
reference (fp16: the interpreter's bf16 ``tl.dot`` is wrong) and sm_90 compiles *as launched*.

Tolerance as in test_lora_gemm.py (2e-3 of ‖ref‖). Every run writes into a NaN-poisoned output with
NaN-poisoned fp32 workspaces, so an element nobody wrote, or a partial read before it was parked,
shows up as NaN.
"""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from lowrank_gemm.kernels import _lora_kernels as K_
from lowrank_gemm.kernels import lora_gemm as LG
from lowrank_gemm.kernels.lora_gemm import lora_linear, lora_options, run_strategy
from lowrank_gemm.kernels.schedule import cdiv, grouped_tile_host
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.plan.planner import block_r_for, fixup_dp_tiles
from lowrank_gemm.reference import lora_linear_ref

from _lora import make, rel_err, run, tickets_zero  # noqa: E402
from _sm90 import ptxas_stats  # noqa: E402

REL_TOL = 2e-3
CPU = torch.device("cpu")


def cfg(r, split_k, bm=16, bn=32, bk=16, warps=4, mode="fixup", strategy="kloop"):
    br = block_r_for(r) if strategy != "split" else 16
    return KernelConfig(block_m=bm, block_n=bn, block_k=bk, block_r=br, group_m=2, num_warps=warps,
                        num_stages=2, split_k=split_k, split_mode=mode if split_k > 1 else "reduce")


@pytest.fixture
def poisoned_workspaces(monkeypatch):
    real = LG._empty_f32
    monkeypatch.setattr(LG, "_empty_f32", lambda device, *shape: real(device, *shape).fill_(float("nan")))


@pytest.fixture
def waves(monkeypatch):
    """Give the interpreter waves of ``n`` SMs, so FIXUP launches with ≥ n tiles go hybrid."""
    def set_(n):
        monkeypatch.setattr(LG, "INTERPRETER_WAVE_SMS", n)
    return set_


def tile_mask(M, N, c, tiles):
    """Boolean [M, N]: the outputs of the given tile ids (grouped order, as the kernel maps them)."""
    npm, npn = cdiv(M, c.block_m), cdiv(N, c.block_n)
    m = torch.zeros(M, N, dtype=torch.bool)
    for t in tiles:
        pm, pn = grouped_tile_host(t, npm, npn, c.group_m)
        m[pm * c.block_m:(pm + 1) * c.block_m, pn * c.block_n:(pn + 1) * c.block_n] = True
    return m


# ---------------------------------------------------------------------------- hybrid grid

def test_dp_tiles_rule():
    assert fixup_dp_tiles(224, 4, 132) == 132            # N=28672, M=256: one whole wave + 92 split
    assert fixup_dp_tiles(264, 2, 132) == 264            # whole waves only: nothing left to split
    assert fixup_dp_tiles(100, 4, 132) == 0              # below a wave every tile is split, as before
    assert fixup_dp_tiles(224, 1, 132) == 0 and fixup_dp_tiles(224, 4, None) == 0


@pytest.mark.parametrize("strategy", ["kloop", "split", "merged"])
@pytest.mark.parametrize("wave", [4, 5])
def test_hybrid_matches_reference(strategy, wave, waves, poisoned_workspaces):
    # 37×70 over 16×32 tiles: 9 tiles. wave 4: 8 whole + 1 split 3 ways; wave 5: 5 whole + 4 × 3 pieces
    waves(wave)
    M, N, K, r = 37, 70, 88, 8
    x, w, a, b, bias = make(M, N, K, r, seed=wave)
    c = cfg(r, 3, strategy=strategy)
    ys = [run(strategy, x, w, a, b, -1.3, bias, c) for _ in range(2)]
    assert not ys[0].isnan().any()
    assert rel_err(ys[0], lora_linear_ref(x, w, a, b, -1.3, bias)) < REL_TOL
    assert torch.equal(ys[0], ys[1])                     # no atomics in the result path
    assert tickets_zero()


@pytest.mark.parametrize("strategy", ["kloop", "split"])
def test_hybrid_tiles_are_the_whole_and_the_split_results(strategy, waves):
    """Whole-wave tiles are bit-for-bit the unsplit plan's, the rest bit-for-bit the split plan's."""
    M, N, K, r = 37, 70, 88, 8
    x, w, a, b, bias = make(M, N, K, r)
    c = cfg(r, 3, strategy=strategy)
    whole = run(strategy, x, w, a, b, 0.7, bias, c.replace(split_k=1, split_mode="reduce"))
    split = run(strategy, x, w, a, b, 0.7, bias, c)            # no waves: every tile split
    waves(4)
    hybrid = run(strategy, x, w, a, b, 0.7, bias, c)
    dp = fixup_dp_tiles(9, 3, 4)
    m = tile_mask(M, N, c, range(dp))
    assert dp == 8 and torch.equal(hybrid[m], whole[m]) and torch.equal(hybrid[~m], split[~m])


@pytest.mark.parametrize("r", [1, 8, 16, 64, 128])
def test_hybrid_ranks(r, waves, poisoned_workspaces):
    waves(3)
    M, N, K = 21, 40, 48                                 # 2 × 2 tiles of 16×32 (wave 3: 3 whole, 1 split)
    x, w, a, b, bias = make(M, N, K, r, seed=r)
    for strategy in ("kloop", "split"):
        y = run(strategy, x, w, a, b, 1.3, bias, cfg(r, 2, strategy=strategy))
        assert not y.isnan().any()
        assert rel_err(y, lora_linear_ref(x, w, a, b, 1.3, bias)) < REL_TOL, strategy
    assert tickets_zero()


# ---------------------------------------------------------------------------- chunked reduction

def test_fixup_meta_chunks():
    def meta(M, bm, bn, warps):
        return LG.fixup_meta(M, KernelConfig(block_m=bm, block_n=bn, num_warps=warps))
    # decode rows and small tiles: one chunk, as in session 3
    assert meta(1, 64, 128, 4) == {"EPI_M": 16, "EPI_CHUNKS": 1, "IN_FLIGHT": 2}
    assert meta(64, 64, 128, 4) == {"EPI_M": 64, "EPI_CHUNKS": 1, "IN_FLIGHT": 1}
    # mid-M tiles: ≤ FIXUP_MAX_PER_THREAD fp32 per thread per partial
    assert meta(256, 128, 256, 8) == {"EPI_M": 64, "EPI_CHUNKS": 2, "IN_FLIGHT": 1}
    assert meta(256, 128, 128, 4) == {"EPI_M": 64, "EPI_CHUNKS": 2, "IN_FLIGHT": 1}
    assert meta(256, 256, 128, 8) == {"EPI_M": 128, "EPI_CHUNKS": 2, "IN_FLIGHT": 1}
    for M in (1, 5, 16, 40, 64, 200):
        for bm, bn, warps in ((64, 128, 4), (128, 256, 8), (64, 64, 1), (32, 32, 1)):
            m = meta(M, bm, bn, warps)
            assert m["EPI_M"] * m["EPI_CHUNKS"] >= min(M, bm) and m["EPI_M"] >= 16
            assert m["EPI_M"] * bn // (32 * warps) <= LG.FIXUP_MAX_PER_THREAD or m["EPI_M"] == 16


@pytest.mark.parametrize("strategy", ["kloop", "split", "merged"])
@pytest.mark.parametrize("M", [37, 150])
@pytest.mark.parametrize("r", [1, 16, 64])
def test_chunked_fixup_matches_reference(strategy, M, r, poisoned_workspaces):
    # 64×64 tiles over 1 warp: 128 fp32 per thread → 2 chunks of 32 rows (M=37: the second chunk
    # is ragged; M=150: 3 M-blocks, the last one 22 rows, its second chunk empty)
    N, K = 70, 96
    if strategy == "kloop" and r > 64:
        pytest.skip("kloop keeps S in registers")
    c = cfg(r, 3, bm=64, bn=64, bk=16, warps=1, strategy=strategy)
    assert LG.fixup_meta(M, c)["EPI_CHUNKS"] == 2
    x, w, a, b, bias = make(M, N, K, r, seed=M + r)
    ys = [run(strategy, x, w, a, b, 0.6, bias, c) for _ in range(2)]
    assert not ys[0].isnan().any()
    assert rel_err(ys[0], lora_linear_ref(x, w, a, b, 0.6, bias)) < REL_TOL
    assert torch.equal(ys[0], ys[1])
    assert tickets_zero()


# ---------------------------------------------------------------------------- launch options

def test_options_default_env_and_scope(monkeypatch):
    monkeypatch.delenv(LG.LORA_OPTIONS_ENV, raising=False)
    monkeypatch.delenv("LOWRANK_GEMM_PDL", raising=False)
    assert LG.current_options() == LG.LoraOptions(pdl=True, s_words=True)  # PDL and s_words on by default
    monkeypatch.setenv("LOWRANK_GEMM_PDL", "0")
    assert LG.current_options() == LG.LoraOptions(s_words=True)           # the project-wide PDL switch
    monkeypatch.setenv(LG.LORA_OPTIONS_ENV, "none")
    monkeypatch.delenv("LOWRANK_GEMM_PDL", raising=False)
    assert LG.current_options() == LG.LoraOptions()
    monkeypatch.setenv(LG.LORA_OPTIONS_ENV, "prefetch, pdl")
    assert LG.current_options() == LG.LoraOptions(prefetch=True, pdl=True)
    monkeypatch.setenv(LG.LORA_OPTIONS_ENV, "all")
    assert LG.current_options() == LG.LoraOptions(True, True, True, True)
    with lora_options(pdl=False):
        assert LG.current_options() == LG.LoraOptions(prefetch=True, pdl=False, down_full_rank=True, s_words=True)
    assert LG.current_options().pdl
    monkeypatch.setenv(LG.LORA_OPTIONS_ENV, "prefetch,warp_specialize")
    with pytest.raises(ValueError, match="LOWRANK_GEMM_LORA_OPTIONS takes a comma-separated subset"):
        LG.current_options()


@pytest.mark.parametrize("strategy", ["kloop", "split", "merged"])
@pytest.mark.parametrize("split_k, wave", [(1, None), (3, None), (3, 4)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_prefetch_is_bit_identical(strategy, split_k, wave, with_bias, waves, poisoned_workspaces):
    waves(wave)
    x, w, a, b, bias = make(37, 70, 88, 8, bias=with_bias)
    c = cfg(8, split_k, strategy=strategy)
    y0 = run(strategy, x, w, a, b, 0.7, bias, c)
    with lora_options(prefetch=True):
        y1 = run(strategy, x, w, a, b, 0.7, bias, c)
    assert not y1.isnan().any() and torch.equal(y0, y1)


def test_prefetch_only_where_it_fits_and_helps():
    c = KernelConfig(block_m=64, block_n=128, block_k=128, block_r=16, num_warps=4, num_stages=4)
    ok = lambda cc, lowrank, **kw: LG._prefetch_ok(cc, 16, lowrank, **dict(dict(partial=False, has_bias=False,
                                                                                r_chunks=1), **kw))
    assert not ok(c, K_.LOWRANK_KLOOP)                                  # off unless asked
    with lora_options(prefetch=True):
        assert ok(c, K_.LOWRANK_KLOOP) and ok(c, K_.LOWRANK_GLOBAL)
        assert not ok(c, K_.LOWRANK_KLOOP, partial=True)               # no epilogue in the launch
        assert not ok(c, K_.LOWRANK_GLOBAL, r_chunks=4)                # one rank chunk at most
        assert not ok(c, K_.LOWRANK_NONE) and ok(c, K_.LOWRANK_NONE, has_bias=True)
        big = KernelConfig(block_m=128, block_n=256, block_k=64, block_r=64, num_warps=8, num_stages=4)
        assert K_.smem_ledger(big, 16, "kloop").fits()
        assert not ok(big, K_.LOWRANK_KLOOP)                           # +32 KB B tile: over the limit


def test_nan_inf_propagate_with_prefetch_and_hybrid(waves):
    waves(4)
    x, w, a, b, bias = make(37, 70, 88, 4)
    x[3, 5] = float("inf")
    x[30, 0] = float("nan")
    ref = lora_linear_ref(x, w, a, b, 1.0, bias)
    with lora_options(prefetch=True):
        for strategy in ("kloop", "split"):
            y = run(strategy, x, w, a, b, 1.0, bias, cfg(4, 3, strategy=strategy))
            assert torch.equal(y.isnan(), ref.isnan()) and torch.equal(y.isinf(), ref.isinf()), strategy
            fin = ref.isfinite()
            assert rel_err(y[fin], ref[fin]) < REL_TOL


@pytest.mark.parametrize("r", [8, 40, 64, 128])
def test_down_full_rank(r, monkeypatch, poisoned_workspaces):
    seen = []
    real = LG._launch_down
    monkeypatch.setattr(LG, "_launch_down", lambda *a_, **k: seen.append(a_[4]) or real(*a_, **k))
    x, w, a, b, bias = make(21, 40, 64, r, seed=r)
    c = cfg(r, 2, strategy="split")                     # the epilogue walks the rank in 16-chunks
    ref = lora_linear_ref(x, w, a, b, 0.5, bias)
    y0 = run("split", x, w, a, b, 0.5, bias, c)
    with lora_options(down_full_rank=True):
        y1 = run("split", x, w, a, b, 0.5, bias, c)
    assert seen == [16, block_r_for(r)]                  # one R-block: X read once
    assert rel_err(y0, ref) < REL_TOL and rel_err(y1, ref) < REL_TOL and not y1.isnan().any()


def test_pdl_is_a_no_op_off_the_gpu(poisoned_workspaces):
    x, w, a, b, bias = make(21, 40, 64, 8)
    c = cfg(8, 2, strategy="split")
    y0 = run("split", x, w, a, b, 0.5, bias, c)
    with lora_options(pdl=True):
        y1 = run("split", x, w, a, b, 0.5, bias, c)
    assert torch.equal(y0, y1) and not LG.pdl_supported(CPU)


def test_options_reach_the_op_through_auto():
    x, w, a, b, bias = make(12, 40, 48, 8)
    ref = lora_linear_ref(x, w, a, b, 0.5, bias)
    with lora_options(prefetch=True, pdl=True, down_full_rank=True):
        for strategy in ("auto", "split", "kloop"):
            assert rel_err(lora_linear(x, w, a, b, 0.5, bias, strategy=strategy), ref) < REL_TOL


# ---------------------------------------------------------------------------- sm_90, as launched

_RECORD_CHILD = r"""
import json, sys, torch
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend
from triton.tools.tensor_descriptor import TensorDescriptor
from lowrank_gemm.kernels import _lora_kernels as K_, lora_gemm as LG
from lowrank_gemm.kernels.aot import compile_sm90
from lowrank_gemm.plan.config import KernelConfig
req = json.loads(sys.stdin.read())
calls = []
class Rec:
    def __init__(self, fn): self.fn = fn
    def __getitem__(self, grid): return lambda *a, **k: calls.append((self.fn, a, k))
real = {name: getattr(K_, name) for name in req["kernels"]}
for name, fn in real.items():
    setattr(K_, name, Rec(fn))
LG.INTERPRETER_WAVE_SMS = req["wave"]
LG.num_sms = lambda device: 132
LG.pdl_supported = lambda device: True
LG._interpreting = lambda: False
M, N, K, r = req["shape"]
dt = torch.bfloat16
x, w, a = torch.empty(M, K, dtype=dt), torch.empty(N, K, dtype=dt), torch.empty(r, K, dtype=dt)
b = torch.empty(N, r, dtype=dt)
with LG.lora_options(**req["options"]):
    LG.run_strategy(req["strategy"], x, w, a, b, 0.5, None, KernelConfig(**req["config"]))
for name, fn in real.items():
    setattr(K_, name, fn)
DT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32"}
out = []
for fn, args, kw in calls:
    names = fn.arg_names
    sig, consts, aligned = {}, {}, []
    # arguments passed by keyword that are not constexprs (flat's ws_ptr, y_desc, …) are bound like positional ones
    by_name = [(k, kw.pop(k)) for k in list(kw) if k in names and not fn.params[list(names).index(k)].is_constexpr]
    for name, v in list(zip(names, args)) + by_name:
        if v is None:             # Triton specializes a None argument as a constexpr
            consts[name] = None
        elif isinstance(v, TensorDescriptor):
            sig[name] = f"tensordesc<{DT[v.base.dtype]}{list(v.block_shape)}>"
            aligned.append(name)
        elif isinstance(v, torch.Tensor):
            sig[name] = "*" + DT[v.dtype]
            aligned.append(name)
        elif isinstance(v, float):
            sig[name] = "fp32"
        else:
            kind, attr = native_specialize_impl(BaseBackend, int(v), False, True, True)
            if kind == "constexpr":
                consts[name] = int(v)
            else:
                sig[name] = kind
                if attr == "D":
                    aligned.append(name)
    opts = {k: kw.pop(k) for k in ("num_warps", "num_stages") if k in kw}
    kw.pop("launch_pdl", None)
    consts.update(kw)
    for name in names:              # every constexpr explicit (Triton's AOT key holds values only)
        if name not in sig and name not in consts:
            consts[name] = fn.fn.__defaults__[list(names).index(name) - (len(names) - len(fn.fn.__defaults__))]
    info = compile_sm90(K_.__name__, fn.fn.__name__, sig, consts, aligned=tuple(aligned), **opts)
    out.append(dict(name=fn.fn.__name__, constexprs=consts, ptx=info.ptx, shared=info.shared,
                    num_warps=info.num_warps))
print(json.dumps(out))
"""


def compile_as_launched(strategy, shape, config, options=(), wave=132,
                        kernels=("lora_main_kernel", "lora_down_kernel")):
    """sm_90 compiles of the kernels ``run_strategy`` launches for ``shape`` = (M, N, K, r), with the
    specialization a real launch gets (integer arguments equal to 1 become constants; multiples of
    16 and tensors are 16-byte aligned): the register counts of the test-suite signature (every
    argument a plain i32) are 40–100 higher and report spills the launched kernels do not have.
    ``kernels``: the ``_lora_kernels`` launches to record and compile, by name."""
    from lowrank_gemm.kernels.aot import CompiledInfo
    req = dict(strategy=strategy, shape=list(shape), config=config.to_dict(), wave=wave,
               options={k: True for k in options}, kernels=list(kernels))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}    # record + compile, one process
    env["LOWRANK_GEMM_LORA_OPTIONS"] = "none"     # exactly ``options`` on (PDL is on by default otherwise)
    proc = subprocess.run([sys.executable, "-c", _RECORD_CHILD], input=json.dumps(req), capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {k["name"]: (CompiledInfo(k["ptx"], k["shared"], k["num_warps"]), k["constexprs"])
            for k in json.loads(proc.stdout.strip().splitlines()[-1])}


def ptxas(ptx):
    stats = ptxas_stats(ptx)
    return None if stats is None else stats[:2]


MIDM = [  # (strategy, shape, config): the issue-2 mid-M one-launch plans (split-K FIXUP, hybrid)
    ("split", (256, 4096, 4096, 16), KernelConfig(block_m=128, block_n=256, block_k=64, block_r=16, num_warps=8,
                                                  num_stages=4, split_k=4, split_mode="fixup")),
    ("kloop", (256, 4096, 4096, 16), KernelConfig(block_m=128, block_n=128, block_k=64, block_r=16, num_warps=4,
                                                  num_stages=5, split_k=2, split_mode="fixup")),
    ("split", (256, 28672, 4096, 16), KernelConfig(block_m=128, block_n=256, block_k=64, block_r=16, num_warps=8,
                                                   num_stages=4, split_k=4, split_mode="fixup")),
    ("kloop", (256, 28672, 4096, 64), KernelConfig(block_m=128, block_n=256, block_k=64, block_r=64, num_warps=8,
                                                   num_stages=4, split_k=4, split_mode="fixup")),
    ("split", (256, 8192, 8192, 16), KernelConfig(block_m=256, block_n=128, block_k=64, block_r=16, num_warps=8,
                                                  num_stages=4, split_k=2, split_mode="fixup")),
]


MIDM_IDS = ["split-128x256-sk4", "kloop-128x128w4-sk2", "split-hybrid-N28672", "kloop-hybrid-r64",
            "split-256x128-sk2"]
MIDM_CASES = [pytest.param(*case, (), id=f"{i}-plain") for case, i in zip(MIDM, MIDM_IDS)] + [
    pytest.param(*MIDM[i], ("prefetch", "pdl"), id=f"{MIDM_IDS[i]}-prefetch+pdl") for i in (1, 2, 3)]


@pytest.mark.parametrize("strategy, shape, config, options", MIDM_CASES)
def test_sm90_midm_plans_as_launched(strategy, shape, config, options):
    main, consts = compile_as_launched(strategy, shape, config, options)["lora_main_kernel"]
    assert main.has("wgmma.mma_async", "cp.async.bulk.tensor", "atom.global.gpu.acq_rel.add", "ld.global.cg")
    assert consts["FIXUP"] and consts["HYBRID"] == (shape[1] == 28672)    # 224 tiles on 132 SMs
    assert ("griddepcontrol.wait" in main.ptx) == ("pdl" in options and strategy == "split")
    # prefetch where its B tile fits: not beside kloop 128x256 r64's 229 KB pipeline
    assert consts["EPI_PREFETCH"] == ("prefetch" in options and shape[3] <= 16)
    ledger = K_.smem_ledger(config, 16, strategy, prefetch=consts["EPI_PREFETCH"])
    slack = config.block_r * config.block_n * 2 if consts["EPI_PREFETCH"] else 0    # the term is an upper bound
    assert main.shared - 1024 <= ledger.total() <= main.shared + 1024 + slack
    rs = ptxas(main.ptx)
    if rs is not None:
        assert rs[1] == 0, f"ptxas spills {rs[1]} B ({rs[0]} registers)"


@pytest.mark.parametrize("strategy, shape, kernel, stages", [
    ("flat", (256, 28672, 4096, 16), "lora_flat_kernel", 4),
    ("flat", (256, 28672, 4096, 64), "lora_flat_kernel", 3),
    ("persistent_static", (256, 28672, 4096, 64), "lora_persistent_kernel", 3),
], ids=["flat-r16", "flat-r64", "persistent-r64"])
def test_sm90_prefill_plans_as_launched(strategy, shape, kernel, stages):
    """The 256-token plans as launched (session 53's audit, NOTES.md): flat's own plan keeps 4 stages at r16 and 3
    at r64 (the branch's S and B tiles, prefetched beside the ring, leave no room for a 4th); the H200 table's
    ``persistent_static`` entry at r64. No ptxas wgmma serialization, no spill in flat, at most a 16-byte one in the
    persistent kernel's r64 epilogue."""
    from lowrank_gemm.plan.planner import heuristic_lora, load_tuned, tuned_key
    from lowrank_gemm.plan.tuned import TUNED_DIR
    if strategy == "flat":
        cfg = heuristic_lora(*shape, 16, gpu=True, sms=132, strategy="flat")[1]
    else:
        entry = load_tuned(TUNED_DIR / "lora_h200.json")[tuned_key(*shape, torch.bfloat16)]
        assert entry["strategy"] == strategy
        cfg = KernelConfig.from_dict(entry["config"])
    assert cfg.num_stages == stages
    info, consts = compile_as_launched(strategy, shape, cfg, ("pdl",), kernels=(kernel,))[kernel]
    assert info.has("wgmma.mma_async", "cp.async.bulk.tensor") and info.shared <= 232448
    if strategy == "flat":
        assert consts["IN_GRID"]      # the op's form: S tasks in the grid
    stats = ptxas_stats(info.ptx)
    if stats is not None:
        assert "C7515" not in stats[2] and "C7514" not in stats[2], stats[2]
        assert stats[1] <= (0 if strategy == "flat" else 16), f"ptxas spills {stats[1]} B ({stats[0]} registers)"


def test_sm90_pdl_order():
    """split under PDL: the down kernel lets the main grid in at once; the main kernel waits
    (griddepcontrol.wait) once, after its K loop and before any global write or read of S."""
    c = KernelConfig(block_m=128, block_n=256, block_k=64, block_r=16, num_warps=8, num_stages=4, split_k=4,
                     split_mode="fixup")
    ks = compile_as_launched("split", (256, 4096, 4096, 16), c, ("pdl",))
    down, main = ks["lora_down_kernel"][0].ptx, ks["lora_main_kernel"][0].ptx
    assert down.index("griddepcontrol.launch_dependents") < down.index("cp.async.bulk.tensor")
    assert main.count("griddepcontrol.wait") == 1
    wait = main.index("griddepcontrol.wait")
    tma_loads = [m.start() for m in re.finditer(r"cp\.async\.bulk\.tensor", main)]    # the K loop's only
    assert main.index("wgmma.mma_async") < wait and max(tma_loads) < wait
    for pat in (r"\bst\.global", r"atom\.global", r"ld\.global\.cg"):
        first = [m.start() for m in re.finditer(pat, main)]
        assert first and min(first) > wait, pat
    plain = compile_as_launched("split", (256, 4096, 4096, 16), c)
    assert "griddepcontrol" not in plain["lora_main_kernel"][0].ptx + plain["lora_down_kernel"][0].ptx


def test_sm90_prefetch_loads_before_the_k_loop():
    c = KernelConfig(block_m=64, block_n=128, block_k=128, block_r=16, num_warps=4, num_stages=4, split_k=4,
                     split_mode="fixup")
    for options, before in (((), 0), (("prefetch",), 1)):
        main = compile_as_launched("kloop", (1, 4096, 4096, 16), c, options)["lora_main_kernel"][0].ptx
        n = len(re.findall(r"ld\.global", main[:main.index("wgmma.mma_async")]))
        assert (n >= before) if before else n == 0, options


def test_sm90_down_full_rank_grid():
    c = KernelConfig(block_m=128, block_n=256, block_k=64, block_r=16, num_warps=8, num_stages=4)
    for options, br in (((), 16), (("down_full_rank",), 64)):
        down = compile_as_launched("split", (4096, 4096, 4096, 64), c, options)["lora_down_kernel"][0]
        assert down.has("wgmma.mma_async", "cp.async.bulk.tensor")
        assert re.search(rf"wgmma.mma_async.sync.aligned.m64n{br}k16", down.ptx), options
