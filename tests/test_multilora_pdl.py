"""Multi-LoRA session 5: PDL between the shrink and the main kernel, and the unrolled S-slice sum.

The interpreter cannot run ``griddepcontrol``, so PDL is checked on the CPU by what is launched (the
flags, and the shrink as the main kernel's immediate predecessor: no torch op in between) and by the
sm_90 PTX (the main kernel's wait after its K loop, every S read and global write after the wait;
the shrink's launch_dependents and wait before its first global access). The unrolled S sum (plan
``s_unroll``) runs in the interpreter: bit-identical to the loop, −1 rows equal to the base, repeats
identical.
"""

import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lowrank_gemm.kernels import multilora_gemm as mg
from lowrank_gemm.plan.config import KernelConfig

from test_multilora_gemm import (_compile_main, assert_base_rows_equal, assert_close, make_case, ref_of, run,
                                 small_plan)

# plan variants whose epilogue reads the shrink workspace (the only ones s_unroll changes)
UNROLL_VARIANTS = {
    "epilogue_epi2": dict(epi_d=2, split=3),
    "epilogue_pipe1_bvec_splitk2": dict(epi_pipe=1, b_vec=True, split_k=2, split=4),
    "appended": dict(expand="appended", split=3),
    "appended_rowsel_splitk3": dict(expand="appended", append_rowsel=True, split_k=3, split=2),
    "stacked_d2": dict(expand="appended", append_d=2, split=3),
}


@pytest.mark.parametrize("mode", ["gather", "segment"])
@pytest.mark.parametrize("variant", sorted(UNROLL_VARIANTS))
def test_s_unroll_bit_identical_to_loop(variant, mode):
    case = make_case(37, 45, 72, 7, 16, seed=17)       # NaN past each rank, ragged tiles, −1 rows
    kw = UNROLL_VARIANTS[variant]
    loop = run(case, mode, small_plan(**kw))
    unrolled = run(case, mode, small_plan(s_unroll=True, **kw))
    assert torch.equal(loop, unrolled)
    assert_close(unrolled, ref_of(case))


def test_s_unroll_base_rows_and_repeats():
    case = make_case(40, 36, 64, 6, 16, ranks=[16, 8, 3, 16, 0, 11], dirty=False)
    case["adapter_ids"][::3] = -1
    rows = case["adapter_ids"] == -1
    for kw in (dict(expand="appended", split_k=2, split=5), dict(epi_d=2, split=4)):
        plan = small_plan(s_unroll=True, **kw)
        base = run(case, "gather", plan, has_lora=False)
        y1, y2 = run(case, "gather", plan), run(case, "gather", plan)
        assert torch.equal(y1, y2), kw
        assert torch.equal(y1[rows], base[rows]), kw
        assert_base_rows_equal(run(case, "segment", plan)[rows], base[rows], kw)


def test_pdl_request_without_a_gpu_changes_nothing():
    case = make_case(21, 40, 48, 4, 16, ranks=[16, 5, 0, 12], seed=3)
    plan = small_plan(expand="appended", split_k=2)
    assert torch.equal(run(case, "gather", plan, pdl=True), run(case, "gather", plan, pdl=False))


def test_s_unroll_plan_field():
    p = small_plan(expand="appended", s_unroll=True)
    assert mg.MultiLoRAPlan.from_dict(p.to_dict()) == p
    old = {k: v for k, v in p.to_dict().items() if k != "s_unroll"}      # tables written before the field
    assert not mg.MultiLoRAPlan.from_dict(old).s_unroll
    # on with the appended expand (the tuned winners' plan, the heuristic's from 2 adapters on), off with one adapter
    for a in (1, 4, 16, 64):
        assert mg.heuristic_plan(64, 4096, 4096, 16, 64, "gather", 132, adapters=a).s_unroll == (a > 1)


# ---- what is launched: flags and order (kernels replaced by recorders; nothing runs)

# aten ops that never launch a device kernel: allowed between the shrink and the main launch
_NO_KERNEL_OPS = ("aten.empty", "aten.view", "aten.as_strided", "aten.alias", "aten.detach", "aten.t.",
                  "aten.transpose", "aten.unsqueeze", "aten.expand", "aten.slice", "aten.select")


class _Log(TorchDispatchMode):
    def __init__(self, events):
        super().__init__()
        self.events = events

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.events.append(("op", str(func)))
        return func(*args, **(kwargs or {}))


class _Recorder:
    def __init__(self, name, events):
        self.name, self.events = name, events

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.events.append((self.name, kwargs))
        return launch


def _launches(monkeypatch, case, mode, plan, launchable=True, env_pdl=False, **kw):
    events = []
    monkeypatch.setattr(mg, "_mlora_shrink_kernel", _Recorder("shrink", events))
    monkeypatch.setattr(mg, "_mlora_main_kernel", _Recorder("main", events))
    monkeypatch.setattr(mg, "_sort_rows_kernel", _Recorder("sort", events))
    monkeypatch.setattr(mg, "pdl_supported", lambda device: launchable)
    monkeypatch.setattr(mg, "pdl_enabled", lambda device: env_pdl)
    with _Log(events):
        mg.multi_lora_gemm(**case, mode=mode, plan=plan, validate=False, **kw)
    names = [e[0] for e in events]
    kernels = {e[0]: e[1] for e in events if e[0] != "op"}
    return events, names, kernels


def _ops_between_shrink_and_main(events):
    names = [e[0] for e in events]
    i, j = names.index("shrink"), names.index("main")
    return [e[1] for e in events[i + 1:j]]


@pytest.mark.parametrize("mode", ["gather", "segment"])
@pytest.mark.parametrize("kw", [dict(expand="appended", split_k=3), dict(epi_d=2), dict(expand="appended")])
def test_pdl_pair_flags_and_adjacency(monkeypatch, mode, kw):
    case = make_case(37, 45, 72, 7, 16, seed=2)
    plan = small_plan(**kw)
    events, names, k = _launches(monkeypatch, case, mode, plan, pdl=True, poison_workspace=True)
    assert names.index("shrink") < names.index("main")
    between = _ops_between_shrink_and_main(events)
    assert all(op.startswith(_NO_KERNEL_OPS) for op in between), \
        f"torch ops between the PDL pair launch kernels: {between}"
    if mode == "segment":       # the id sort (one launch since session 46) runs before the pair, never inside it
        assert names.index("sort") < names.index("shrink")
    # the shrink triggers its dependents but keeps an ordinary launch; main is the PDL launch
    assert k["shrink"]["PDL"] is True and not k["shrink"].get("launch_pdl", False)
    assert k["main"]["PDL"] is True and k["main"]["launch_pdl"] is True
    assert k["main"]["S_SLICES"] == 0


def test_pdl_off_by_default_and_env_switch(monkeypatch):
    case = make_case(20, 33, 40, 5, 16, seed=4)
    plan = small_plan(expand="appended", split_k=2, s_unroll=True)
    _, _, k = _launches(monkeypatch, case, "gather", plan)                      # pdl=None, env off
    assert k["shrink"]["PDL"] is False and k["main"]["PDL"] is False and k["main"]["launch_pdl"] is False
    assert k["main"]["S_SLICES"] == plan.shrink.split_k
    _, _, k = _launches(monkeypatch, case, "gather", plan, env_pdl=True)        # LOWRANK_GEMM_PDL=1
    assert k["main"]["PDL"] is True and k["main"]["launch_pdl"] is True
    _, _, k = _launches(monkeypatch, case, "gather", plan, env_pdl=True, pdl=False)
    assert k["main"]["PDL"] is False
    _, _, k = _launches(monkeypatch, case, "gather", plan, launchable=False, pdl=True)    # CPU / sm_80
    assert k["main"]["PDL"] is False and k["main"]["launch_pdl"] is False


@pytest.mark.parametrize("why", ["fused_shrink", "no_lora"])
def test_no_pdl_without_a_shrink_launch(monkeypatch, why):
    # main's K loop reads x before any wait: a PDL launch behind an arbitrary predecessor would race
    case = make_case(20, 33, 40, 5, 16, seed=4)
    plan = small_plan(fuse_d=2, s_unroll=True) if why == "fused_shrink" else small_plan(s_unroll=True)
    _, names, k = _launches(monkeypatch, case, "gather", plan, pdl=True, has_lora=why != "no_lora")
    assert "shrink" not in names
    assert k["main"]["PDL"] is False and k["main"]["launch_pdl"] is False and k["main"]["S_SLICES"] == 0


# ---- sm_90 PTX: where the waits are

def _first(ptx, pattern):
    m = re.search(pattern, ptx)
    return m.start() if m else None


def _last(ptx, pattern):
    hits = [m.start() for m in re.finditer(pattern, ptx)]
    return hits[-1] if hits else None


MAIN_PDL_CFGS = [
    # M=64 N=4096 tuned plan: appended expand, in-kernel split-K (partials + tickets after the wait)
    (KernelConfig(block_m=64, block_n=128, block_k=128, block_r=16, num_stages=4, num_warps=4, split_k=4),
     False, dict(append=True)),
    # N=28672 r64: appended, no split; segment mode (row order read before the wait)
    (KernelConfig(block_m=64, block_n=128, block_k=128, block_r=64, num_stages=4, num_warps=4), True,
     dict(append=True)),
    # M=256: 8 warps, appended, split 2
    (KernelConfig(block_m=128, block_n=128, block_k=64, block_r=16, num_stages=5, num_warps=8, split_k=2),
     False, dict(append=True)),
    # the epilogue expand (multi_lowrank_up), stacked 4 adapters per MMA
    (KernelConfig(block_m=64, block_n=128, block_k=128, block_r=16, num_stages=4, num_warps=4), False,
     dict(epi_d=4)),
]


@pytest.mark.parametrize("cfg,order,kw", MAIN_PDL_CFGS)
def test_aot_main_waits_after_the_k_loop(cfg, order, kw):
    off = _compile_main(cfg, order, **kw)
    assert "griddepcontrol" not in off.ptx, "PDL off must leave the kernel unchanged"
    on = _compile_main(cfg, order, pdl=True, **kw)
    ptx = on.ptx
    assert ptx.count("griddepcontrol.wait") == 1 and "launch_dependents" not in ptx
    wait = ptx.index("griddepcontrol.wait")
    # the whole base K loop (W by 2-D TMA, its wgmma) runs before the wait
    assert _first(ptx, r"wgmma\.mma_async") < wait
    assert _last(ptx, r"cp\.async\.bulk\.tensor\.2d") < wait
    # no global write of any kind before the wait (y, split-K partials, tickets, the appended list)
    for write in (r"\bst\.global", r"\batom\.global", r"\bred\.global"):
        hit = _first(ptx, write)
        assert hit is None or hit > wait, write
    # the only global loads before the wait are the prologue's ids / row order, issued before the
    # K loop's first copy: S (and scales, ranks, B, bias) are read after it
    first_copy = min(p for p in (_first(ptx, r"cp\.async"), _first(ptx, r"cp\.async\.bulk")) if p is not None)
    loads_before = [m.start() for m in re.finditer(r"\bld\.global", ptx[:wait])]
    assert all(p < first_copy for p in loads_before)
    assert on.shared == off.shared, "PDL costs no shared memory"


def test_aot_shrink_triggers_then_waits_before_any_access():
    from lowrank_gemm.kernels.aot import compile_sm90
    sig = {"x_ptr": "*bf16", "a_ptr": "*bf16", "ids_ptr": "*i32", "row_order_ptr": "*i32", "ranks_ptr": "*i32",
           "s_ptr": "*fp32", **{k: "i32" for k in ("M K L R_MAX K_PER_SPLIT stride_xm stride_xk stride_al "
                                                   "stride_ar stride_ak stride_ss stride_sm").split()}}
    aligned = ("x_ptr", "a_ptr", "s_ptr", "K", "K_PER_SPLIT", "stride_xm", "stride_al", "stride_ar", "stride_ss",
               "stride_sm")
    for pdl in (False, True):
        const = dict(MAX_DISTINCT=16, NUM_RB=1, SPLIT_S=5, BM=16, BR=16, BK=128, HAS_ORDER=True, PDL=pdl,
                     stride_xk=1, stride_ak=1)
        ptx = compile_sm90("lowrank_gemm.kernels.multilora_gemm", "_mlora_shrink_kernel", sig, const,
                           aligned=aligned, num_warps=4, num_stages=3).ptx
        if not pdl:
            assert "griddepcontrol" not in ptx
            continue
        trigger, wait = ptx.index("griddepcontrol.launch_dependents"), ptx.index("griddepcontrol.wait")
        first_access = min(p for p in (_first(ptx, r"\bld\.global"), _first(ptx, r"\bst\.global"),
                                       _first(ptx, r"cp\.async")) if p is not None)
        assert trigger < wait < first_access


def _loop_blocks(ptx):
    """Basic blocks that head a loop (the marker sits on the label's line or the next one)."""
    return [b for b in re.split(r"\n\$L__BB\d+_\d+:", ptx) if "Loop Header" in "".join(b.split("\n", 2)[:2])]


@pytest.mark.parametrize("cfg,slices", [
    (KernelConfig(block_m=64, block_n=128, block_k=128, block_r=16, num_stages=4, num_warps=4, split_k=4), 5),
    (KernelConfig(block_m=64, block_n=128, block_k=128, block_r=64, num_stages=4, num_warps=4), 2),
])
def test_aot_s_slices_loaded_straight_line(cfg, slices):
    """s_unroll: every slice's S load is issued in straight-line code after the wait (one round
    trip); the default keeps them in a loop (one round trip per slice)."""
    loads_per_slice = cfg.block_m * cfg.block_r // (4 * 32 * cfg.num_warps)      # 16-B loads per thread
    unrolled = _compile_main(cfg, False, append=True, pdl=True, s_slices=slices).ptx
    tail = unrolled[unrolled.index("griddepcontrol.wait"):]
    head = tail[:tail.index("Loop Header")]          # up to the appended loop
    assert head.count("ld.global.v4.b32") >= slices * loads_per_slice
    assert not any("ld.global.v4.b32" in b for b in _loop_blocks(tail))
    looped = _compile_main(cfg, False, append=True, pdl=True).ptx
    s_loops = [b for b in _loop_blocks(looped) if "ld.global.v4.b32" in b and "wgmma" not in b]
    assert len(s_loops) == 1 and s_loops[0].count("ld.global.v4.b32") == loads_per_slice


# ---- the GPU probe's --pdl mode, dry-run on the CPU (interpreter, fp16; graphs and timings stubbed)

def _probe_module():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scripts" / "probe_multilora.py"
    spec = importlib.util.spec_from_file_location("probe_multilora_dry", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_probe_pdl_dry_run(monkeypatch, tmp_path):
    """Every path of the probe's --pdl mode on tiny sizes: candidates, checks, winners, the reports and
    a compile child's share — so the one GPU call cannot die of a Python error."""
    import json
    from argparse import Namespace
    from dataclasses import replace

    from lowrank_gemm.bench import common
    from lowrank_gemm.nn.multilora import AdapterBank
    from lowrank_gemm.plan.smem import SmemError
    probe = _probe_module()
    monkeypatch.setattr(probe, "K", 64)
    monkeypatch.setattr(probe, "SLOTS", 6)
    monkeypatch.setattr(probe, "PDL_SMALL", (21, 40, 48, 5, 24))
    monkeypatch.setattr(probe, "SMALL_DTYPE", torch.float16)

    def make_sets(M, N, adapters, dev, seed, r=16, max_sets=None):
        g = torch.Generator().manual_seed(seed)
        slots = torch.randperm(probe.SLOTS, generator=g)[:adapters]
        ids = slots[torch.arange(M) % adapters][torch.randperm(M, generator=g)].to(torch.int32)
        sets = []
        for _ in range(min(2, max_sets or 2)):
            bank = AdapterBank(probe.SLOTS, r, probe.K, N, dtype=torch.float16)
            bank.bank_a.normal_(generator=g).mul_(probe.K ** -0.5)
            bank.bank_b.normal_(generator=g).mul_(r ** -0.5)
            bank.ranks.fill_(r)
            bank.scales.fill_(0.5)
            sets.append((torch.randn(M, probe.K, generator=g).half(),
                         (torch.randn(N, probe.K, generator=g) * probe.K ** -0.5).half(), bank, ids))
        return sets, sorted(set(ids.tolist()))

    def choose(M, N, K, r, L, mode, dev, adapters=None):
        # the BM-64 plans this probe was written against (the M ≤ 16 heuristic is swap-AB since session 15)
        p = mg.heuristic_plan(M, N, K, r, L, mode, 132, adapters, decode_swap=False)
        # stand-in for a tuned appended entry with 6 shrink K slices (the table is not read on the CPU):
        # the BN and fewer-slices candidates
        if M == 16 and not p.fuse_d:
            return replace(p, expand="appended", shrink=p.shrink.replace(split_k=6))
        return p

    real_restage = probe.restage

    def restage(mg_, plan):         # a candidate that cannot be built must become an ERROR row, not a crash
        if plan.main.block_n == 32:
            raise SmemError("no pipeline depth fits")
        return real_restage(mg_, plan)

    monkeypatch.setattr(probe, "SWAP_TILES_NARROW_N", ((64, 128, 1), (64, 128, 2)))   # CPU time: two of four
    monkeypatch.setattr(probe, "make_sets", make_sets)
    monkeypatch.setattr(probe, "restage", restage)
    monkeypatch.setattr(mg, "choose_plan", choose)
    monkeypatch.setattr(probe, "_graph_replays_equal", lambda call, expect, reps=3: torch.equal(call(), expect))
    monkeypatch.setattr(common, "time_graph", lambda fn, sets: common.Timing(10.0, 9.0, 11.0))
    monkeypatch.setattr(common, "measure_copy_tbps", lambda nbytes=0: 4.0)
    # r 24 → BLOCK_R 32: 4 adapters do not fit the fused shrink (shrink launch, PDL rows); M=80 → segment
    # rows (the heuristic's expand is appended there since session 18: no extra appended candidate);
    # 1 adapter → fused only
    cases = "16x40x24x4,80x24x24x4,16x40x16x1"
    args = Namespace(out=str(tmp_path), cases=cases, jobs=0, warm_s=1.0, budget_s=1e9, write_tuned=False)
    probe.pdl_main(args, dev=torch.device("cpu"))

    data = json.loads((tmp_path / "probe_multilora_pdl.json").read_text())
    assert all(r["ok"] for r in data["meta"]["small_gate"]), data["meta"]["small_gate"]
    rows = {(r["M"], r["impl"]): r for r in data["rows"]}
    for key in [(16, "fused"), (16, "fused_pdl"), (16, "fused_pdl_sum"), (16, "fused_pdl_sum_ss4"),
                (16, "bn64s2_pdl_sum"), (80, "seg"), (80, "seg_pdl_sum"), (16, "shrink_expand"), (16, "swap_bn64k128s1_pdl_sum"),
                (16, "swap_bn64k128s2_pdl_sum")]:
        assert rows[key]["status"] == "ok" and rows[key]["graph_us"] == 10.0, (key, rows[key])
    assert rows[(16, "bn32s1_pdl_sum")]["status"].startswith("ERROR (plan) SmemError")
    swaps = {"swap_bn64k128s1_pdl_sum", "swap_bn64k128s2_pdl_sum"}        # M ≤ 64, N < 16384 (the tiles set above)
    assert {r["impl"] for r in data["rows"] if r["adapters"] == 1} == {"cublas_base", "shrink_expand", "fused"} | swaps
    assert all(rows[(16, s)]["plan"]["main"]["swap_ab"] and rows[(16, s)]["plan"]["fuse_d"] == 0 for s in swaps)
    assert not any(r["impl"].startswith("swap") for r in data["rows"] if r["M"] > 64)
    assert rows[(80, "fused")]["plan"]["expand"] == "appended" and (80, "app_pdl_sum") not in rows
    winners = json.loads((tmp_path / "multilora_h200_pdl.json").read_text())["plans"]
    assert set(winners) == {mg.tuned_key(16, 40, 64, 24, 4), mg.tuned_key(80, 24, 64, 24, 4),
                            mg.tuned_key(16, 40, 64, 16, 1)}     # the last: a swap row (fused plans cannot pin)
    md = (tmp_path / "probe_multilora_pdl.md").read_text()
    assert "| 16 | 40 | 24 | 4 |" in md and "**win**" in md

    # a compile child's share runs the same calls (here in-process, on the CPU)
    assert probe.warm_shares([(16, 40, 24, 4), (16, 40, 24, 1), (80, 24, 24, 4)], 2) == \
        [["small", [80, 24, 24, 4]], [[16, 40, 24, 4], [16, 40, 24, 1]]]
    share = tmp_path / "share.json"
    share.write_text(json.dumps([[16, 40, 24, 4]]))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    probe.pdl_warm_worker(str(share), dev=torch.device("cpu"))
    assert json.loads((tmp_path / "share.json.done.json").read_text())[0].get("s") is not None


def test_split_k_tickets_come_from_the_shared_region(monkeypatch):
    """Split-K plans take their arrival tickets from the per-stream region the LoRA launches keep (zeroed once, left
    zero by every launch): no zeroed buffer per call, which a captured graph would replay as a memset node."""
    from lowrank_gemm.kernels import lora_gemm as LG
    case = make_case(37, 45, 72, 7, 16, seed=2)
    events, names, k = _launches(monkeypatch, case, "gather", small_plan(expand="appended", split_k=3))
    ops = [e[1] for e in events if e[0] == "op"]
    assert not [op for op in ops if "zero" in op or "fill" in op], ops
    assert k["main"]["SPLIT_K"] == 3
    assert LG._TICKETS.region(torch.device("cpu")) is not None       # the launch took this stream's region
