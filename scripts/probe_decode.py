"""GPU probe (≤ ~150 s): the W4A4 decode kernel (kernels/gluon/w4a4_decode.py) — correctness first, then timings.

    PYTHONPATH=src python scripts/probe_decode.py --out $OUT [--no-time] [--cfgs 64x256x4,128x256x4]
    PYTHONPATH=src python scripts/probe_decode.py --fmt int4_g64 --f8 both --ms 1,16 --cfgs 128x256x5,128x128x6 --out $OUT

``--f8`` (int4_g64 only): ``off`` = the module default (F8_DEFAULT / LOWRANK_GEMM_DECODE_F8), ``on`` = the e4m3
path only, ``both`` = the int8 and e4m3 paths side by side on the same operands, each checked first (a variant
that fails its check is not timed; the other still is), plus ``expand_act_f8`` alone (the extra launch the f8
GEMM row includes) and the layer / op rows with the f8 switch on.

1. ``check`` runs in a child process under a watchdog (a wrong mbarrier phase would hang, not fail): ragged and
   real shapes vs the float64 reference (rel err < 1e-2, bf16 out, NaN-poisoned), K loops shorter than the ring,
   rank 0 / 16 / 32, bias and col_scale, bit-identical repeats, CUDA-graph capture and replay.
2. ``time`` (only if check passed), one process: at M ∈ {1, 16, 64}, K=4096, N=28672, r=32: cuBLAS bf16, fp8
   _scaled_mm, the v2 GEMM (today's auto for 2l decode), decode tile candidates (block_n × block_k × stages),
   and the whole layer (act_quant + GEMM) with impl auto vs decode. CUDA-graph medians, inputs rotated.
Writes probe_decode.json / .md to --out.
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
N, K, R = 28672, 4096, 32
FMT = "int4_2l"   # --fmt
F8 = "off"        # --f8
CFGS = "128x256x4,128x256x3,128x128x6,128x128x4,64x256x4,128x512x2,128x256x4w8,128x128x6w8"


def _variants() -> list:
    """The f8 settings to check and time: None = the module default (one variant, as before --f8 existed)."""
    if FMT != "int4_g64" or F8 == "off":
        return [None]
    return [True] if F8 == "on" else [False, True]


def _vtag(f8) -> str:
    return "" if f8 is None else (":f8" if f8 else ":int8")


def _cfg(tag: str | None, m: int, f8=None):
    """"BNxBKxSTAGES" + flags: "s" synchronous wgmmas, "w8" 8 warps (two warpgroups) → (config, launcher kwargs);
    ``tag`` None = the default config. (Session 3 also tried an "m" mad product and a "t" tiled weight layout: no
    gain, removed.)"""
    import re
    from lowrank_gemm.kernels.gluon.w4a4_decode import default_decode_config
    kw = {} if f8 is None else dict(f8=f8)
    if tag is None:
        return None, kw
    bn, bk, st, flags = re.fullmatch(r"(\d+)x(\d+)x(\d+)(\D.*)?", tag).groups()
    flags = flags or ""
    cfg = default_decode_config(m, 64, FMT, f8=bool(f8)).replace(block_n=int(bn), block_k=int(bk),
                                                                 num_stages=int(st), num_warps=8 if "w8" in flags else 4)
    kw = dict(kw, mma_async="s" not in flags)
    return cfg, kw


def _launch(ops, cfg, kw):
    from lowrank_gemm.kernels.gluon.w4a4_decode import launch_w4a4_decode
    return launch_w4a4_decode(**ops, config=cfg, **kw)


_REF: dict = {}   # case → (operands, float64 reference): shared by tags and f8 variants (same seed)


def _check_variant(f8) -> dict:
    """One f8 setting: ragged and real shapes vs the float64 reference, repeat bit-identity, graph replay.
    With two variants (--f8 both) fewer tile tags each (compile time: the check must fit its watchdog)."""
    import torch
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    tags = (None, "128x128x6", "64x512x3", "128x256x4w8") + (("128x256x4s", ) if FMT == "int4_2l" else ())
    if len(_variants()) > 1:
        tags = (None, "128x128x6")
    cases = [dict(M=1, N=160, K=512, rank=16, bias=True, col_scale=True),
             dict(M=5, N=336, K=1024, rank=32, bias=False, col_scale=False),
             dict(M=16, N=272, K=192, rank=0, bias=True, col_scale=False),
             dict(M=33, N=4112, K=4096, rank=32, bias=True, col_scale=True),
             dict(M=64, N=N, K=K, rank=R, bias=True, col_scale=False)]
    worst, notes = 0.0, []
    for c in cases:
        key = tuple(sorted(c.items()))
        if key not in _REF:
            ops = w4.make_operands_v2(FMT, c["M"], c["N"], c["K"], c["rank"], 64, device="cuda",
                                      bias=c["bias"], col_scale=c["col_scale"])
            _REF[key] = (ops, w4.reference_v2(ops))
        ops, ref = _REF[key]
        for tag in tags:
            if tag and c["K"] % int(tag.split("x")[1]):
                continue
            ops["out"].fill_(float("nan"))
            cfg, kw = _cfg(tag, c["M"], f8)
            out = _launch(ops, cfg, kw).clone()
            torch.cuda.synchronize()
            got = out.double().cpu()
            err = float((got - ref).norm() / ref.norm()) if torch.isfinite(got).all() else float("inf")
            again = _launch(ops, cfg, kw)
            same = bool(torch.equal(again, out))
            worst = max(worst, err)
            notes.append(f"f8={f8} M={c['M']} N={c['N']} K={c['K']} r={c['rank']} cfg={tag}: err {err:.2e} same={same}")
            print(notes[-1], flush=True)
            if not same:
                return dict(ok=False, err=err, note="not bit-identical over repeats: " + notes[-1])
    ops = w4.make_operands_v2(FMT, 16, N, K, R, 64, device="cuda")
    _, kw = _cfg(None, 16, f8)
    ref_out = _launch(ops, None, kw).clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _launch(ops, None, kw)
    ops["out"].fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    graph_ok = bool(torch.equal(ops["out"], ref_out))
    notes.append(f"f8={f8} graph replay equal: {graph_ok}")
    print(notes[-1], flush=True)
    return dict(ok=worst < 1e-2 and graph_ok, err=worst, note="; ".join(notes[-3:]))


def check() -> dict:
    """Every variant of ``_variants()`` (a failure in one never stops the others); with both f8 settings also
    the f8-vs-int8 difference on real-size operands (fp32 out: only the rescale's fp32 rounding differs)."""
    import torch
    res = {}
    for f8 in _variants():
        try:
            res[_vtag(f8) or "default"] = _check_variant(f8)
        except Exception as exc:
            traceback.print_exc()
            res[_vtag(f8) or "default"] = dict(ok=False, err=None, note=f"{type(exc).__name__}: {exc}"[:400])
    out = dict(ok=all(r["ok"] for r in res.values()), variants=res,
               passed=[k for k, r in res.items() if r["ok"]])
    out["err"] = max((r["err"] for r in res.values() if r.get("err") is not None), default=None)
    if len(res) == 2 and all(r["ok"] for r in res.values()):
        from lowrank_gemm.kernels.gluon import w4a4_ws as w4
        diffs = []
        for m in (1, 5, 16):
            ops = w4.make_operands_v2(FMT, m, N, K, R, 64, device="cuda", out_dtype=torch.float32)
            y8 = _launch(ops, None, dict(f8=True)).clone()
            yi = _launch(ops, None, dict(f8=False)).clone()
            diffs.append(float((y8.double() - yi.double()).norm() / yi.double().norm()))
        out["f8_vs_int8_rel"] = diffs
        print(f"f8 vs int8 (fp32 out, M=1/5/16): {diffs}", flush=True)
    return out


def _with_f8_env(fn):
    """fn with LOWRANK_GEMM_DECODE_F8=1 while it runs (graph capture included: the switch is read per call)."""
    def run(*args):
        old = os.environ.get("LOWRANK_GEMM_DECODE_F8")
        os.environ["LOWRANK_GEMM_DECODE_F8"] = "1"
        try:
            return fn(*args)
        finally:
            if old is None:
                os.environ.pop("LOWRANK_GEMM_DECODE_F8", None)
            else:
                os.environ["LOWRANK_GEMM_DECODE_F8"] = old
    return run


def time_all(cfgs: list[str], ms: list[int], variants: list | None = None) -> list[dict]:
    """``variants``: the f8 settings that passed the check (None: [module default])."""
    import torch
    from lowrank_gemm.bench.common import time_impl
    from lowrank_gemm.bench.w4a4 import _providers
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    from lowrank_gemm.kernels.gluon.w4a4_decode import launch_w4a4_decode
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    dev = torch.device("cuda")
    rows = []
    variants = variants or [None]

    def rec(m, impl, fn, sets, **extra):
        row = dict(suite="decode", M=m, N=N, K=K, r=R, impl=impl, **extra)
        try:
            row.update(time_impl(fn, sets))
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            traceback.print_exc(limit=2)
        rows.append(row)
        print(f"M={m:3d} {impl:34s} graph {row.get('graph_us')} µs {row.get('error', '')}", flush=True)

    for m in ms:
        prov = _providers(m, N, K, dev, impls=("v2", "decode"))
        for name in ("cublas_bf16", "fp8_scaled_mm", f"w4a4_gemm:{FMT}:v2", f"w4a4_layer:{FMT}:v2",
                     f"w4a4_layer:{FMT}:decode", f"w4a4_gemm:{FMT}:decode"):
            fn, make, _ = prov[name]
            rec(m, name, fn, [make() for _ in range(2)])
            if name.endswith(":decode") and True in variants:
                rec(m, name + ":f8", _with_f8_env(fn), [make() for _ in range(2)])   # the op with the switch on
        # tile candidates on pre-quantized operands (v2's make_operands: same packing as the layer); with
        # --f8 both, int8 and f8 alternate on the same two operand sets
        sets = [w4.make_operands_v2(FMT, m, N, K, R, 64, device="cuda", bias=True, seed=s) for s in range(2)]
        if True in variants:
            rec(m, "expand_act_f8", lambda ops: expand_act_f8(ops["x_q"], ops["x_scale"], 64), [(s,) for s in sets])
        for tag in ([None] if variants != [None] else []) + cfgs:
            for f8 in variants:
                impl = f"decode{_vtag(f8)}:{tag or 'default'}"
                try:
                    cfg, kw = _cfg(tag, m, f8)
                    base = _launch(sets[0], None, {} if f8 is None else dict(f8=False)).clone()
                    out = _launch(sets[0], cfg, kw).clone()
                    diff = float((out.float() - base.float()).abs().max())
                except Exception as exc:
                    rows.append(dict(suite="decode", M=m, N=N, K=K, r=R, impl=impl,
                                     error=f"{type(exc).__name__}: {exc}"[:300]))
                    print(f"M={m:3d} {impl} {rows[-1]['error']}", flush=True)
                    continue
                rec(m, impl, lambda ops, cfg=cfg, kw=kw: _launch(ops, cfg, kw), [(s,) for s in sets],
                    max_abs_diff_vs_default=diff)
        del sets
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--cfgs", default=CFGS)
    ap.add_argument("--ms", default="1,16,64")
    ap.add_argument("--fmt", default="int4_2l", choices=("int4_2l", "int4_g64"))
    ap.add_argument("--f8", default="off", choices=("off", "on", "both"),
                    help="int4_g64: the e4m3 path off (module default) / only / side by side with int8")
    ap.add_argument("--timeout", type=float, default=90.0)
    args = ap.parse_args()
    global FMT, F8
    FMT, F8 = args.fmt, args.f8
    if args.child == "check":
        try:
            res = check()
        except Exception as exc:
            traceback.print_exc()
            res = dict(ok=False, err=None, note=f"{type(exc).__name__}: {exc}"[:500])
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    status, log, res, _ = run_child([sys.executable, __file__, "--child", "check", "--fmt", FMT, "--f8", F8], env,
                                    args.timeout * len(_variants()))
    status = status or ("PASS" if res.get("ok") else "FAIL")
    print(log[-3000:])
    print(f"[check] {status} {res}", flush=True)
    data = {"check": dict(status=status, **res), "rows": []}
    # time the variants that passed (with --f8 both, a failing f8 still leaves the int8 rows)
    passed = [f8 for f8 in _variants() if (_vtag(f8) or "default") in res.get("passed", ())]
    if status != "HANG" and passed and not args.no_time:
        import torch  # noqa: F401  (only now: the parent stays light while the child runs)
        from lowrank_gemm.bench.common import device_meta
        data["meta"] = device_meta(None)
        data["rows"] = time_all([c for c in args.cfgs.split(",") if c], [int(m) for m in args.ms.split(",")],
                                passed)
    data["wall_s"] = round(time.time() - t0, 1)
    data["fmt"] = FMT
    data["f8"] = F8
    suffix = FMT + ("" if F8 == "off" else f"_f8{F8}")
    (out / f"probe_decode_{suffix}.json").write_text(json.dumps(data, indent=1))
    lines = ["| M | impl | graph µs | eager µs | note |", "|---|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(f"| {r['M']} | {r['impl']} | {r.get('graph_us')} | {r.get('median_us')} | "
                     f"{r.get('error', r.get('max_abs_diff_vs_default', ''))} |")
    (out / f"probe_decode_{suffix}.md").write_text(f"# probe_decode {FMT} f8={F8}\n\ncheck: {status} {res}\n\n"
                                                  + "\n".join(lines) + "\n")
    return 0 if status == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
