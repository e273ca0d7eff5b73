"""GPU probe (≤ ~4 min): the register-A int4_g64 W4A4 kernel (kernels/gluon/w4a4_rs.py) — correctness first, then
timings at the FLUX sizes next to fp8, bf16 and today's v2.

    PYTHONPATH=src python scripts/probe_w4a4_rs.py --out $OUT [--cfgs default,t128n64k128] [--no-time]

1. ``check``: ONE child process builds the operands and their float64 references once (ragged M=300, N=320, K=448
   at grids default / 1 / 2; M=132, N=136, K=192 with an odd rank on 3 programs; fc1 4608×3072→12288 and fc2
   4608×12288→3072, references computed in float64 on the GPU), then runs every config in turn: NaN-poisoned output,
   normalized max error < 1e-2 (bf16 out), a bit-identical repeat, and on fc1 the pre-expanded (x8, xab) launch the
   timing uses. Each config has its own deadline (a wrong mbarrier phase hangs, it does not fail): a config that
   hangs or raises is recorded, the child is killed and a fresh one continues with the configs left.
2. ``time`` (configs that passed only), ONE child process, so every row shares the process: fp8 ``_scaled_mm``,
   bf16 cuBLAS, v2 with ``launch_w4a4_v2`` defaults, and each config, GEMM alone on operands pre-expanded once
   (``expand_act_f8`` timed on its own row), at fc1 and fc2; CUDA-graph replay medians (``bench.common``), two
   input sets rotated. Rows stream out as they finish, so a hang keeps what was measured.
Writes probe_w4a4_rs.json / .md to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
RANK = 32
FLUX = {"fc1": (4608, 12288, 3072), "fc2": (4608, 3072, 12288)}          # M, N, K
TOL = 1e-2          # bf16 output: one rounding of the result plus s rounded to bf16 (tests/test_gluon_gpu.py)


# =============================================================================================
# Child: check
def _reference_cuda(ops):
    """float64 spec of a ``make_operands_v2`` problem computed where the operands are (the GPU for the FLUX shapes:
    the CPU would take minutes); the same composition as ``w4a4_ws.reference_v2``, which moves to the CPU first."""
    from lowrank_gemm.reference import lowrank_epilogue_ref, w4a4_gemm_ref
    main = w4a4_gemm_ref(ops["x_q"], ops["x_scale"], ops["w_q"], ops["w_scale"], group_size=ops["group_size"],
                         fmt="int4_g64")
    if ops.get("col_scale") is not None:
        main = main * ops["col_scale"].double()
    s = ops["lowrank_act"].to(ops["lora_up"].dtype) if ops["lowrank_act"] is not None else None
    return lowrank_epilogue_ref(main, s, ops["lora_up"], bias=ops["bias"])


CHECK_CASES = [  # name, M, N, K, rank, grid, bias, col_scale
    ("ragged", 300, 320, 448, RANK, None, True, True),
    ("ragged_grid1", 300, 320, 448, RANK, 1, True, True),
    ("ragged_grid2", 300, 320, 448, RANK, 2, True, True),
    ("short_k_odd_rank", 132, 136, 192, 5, 3, True, True),
    ("fc1", *FLUX["fc1"], RANK, None, True, False),
    ("fc2", *FLUX["fc2"], RANK, None, True, False),
    ("fc1_fp32_out", *FLUX["fc1"], 0, None, False, False),   # the kernel's fp32 result before any cast (RATIO's
                                                            # in-place e4m3 accumulation vs fresh exact partials)
]


def child_check(tags: list[str]) -> None:
    import torch
    from lowrank_gemm.kernels.gluon import w4a4_rs as rs
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    probs = {}
    for name, M, N, K, r, grid, bias, cs in CHECK_CASES:
        ops = w4.make_operands_v2("int4_g64", M, N, K, r, 64, device="cuda", bias=bias, col_scale=cs,
                                  out_dtype=torch.float32 if name.endswith("fp32_out") else torch.bfloat16)
        ref = _reference_cuda(ops) if M * N * K > 2**28 else w4.reference_v2(ops).cuda()
        probs[name] = (ops, ref, grid)
    print("READY", flush=True)
    for tag in tags:
        print(f"START {tag}", flush=True)
        config, opts = rs.config_from_tag(tag)
        row = dict(tag=tag, cases={})
        try:
            for name, (ops, ref, grid) in probs.items():
                ops["out"].fill_(float("nan"))
                t0 = time.time()
                y = rs.launch_w4a4_rs(**ops, config=config, **opts, grid=grid).clone()
                torch.cuda.synchronize()
                got = y.double()
                finite = bool(torch.isfinite(got).all())
                err = float((got - ref).abs().max() / ref.abs().max()) if finite else float("inf")
                rel_fro = float((got - ref).norm() / ref.norm()) if finite else float("inf")
                ops["out"].fill_(float("nan"))
                same = bool(torch.equal(rs.launch_w4a4_rs(**ops, config=config, **opts, grid=grid), y))
                c = dict(err=err, rel_fro=rel_fro, finite=finite, same=same, s=round(time.time() - t0, 2))
                if name == "fc1":     # the pre-expanded launch the timing rows use
                    x8, xab = expand_act_f8(ops["x_q"], ops["x_scale"], 64)
                    pre = rs.launch_w4a4_rs(**{**ops, "x_q": x8, "x_scale": xab}, config=config, **opts)
                    c["pre_expanded_equal"] = bool(torch.equal(pre, y))
                row["cases"][name] = c
                print(f"CASE {tag} {name}: err {err:.2e} rel {rel_fro:.2e} finite={finite} same={same}", flush=True)
            _, _, cx, cfg = rs.rs_args(**probs["fc1"][0], config=config, **opts)
            row["config"] = dict(block_t=cfg.block_m, block_n=cfg.block_n, block_k=cfg.block_k,
                                 stages=cfg.num_stages, nsplit=cx["NSPLIT"], warps=cfg.num_warps,
                                 ratio=bool(cx["RATIO"]),
                                 ctas_per_sm=rs.ctas_per_sm(cfg, rs.rs_ledger(cfg, ratio=bool(cx["RATIO"])),
                                                            opts.get("ctas")))
            row["ok"] = all(c["finite"] and c["err"] < TOL and c["same"] and c.get("pre_expanded_equal", True)
                            for c in row["cases"].values())
            print("ROW " + json.dumps(row), flush=True)
        except Exception as exc:      # a CUDA error poisons the context: report, then let the parent restart us
            traceback.print_exc()
            row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:500])
            print("ROW " + json.dumps(row), flush=True)
            sys.exit(3)


# =============================================================================================
# Child: time
def child_time(tags: list[str]) -> None:
    import torch
    from lowrank_gemm.bench.common import device_meta, time_impl
    from lowrank_gemm.bench.w4a4 import _providers
    from lowrank_gemm.kernels.gluon import w4a4_rs as rs
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    print("META " + json.dumps(device_meta(None)), flush=True)
    dev = torch.device("cuda")

    def emit(shape, impl, fn, sets, **extra):
        M, N, K = FLUX[shape]
        row = dict(shape=shape, M=M, N=N, K=K, r=RANK, impl=impl, **extra)
        try:
            row.update(time_impl(fn, sets))
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            traceback.print_exc(limit=2)
        print("ROW " + json.dumps(row), flush=True)

    for shape, (M, N, K) in FLUX.items():
        prov = _providers(M, N, K, dev, impls=())
        for name in ("fp8_scaled_mm", "cublas_bf16"):
            fn, make, _ = prov[name]
            emit(shape, name, fn, [make() for _ in range(2)])
        del prov
        packed = [w4.make_operands_v2("int4_g64", M, N, K, RANK, 64, device="cuda", bias=True, seed=s) for s in range(2)]
        emit(shape, "expand_act_f8", lambda o: expand_act_f8(o["x_q"], o["x_scale"], 64), [(o, ) for o in packed])
        sets = []
        for o in packed:      # pre-expanded once: the GEMM rows time the GEMM alone
            x8, xab = expand_act_f8(o["x_q"], o["x_scale"], 64)
            sets.append(({**o, "x_q": x8, "x_scale": xab}, ))
        try:                  # v2 takes pre-expanded e4m3 activations where check_gemm_args accepts them
            base = w4.launch_w4a4_v2(**sets[0][0]).double().clone()
            emit(shape, "v2_gemm", lambda o: w4.launch_w4a4_v2(**o), sets)
        except ValueError as exc:
            print(f"v2 on pre-expanded operands refused ({exc}); timing it with its expand_act_f8", flush=True)
            base = w4.launch_w4a4_v2(**packed[0]).double().clone()
            emit(shape, "v2_gemm+expand_act_f8", lambda o: w4.launch_w4a4_v2(**o), [(o, ) for o in packed])
        del packed
        ratio_sets = None
        for tag in tags:
            config, opts = rs.config_from_tag(tag)
            run = sets
            if opts.get("ratio"):
                if ratio_sets is None:   # the tables a layer would hold (weights) / act_quant would emit (tokens)
                    ratio_sets = [({**o, "ratio_tables": (*rs.ratio_act_tables(o["x_scale"]),
                                                          *rs.ratio_weight_tables(o["w_scale"]))}, ) for (o, ) in sets]
                    emit(shape, "ratio_act_tables(torch)", lambda o: rs.ratio_act_tables(o["x_scale"]), sets)
                run = ratio_sets
            try:
                y = rs.launch_w4a4_rs(**run[0][0], config=config, **opts).double()
                rel = float((y - base).abs().max() / base.abs().max())
            except Exception as exc:
                print("ROW " + json.dumps(dict(shape=shape, M=M, N=N, K=K, r=RANK, impl=f"rs:{tag}",
                                               error=f"{type(exc).__name__}: {exc}"[:300])), flush=True)
                continue
            emit(shape, f"rs:{tag}", lambda o, c=config, kw=opts: rs.launch_w4a4_rs(**o, config=c, **kw), run,
                 max_rel_diff_vs_v2=rel)
        del sets, base
        torch.cuda.empty_cache()
    print("DONE", flush=True)


# =============================================================================================
# Parent (stdlib only while children run)
def _stream(cmd, env, first_timeout: float, item_timeout: float, on_line, deadline: float):
    """Run ``cmd`` in its own process group, calling ``on_line`` per output line. The child gets ``first_timeout``
    seconds until it prints READY/META, then ``item_timeout`` after each START/CASE/ROW line; past that (or past the
    absolute ``deadline``) the whole group is killed. → ("HANG" | returncode, last START tag or None)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    lines: queue.Queue = queue.Queue()

    def pump():
        for ln in proc.stdout:
            lines.put(ln.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    limit = time.time() + first_timeout
    current = None
    while True:
        try:
            ln = lines.get(timeout=max(0.05, min(limit, deadline) - time.time()))
        except queue.Empty:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return "HANG", current
        if ln is None:
            return proc.wait(), current
        print(ln, flush=True)
        if ln.startswith(("READY", "META", "START ", "CASE ", "ROW ")):
            limit = time.time() + item_timeout
        if ln.startswith("START "):
            current = ln.split(" ", 1)[1]
        elif ln.startswith("ROW "):
            current = None
        on_line(ln)


def check(tags: list[str], env, setup_timeout: float, item_timeout: float, deadline: float,
          child_cmd=None) -> dict:
    """tag → check row. ``child_cmd(tags)`` → argv of a check child (default: this script's ``--child check``)."""
    child_cmd = child_cmd or (lambda left: [sys.executable, __file__, "--child", "check", "--cfgs", ",".join(left)])
    results: dict = {}
    left = list(tags)
    while left and time.time() < deadline:
        def on_line(ln):
            if ln.startswith("ROW "):
                row = json.loads(ln[4:])
                results[row["tag"]] = row
        status, current = _stream(child_cmd(left), env, setup_timeout, item_timeout, on_line, deadline)
        if current is not None and current not in results:
            why = f"child exit {status}"
            if status == "HANG":
                why = "SKIPPED (probe budget ran out in this config)" if time.time() >= deadline - 0.5 else "HANG"
            results[current] = dict(tag=current, ok=False, error=why)
        done = [t for t in left if t in results]
        if not done:      # the child died before its first config (setup): nothing to continue with
            for t in left:
                results[t] = dict(tag=t, ok=False, error=f"check child failed during setup ({status})")
            break
        left = [t for t in left if t not in results]
    for t in left:
        results.setdefault(t, dict(tag=t, ok=False, error="SKIPPED (probe budget)"))
    return results


def _md(data: dict) -> str:
    out = [f"# probe_w4a4_rs\n\nwall {data.get('wall_s')} s · {data.get('meta', {})}\n", "## check\n",
           "| config | ok | tiles (BT×BN×BK, stages, nsplit, warps, CTAs/SM) | worst err | note |", "|---|---|---|---|---|"]
    for tag, r in data["check"].items():
        errs = [c["err"] for c in r.get("cases", {}).values()]
        cfg = r.get("config", {})
        shape = (f"{cfg.get('block_t')}×{cfg.get('block_n')}×{cfg.get('block_k')}, {cfg.get('stages')}, "
                 f"{cfg.get('nsplit')}, {cfg.get('warps')}, {cfg.get('ctas_per_sm')}") if cfg else ""
        bad = [f"{n}: err {c['err']:.2e} finite={c['finite']} same={c['same']}"
               for n, c in r.get("cases", {}).items() if not (c["finite"] and c["err"] < TOL and c["same"])]
        out.append(f"| {tag} | {r.get('ok')} | {shape} | {max(errs) if errs else '—'} | "
                   f"{r.get('error', '; '.join(bad))} |")
    out += ["", "## GEMM alone (CUDA-graph replay median µs; operands pre-expanded once)", "",
            "| shape | impl | graph µs | eager µs | ÷ fp8 | ÷ v2 | max rel diff vs v2 | error |",
            "|---|---|---|---|---|---|---|---|"]
    ref = {}
    for r in data["rows"]:
        if r.get("graph_us") and r["impl"] in ("fp8_scaled_mm", "v2_gemm", "v2_gemm+expand_act_f8"):
            ref[(r["shape"], r["impl"].split("+")[0])] = r["graph_us"]
    for r in data["rows"]:
        g = r.get("graph_us")
        f8, v2 = ref.get((r["shape"], "fp8_scaled_mm")), ref.get((r["shape"], "v2_gemm"))
        out.append(f"| {r['shape']} | {r['impl']} | {g} | {r.get('median_us')} | "
                   f"{round(g / f8, 2) if g and f8 else '—'} | {round(g / v2, 2) if g and v2 else '—'} | "
                   f"{r.get('max_rel_diff_vs_v2', '')} | {r.get('error', '')} |")
    return "\n".join(out) + "\n"


def main() -> int:
    from lowrank_gemm.kernels.gluon.w4a4_rs import PROBE_TAGS   # noqa: E402 (host-only import: no CUDA work)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", choices=("check", "time"), help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--cfgs", default=",".join(PROBE_TAGS), help="config tags (w4a4_rs.config_from_tag)")
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--setup-timeout", type=float, default=120.0, help="s for a child's imports + operands")
    ap.add_argument("--item-timeout", type=float, default=60.0,
                    help="s per check case (its compile included) / per timing row")
    ap.add_argument("--budget", type=float, default=230.0, help="s for the whole probe")
    ap.add_argument("--time-reserve", type=float, default=90.0, help="s of the budget kept for the timing child")
    args = ap.parse_args()
    tags = [t for t in args.cfgs.split(",") if t]
    if args.child == "check":
        child_check(tags)
        return 0
    if args.child == "time":
        child_time(tags)
        return 0
    t0 = time.time()
    deadline = t0 + args.budget
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    check_deadline = deadline - (0 if args.no_time else args.time_reserve)
    data = {"check": check(tags, env, args.setup_timeout, args.item_timeout, check_deadline), "rows": [], "meta": {}}
    passed = [t for t in tags if data["check"][t].get("ok")]
    print(f"[check] passed: {passed}; failed: {[t for t in tags if t not in passed]}", flush=True)
    if passed and not args.no_time and time.time() < deadline:
        def on_line(ln):
            if ln.startswith("ROW "):
                data["rows"].append(json.loads(ln[4:]))
            elif ln.startswith("META "):
                data["meta"] = json.loads(ln[5:])
        status, _ = _stream([sys.executable, __file__, "--child", "time", "--cfgs", ",".join(passed)], env,
                            args.setup_timeout, args.item_timeout, on_line, deadline)
        data["time_status"] = status
    data["wall_s"] = round(time.time() - t0, 1)
    (out / "probe_w4a4_rs.json").write_text(json.dumps(data, indent=1))
    (out / "probe_w4a4_rs.md").write_text(_md(data))
    print(_md(data))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
