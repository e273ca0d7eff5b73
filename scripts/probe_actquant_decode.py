"""GPU probe (≤ ~4 min; ~2 with a warm Triton cache): the decode layer's quantization step — act_quant's e4m3
outputs, PDL, loads-first.

    PYTHONPATH=src python scripts/probe_actquant_decode.py --out $OUT [--ms 1,16,64] [--no-time]

Switches under test (all read per call, all off by default, so one process A/Bs them):
  LOWRANK_GEMM_ACT_QUANT_F8=1           the layer op asks act_quant for the e4m3 operands (x8 [M, K] + xab) where
                                        the GEMM takes its e4m3 path: no expand_act_f8 launch (int4_g64);
  LOWRANK_GEMM_PDL=1                    act_quant / expand_act_f8 (and the GEMM, if its launcher has PDL) launched
                                        with programmatic dependent launch;
  LOWRANK_GEMM_ACT_QUANT_LOADS_FIRST=1  fused act_quant issues every load of a program before its first use.

1. ``check`` (child process, watchdog): at K=4096, N=4112, r=32, M ∈ --ms, both formats, every layer variant
   (g64: off, f8, pdl, f8+pdl, f8+pdl+lf; 2l: off, pdl, pdl+lf): the layer (fp32 out, allocator block
   NaN-poisoned first, a NaN input row) vs the float64 reference of the GEMM on act_quant's operands (rel err
   < 1e-3), repeat- and bit-identical to the all-off layer; act_quant(out="f8") bit-identical to
   expand_act_f8(act_quant(...)) (the fused, v1 and v3 plans: M up to 200), LOADS_FIRST and PDL bit-identical to
   off; CUDA-graph replay of the all-on layer equal to eager. A variant that fails anywhere is not timed.
   Same M values and kernels as the timing, so the timing child finds them compiled (Triton's cache).
2. ``time`` (child process, watchdog; one process for all rows), K=4096, N=28672, r=32, M ∈ --ms: cuBLAS bf16
   (x @ Wᵀ); act_quant alone (today / loads-first / PDL / out="f8" / today + expand_act_f8); the layer (w4a4_linear,
   impl auto) for each switch combination that passed, each first checked bit-identical to the all-off layer on
   the real shape. CUDA-graph replay medians (bench.common.time_graph, input sets rotated).
Writes probe_actquant_decode.json / .md to --out (rows streamed, so a timeout keeps what was measured).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

from _childproc import run_child   # scripts/_childproc.py

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
N, K, R, G = 28672, 4096, 32, 64
FMTS = ("int4_g64", "int4_2l")
SWITCHES = {"f8": "LOWRANK_GEMM_ACT_QUANT_F8", "pdl": "LOWRANK_GEMM_PDL", "lf": "LOWRANK_GEMM_ACT_QUANT_LOADS_FIRST"}
# layer variants per format: name → switches on (the loads-first switch alone is measured on act_quant itself)
LAYER_VARIANTS = {"int4_g64": {"base": (), "f8": ("f8",), "pdl": ("pdl",), "f8+pdl": ("f8", "pdl"),
                               "f8+pdl+lf": ("f8", "pdl", "lf")},
                  "int4_2l": {"base": (), "pdl": ("pdl",), "pdl+lf": ("pdl", "lf")}}
ROW = "ROW "


def _variants(fmt: str) -> list[str]:
    return list(LAYER_VARIANTS[fmt])


def _env_of(on) -> dict:
    return {var: ("1" if key in on else "0") for key, var in SWITCHES.items()}


class _Env:
    """Set the switches for the duration of a block (graph capture included: every switch is read per call)."""

    def __init__(self, on=()):
        self.env = _env_of(on)

    def __enter__(self):
        self.old = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)

    def __exit__(self, *exc):
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _with_env(fn, on):
    def run(*args):
        with _Env(on):
            return fn(*args)
    return run


def _weights(fmt: str, n: int, k: int, dev, seed: int) -> tuple:
    """(qweight, wscales, smooth, lora_down, lora_up, wmul) like bench.w4a4's layer sets (bf16, r = 32)."""
    import torch
    from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
    from lowrank_gemm.formats.int4_twolevel import pack_weight_2l
    g = torch.Generator(device=dev).manual_seed(seed)
    w = torch.randn(n, k, device=dev, generator=g) * 0.02
    smooth = (torch.rand(k, device=dev, generator=g) + 0.5).to(torch.bfloat16)
    down = (torch.randn(R, k, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    up = (torch.randn(n, R, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    ws = w * smooth.float()
    if fmt == "int4_g64":
        qw, sw = quantize_weight_int4(ws, G)
        return pack_int4(qw), sw, smooth, down, up, None
    wq, wmul, wsc = pack_weight_2l(ws, G)
    return wq, wsc, smooth, down, up, wmul


def _x(m: int, k: int, dev, seed: int):
    """bf16 activations with per-column magnitudes spread like real ones (what smoothing is for)."""
    import torch
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(m, k, device=dev, generator=g) * torch.exp(torch.randn(k, device=dev, generator=g) * 0.5)
    return x.to(torch.bfloat16)


def _layer_set(fmt: str, m: int, n: int, k: int, dev, seed: int, weights: tuple | None = None) -> tuple:
    """(x, qweight, wscales, smooth, lora_down, lora_up, wmul): the layer op's arguments."""
    return (_x(m, k, dev, seed), *(weights or _weights(fmt, n, k, dev, seed)))


def _layer(fmt, out_dtype=None):
    from lowrank_gemm.kernels.w4a4_gemm import w4a4_linear
    return lambda x, wq, wsc, smooth, a, b, wmul: w4a4_linear(x, wq, wsc, smooth, a, b, None, G, fmt, "auto",
                                                              wmul=wmul, out_dtype=out_dtype)


def _poisoned_call(fn, args, m, n):
    """fn(*args) after a NaN-filled block of the output's size went back to the caching allocator (the layer
    allocates its output there: an element the GEMM never writes stays NaN)."""
    import torch
    torch.empty(m * n, device="cuda", dtype=torch.float32).fill_(float("nan"))
    return fn(*args)


def _same(a, b) -> bool:
    import torch
    view = {torch.float32: torch.int32, torch.float8_e4m3fn: torch.uint8, torch.bfloat16: torch.int16,
            torch.float16: torch.int16}.get(a.dtype)
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a.view(view) if view else a,
                                                                          b.view(view) if view else b))


# ---------------------------------------------------------------------------------------------- check
def check(ms: list[int]) -> dict:
    import torch
    from lowrank_gemm.kernels.act_quant import act_quant
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    from lowrank_gemm.reference import w4a4_gemm_ref
    dev = torch.device("cuda")
    n_chk = 4112                      # N % 16 == 0: the decode kernel's condition
    notes, failed, worst = [], set(), 0.0

    def note(s):
        notes.append(s)
        print(s, flush=True)

    for fmt in FMTS:
        for m in ms:
            x, wq, wsc, smooth, a, b, wmul = _layer_set(fmt, m, n_chk, K, dev, seed=m)
            if m > 1:
                x[m // 2, 7] = float("nan")                 # one NaN row: its outputs must be NaN
            with _Env(()):
                xq, xsc, s = act_quant(x, smooth, a, G, fmt, wsc.dtype if fmt == "int4_g64" else torch.bfloat16)
            ref = w4a4_gemm_ref(xq, xsc, wq, wsc, s, b, None, w_mul=wmul, group_size=G, fmt=fmt)
            rows = torch.isfinite(x.float()).all(1)
            base = None
            for v in _variants(fmt):
                on = LAYER_VARIANTS[fmt][v]
                try:
                    with _Env(on):
                        y = _poisoned_call(_layer(fmt, torch.float32), (x, wq, wsc, smooth, a, b, wmul), m, n_chk)
                        y2 = _layer(fmt, torch.float32)(x, wq, wsc, smooth, a, b, wmul)
                    torch.cuda.synchronize()
                    err = float((y[rows].double() - ref[rows]).norm() / ref[rows].norm())
                    ok = (err < 1e-3 and bool(torch.isnan(y[~rows]).all()) and bool(torch.isfinite(y[rows]).all())
                          and _same(y, y2))
                    if base is None:
                        base = y
                    same_as_base = _same(y, base)
                    worst = max(worst, err)
                    note(f"{fmt} M={m} layer {v}: rel err {err:.2e}, repeat equal {_same(y, y2)}, "
                         f"equal to base {same_as_base}")
                    if not (ok and same_as_base):
                        failed.add(f"{fmt}:{v}")
                except Exception as exc:
                    traceback.print_exc(limit=3)
                    note(f"{fmt} M={m} layer {v}: {type(exc).__name__}: {exc}"[:400])
                    failed.add(f"{fmt}:{v}")
    # act_quant alone: out="f8" == expand_act_f8(packed), loads-first and PDL change no bit (plans: fused M ≤ 16,
    # v1 at 64 for g64, v3 above 64)
    for fmt in FMTS:
        for m in sorted(set(ms) | {200}):
            x, _, _, smooth, a, _, _ = _layer_set("int4_2l", m, 64, K, dev, seed=100 + m)
            x[0, 9] = float("nan")
            with _Env(()):
                base = act_quant(x, smooth, a, G, fmt)
            for v, on in (("lf", ("lf",)), ("pdl", ("pdl",)), ("pdl+lf", ("pdl", "lf"))):
                with _Env(on):
                    got = act_quant(x, smooth, a, G, fmt)
                if not all(_same(p, q) for p, q in zip(base, got)):
                    note(f"act_quant {fmt} M={m} {v}: NOT bit-identical to off")
                    failed.add(f"{fmt}:act_quant_{v}")
            if fmt == "int4_g64":
                x8r, xabr = expand_act_f8(base[0], base[1], G)
                for on in ((), ("lf", "pdl")):
                    with _Env(on):
                        x8, xab, s8 = act_quant(x, smooth, a, G, fmt, out="f8")
                    good = _same(x8, x8r) and _same(xab, xabr) and _same(s8, base[2])
                    note(f"act_quant {fmt} M={m} out=f8 {'+'.join(on) or 'off'}: bit-identical to expand_act_f8 {good}")
                    if not good:
                        failed.add("int4_g64:act_quant_f8")
    torch.cuda.synchronize()
    # graph replay with everything on (PDL edges inside the graph)
    for fmt in FMTS:
        m = min(ms)
        on = ("f8", "pdl", "lf") if fmt == "int4_g64" else ("pdl", "lf")
        if any(f"{fmt}:{v}" in failed for v in ("f8+pdl+lf", "pdl+lf")):
            continue
        args = _layer_set(fmt, m, n_chk, K, dev, seed=7)
        fn = _layer(fmt, torch.float32)
        try:
            with _Env(on):
                eager = fn(*args).clone()
                from lowrank_gemm.bench.common import capture_graph
                _, graph, out = capture_graph(lambda: fn(*args))
            equal = True
            for _ in range(3):
                out.fill_(float("nan"))
                graph.replay()
                torch.cuda.synchronize()
                equal &= _same(out, eager)
            note(f"{fmt} graph replay ({'+'.join(on)}) equal to eager: {equal}")
            if not equal:
                failed.add(f"{fmt}:graph")
        except Exception as exc:
            traceback.print_exc(limit=3)
            note(f"{fmt} graph replay: {type(exc).__name__}: {exc}"[:400])
            failed.add(f"{fmt}:graph")
    passed = [f"{fmt}:{v}" for fmt in FMTS for v in _variants(fmt) if f"{fmt}:{v}" not in failed]
    return dict(ok=not failed, failed=sorted(failed), passed=passed, worst_err=worst, notes=notes[-60:])


# ---------------------------------------------------------------------------------------------- time
def time_all(ms: list[int], passed: list[str], failed: list[str]) -> None:
    """Streams one ``ROW {json}`` line per measurement (the parent collects them). ``passed`` / ``failed``: the
    check's "fmt:variant" verdicts (a layer variant is timed only if it passed; act_quant's e4m3 rows only if
    its f8 check did not fail)."""
    import inspect
    import torch
    from lowrank_gemm.bench.common import time_graph
    from lowrank_gemm.kernels.act_quant import act_quant
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    dev = torch.device("cuda")
    from lowrank_gemm.kernels.gluon import w4a4_decode, w4a4_ws
    gemm_pdl = {"decode": "launch_pdl" in inspect.getsource(w4a4_decode),
                "v2": "launch_pdl" in inspect.getsource(w4a4_ws)}
    print(ROW + json.dumps(dict(kind="meta", gemm_launchers_with_pdl=gemm_pdl)), flush=True)

    def rec(m, fmt, name, fn, sets, **extra):
        row = dict(M=m, N=N, K=K, r=R, fmt=fmt, impl=name, **extra)
        try:
            t = time_graph(fn, sets)
            row.update(graph_us=round(t.median_us, 3), graph_p20_us=round(t.p20_us, 3), graph_p80_us=round(t.p80_us, 3))
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            traceback.print_exc(limit=2)
        print(ROW + json.dumps(row), flush=True)

    weights = {fmt: [_weights(fmt, N, K, dev, seed=s) for s in range(2)] for fmt in FMTS}   # 2 sets: > L2
    for m in ms:
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
        xs = [torch.randn(m, K, device=dev, dtype=torch.bfloat16) for _ in range(2)]
        rec(m, "bf16", "cublas_bf16", lambda x: torch.nn.functional.linear(x, w), [(x,) for x in xs])
        del w
        for fmt in FMTS:
            sets = [_layer_set(fmt, m, N, K, dev, s, weights[fmt][s]) for s in range(2)]
            sdt = sets[0][2].dtype if fmt == "int4_g64" else torch.bfloat16
            aq_sets = [(st[0], st[3], st[4]) for st in sets] * 4     # 8 calls per graph: act_quant is ~µs
            aq = lambda out="packed", lf=False: (  # noqa: E731
                lambda x, sm, a: act_quant(x, sm, a, G, fmt, sdt, out=out, loads_first=lf))
            rec(m, fmt, "act_quant", aq(), aq_sets)
            if f"{fmt}:act_quant_lf" not in failed:
                rec(m, fmt, "act_quant:lf", aq(lf=True), aq_sets)
            if f"{fmt}:act_quant_pdl" not in failed:
                rec(m, fmt, "act_quant:pdl", _with_env(aq(), ("pdl",)), aq_sets)
            if fmt == "int4_g64" and f"{fmt}:act_quant_f8" not in failed:
                rec(m, fmt, "act_quant+expand_act_f8",
                    lambda x, sm, a: expand_act_f8(*act_quant(x, sm, a, G, fmt, sdt)[:2], G), aq_sets)
                rec(m, fmt, "act_quant:f8", aq("f8"), aq_sets)
            base = None
            for v in _variants(fmt):
                if f"{fmt}:{v}" not in passed:
                    print(ROW + json.dumps(dict(M=m, N=N, K=K, r=R, fmt=fmt, impl=f"layer:{v}",
                                                error="failed the check: not timed")), flush=True)
                    continue
                fn = _with_env(_layer(fmt), LAYER_VARIANTS[fmt][v])
                try:   # the real shape: bit-identical to the all-off layer before it is timed
                    y = fn(*sets[0])
                    torch.cuda.synchronize()
                    if base is None:
                        base = y
                    elif not _same(y, base):
                        raise AssertionError("output differs from the all-off layer")
                except Exception as exc:
                    print(ROW + json.dumps(dict(M=m, N=N, K=K, r=R, fmt=fmt, impl=f"layer:{v}",
                                                error=f"{type(exc).__name__}: {exc}"[:300])), flush=True)
                    continue
                rec(m, fmt, f"layer:{v}", fn, sets)
            del sets
            torch.cuda.empty_cache()


def _markdown(data: dict) -> str:
    rows = [r for r in data["rows"] if r.get("kind") != "meta"]
    meta = [r for r in data["rows"] if r.get("kind") == "meta"]
    lines = [f"# act_quant for decode: e4m3 outputs, PDL, loads-first (K={K}, N={N}, r={R})", "",
             f"check: {data['check'].get('status')} failed={data['check'].get('failed')}", "",
             f"GEMM launchers with PDL: {meta[0]['gemm_launchers_with_pdl'] if meta else '?'}", "",
             "| fmt | M | impl | graph µs | p20 | p80 | × cuBLAS bf16 | note |", "|---|---|---|---|---|---|---|---|"]
    cublas = {r["M"]: r.get("graph_us") for r in rows if r["impl"] == "cublas_bf16"}
    for r in rows:
        t, c = r.get("graph_us"), cublas.get(r["M"])
        ratio = f"{c / t:.2f}×" if (t and c) else ""
        lines.append(f"| {r['fmt']} | {r['M']} | {r['impl']} | {t} | {r.get('graph_p20_us', '')} | "
                     f"{r.get('graph_p80_us', '')} | {ratio} | {r.get('error', '')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--passed", default="", help=argparse.SUPPRESS)
    ap.add_argument("--failed", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ms", default="1,16,64")
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--check-timeout", type=float, default=140.0, help="seconds (cold Triton cache: ~40 compiles)")
    ap.add_argument("--time-timeout", type=float, default=90.0)
    args = ap.parse_args()
    if args.child:
        os.environ.update(_env_of(()))   # every switch off unless a variant turns it on (whatever the caller exported)
    if args.child == "check":
        try:
            res = check([int(m) for m in args.ms.split(",")])
        except Exception as exc:
            traceback.print_exc()
            res = dict(ok=False, failed=["check crashed"], passed=[], note=f"{type(exc).__name__}: {exc}"[:500])
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    if args.child == "time":
        time_all([int(m) for m in args.ms.split(",")], [p for p in args.passed.split(",") if p],
                 [f for f in args.failed.split(",") if f])
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    status, log, res, _ = run_child([sys.executable, __file__, "--child", "check", "--ms", args.ms], env,
                                    args.check_timeout)
    status = status or ("PASS" if res.get("ok") else ("PARTIAL" if res.get("passed") else "FAIL"))
    print(log[-4000:])
    print(f"[check] {status} failed={res.get('failed')}", flush=True)
    data = {"check": dict(status=status, **res), "rows": []}
    passed = res.get("passed", [])
    if status != "HANG" and passed and not args.no_time:
        tstatus, tlog, _, rows = run_child([sys.executable, __file__, "--child", "time", "--ms", args.ms,
                                            "--passed", ",".join(passed), "--failed", ",".join(res.get("failed", []))],
                                           env, args.time_timeout, row_prefix=ROW)
        data["rows"] = rows
        data["time_status"] = tstatus or "done"
        print(tlog[-6000:])
    try:
        import torch  # noqa: F401  (only now: the parent stays light while the children run)
        from lowrank_gemm.bench.common import device_meta
        data["meta"] = device_meta(None)
    except Exception as exc:
        data["meta"] = {"error": str(exc)}
    data["wall_s"] = round(time.time() - t0, 1)
    (out / "probe_actquant_decode.json").write_text(json.dumps(data, indent=1))
    (out / "probe_actquant_decode.md").write_text(_markdown(data))
    print(_markdown(data))
    return 0 if status == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
