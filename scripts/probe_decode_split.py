"""GPU probe (≤ ~4 min): the W4A4 decode kernel's split-K / stream-K, PDL and nonempty_k variants — correctness
first (child process under a watchdog), then every timing in ONE process.

    PYTHONPATH=src python scripts/probe_decode_split.py --out $OUT [--ms 1,16,64] [--fmts int4_2l,int4_g64]
                                                        [--no-time] [--timeout 120] [--budget 140]

Variants (kernels/gluon/w4a4_decode.py module doc): ``tile`` (today: one program per output tile), ``split2`` /
``split3`` / ``split4`` (split-K, one launch, the last contributor of a tile finishes it), ``stream`` (stream-K
over #SMs × 2 programs), int4_2l also ``stream:3`` (stream-K on a 3-slot ring: #SMs × 3 programs at M ≤ 16);
each also with ``:pdl`` (programmatic dependent launch); int4_2l also ``tile:nk`` / ``stream:nk``
(``nonempty_k``: the K loop ptxas does not serialize at M > 16); both formats ``tile+rb`` / ``stream+rb`` (± PDL:
the row table as one 2-D TMA box per step, ``row_box``; 2l on the nonempty_k loop). int4_g64 runs its default e4m3 path on
pre-expanded activations (the GEMM alone; ``expand_act_f8`` is its own row and the PDL producer).

1. ``check`` (one child per format, ``--timeout`` s each): at (M, N, K) ∈ {(1, 160, 512), (5, 336, 640) ragged K,
   (16, 28672, 4096), (64, 28672, 4096)}, bias, rank 32 (tests/test_w4a4_decode.py covers more shapes): every variant vs the float64 reference
   (rel err < 1e-2, NaN-poisoned bf16 out), repeat bit-identical, PDL bits = non-PDL bits, tickets back at zero
   (2l split/stream bits ≠ the tile kernel's — int32 partials, expected equal — is recorded as a note); then per format a CUDA graph of [producer → stream-K
   + PDL GEMM] × 2 replayed against eager. A variant that fails is not timed; the others still are.
2. ``time`` (only what passed; CUDA-graph medians, two rotated operand sets of 58 MB weights each), per M:
   cuBLAS bf16 and fp8 ``_scaled_mm`` (no branch), then per format
   - ``gemm:<fmt>:<variant>`` — the GEMM alone (+ its epilogue), ratio to ``gemm:<fmt>:tile`` (today's default);
   - ``pdl:<fmt>:<mode>:<producer>:{off,on}`` — a graph of [producer → GEMM] with and without PDL, mode ∈ {tile,
     the fastest GEMM mode if it is not tile}; producer ``plain`` = what feeds the GEMM in the layer (2l: a torch copy of
     the int8 tokens; g64: ``expand_act_f8``), ``trigger`` = a Triton copy that runs griddepcontrol.
     launch_dependents first (the best case PDL can give: the GEMM's weight loads start while it runs);
   - ``layer:<fmt>:...`` — the whole op (act_quant + [expand] + GEMM, ``w4a4_linear(impl="decode")``) today, with
     the fastest GEMM mode (env LOWRANK_GEMM_DECODE_SPLIT), and with it + LOWRANK_GEMM_PDL=1 (+ nonempty_k for 2l);
     then ``layer:<fmt>:tile+rb[:pdl]`` (LOWRANK_GEMM_DECODE_ROW_BOX=1, PDL off / on).
   The target (issue 4): layer ≤ cuBLAS bf16 / 3.
Writes probe_decode_split.json / .md to --out (rows so far are written even if the budget runs out).
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
from _scoped_env import scoped_env

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
N, K, R = 28672, 4096, 32
MODES = ("tile", "split2", "split3", "split4", "stream")
CHECK_SHAPES = [(1, 160, 512), (5, 336, 640), (16, N, K), (64, N, K)]


def _variants(fmt: str) -> list[tuple[str, bool, bool]]:
    """(mode, pdl, nonempty_k) of every variant of ``fmt``, the least risky first (the check runs them in this order:
    a variant that crashes the context or hangs leaves the ones before it checked); 2l also ``stream:3`` (a 3-slot
    ring: three CTAs per SM at 16-token tiles, 396 programs — more consumer warps per SM for the same bytes in
    flight)."""
    two_level = fmt == "int4_2l"
    out = [("tile", False, False), ("tile", True, False)] + ([("tile", False, True)] if two_level else [])
    out += [(m, p, False) for m in MODES[1:] + (("stream:3", ) if two_level else ()) for p in (False, True)]
    out += [("stream", False, True)] if two_level else []
    # ``+rb``: the row table as one 2-D TMA box per step (row_box), on the nonempty_k loop (2l's default now)
    return out + [(m, p, two_level) for m in ("tile+rb", "stream+rb") for p in (False, True)]


def _name(fmt, mode, pdl, nk) -> str:
    return f"{fmt}:{mode}" + (":pdl" if pdl else "") + (":nk" if nk else "")


def _config(fmt: str, m: int, mode: str):
    from lowrank_gemm.kernels.gluon.w4a4_decode import default_decode_config
    c = default_decode_config(m, 64, fmt, fmt != "int4_2l")
    if mode.startswith("stream"):
        return c.replace(persistent=True, num_stages=int(mode[7:]) if ":" in mode else c.num_stages)
    return c.replace(split_k=int(mode[5:])) if mode.startswith("split") else c


def _operands(fmt: str, m: int, n: int, k: int, seed: int = 0):
    """(GEMM operands, float64-reference operands): int4_g64 with pre-expanded e4m3 activations (x8, xab)."""
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    ops = w4.make_operands_v2(fmt, m, n, k, R, 64, device="cuda", bias=True, seed=seed)
    if fmt == "int4_2l":
        return ops, ops
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    x8, xab = expand_act_f8(ops["x_q"], ops["x_scale"], 64)
    return {**ops, "x_q": x8, "x_scale": xab}, ops


def _launch(ops, fmt, m, mode, pdl=False, nk=False):
    from lowrank_gemm.kernels.gluon.w4a4_decode import launch_w4a4_decode
    row_box = mode.endswith("+rb")
    return launch_w4a4_decode(**ops, config=_config(fmt, m, mode.removesuffix("+rb")), f8=fmt != "int4_2l", pdl=pdl,
                              nonempty_k=nk, row_box=row_box)


def _tickets_zero() -> bool:
    import torch
    from lowrank_gemm.kernels import lora_gemm as LG
    torch.cuda.synchronize()
    return LG._TICKETS.all_zero(torch.device("cuda", torch.cuda.current_device()))


# ------------------------------------------------------------------------------------------- producers (PDL rows)
_COPY_KERNEL = None


def _trigger_copy():
    """A Triton copy of up to two flat byte buffers that lets its dependents launch first thing."""
    global _COPY_KERNEL
    if _COPY_KERNEL is None:
        import triton
        import triton.language as tl
        from lowrank_gemm.kernels.pdl import gdc_launch_dependents

        @triton.jit
        def copy2(s0, d0, n0, s1, d1, n1, BLOCK: tl.constexpr):
            gdc_launch_dependents()
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(d0 + offs, tl.load(s0 + offs, mask=offs < n0), mask=offs < n0)
            tl.store(d1 + offs, tl.load(s1 + offs, mask=offs < n1), mask=offs < n1)
        _COPY_KERNEL = copy2
    return _COPY_KERNEL


def _producer_pair(kind: str, fmt: str, gops: dict, packed: dict):
    """(producer, GEMM operands) on one operand set of :func:`_operands`: the producer returns the activation
    operands (x_q, x_scale) the GEMM then reads. ``plain``: 2l — a torch copy of the int8 tokens; g64 —
    ``expand_act_f8`` of the packed tokens (its outputs go straight into the GEMM, as in the layer). ``trigger``:
    a Triton copy of the ready activations (g64: x8 and xab) whose first instruction is
    griddepcontrol.launch_dependents."""
    import torch
    if kind == "plain" and fmt != "int4_2l":
        from lowrank_gemm.kernels.w4_expand import expand_act_f8

        def expand():
            x8, xab = expand_act_f8(packed["x_q"], packed["x_scale"], 64)
            return {"x_q": x8, "x_scale": xab}
        return expand, gops
    src = {"x_q": gops["x_q"].clone(), "x_scale": gops["x_scale"].clone()}
    dst = {"x_q": torch.zeros_like(src["x_q"]), "x_scale": gops["x_scale"]}
    if kind == "plain":   # 2l

        def copy_tokens():
            dst["x_q"].copy_(src["x_q"])
            return dst
        return copy_tokens, gops
    g64 = fmt != "int4_2l"
    if g64:
        dst["x_scale"] = torch.zeros_like(src["x_scale"])
    b0, o0 = src["x_q"].view(torch.uint8).reshape(-1), dst["x_q"].view(torch.uint8).reshape(-1)
    b1 = src["x_scale"].view(torch.uint8).reshape(-1) if g64 else b0[:0]
    o1 = dst["x_scale"].view(torch.uint8).reshape(-1) if g64 else o0[:0]
    block = 1024
    grid = (max(1, -(-max(b0.numel(), b1.numel()) // block)), )
    kernel = _trigger_copy()

    def copy():
        kernel[grid](b0, o0, b0.numel(), b1, o1, b1.numel(), BLOCK=block)
        return dst
    return copy, gops


def _produce_and_launch(prod, gops, fmt, m, mode, pdl):
    return _launch({**gops, **prod()}, fmt, m, mode, pdl)


# ------------------------------------------------------------------------------------------------------- check
def _check_format(fmt: str) -> dict:
    """Variant-major: each variant on every shape, then a ``VARIANT {json}`` line (the parent keeps those if a
    later variant hangs)."""
    import torch
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    res = {_name(fmt, *v): dict(ok=True, err=0.0, notes=[]) for v in _variants(fmt)}

    def fail(name, why):
        res[name]["ok"] = False
        res[name]["notes"].append(why)
        print(f"FAIL {name}: {why}", flush=True)

    def report(name):
        print("VARIANT " + json.dumps({name: res[name]}), flush=True)

    cases = []
    for m, n, k in CHECK_SHAPES:
        gops, rops = _operands(fmt, m, n, k, seed=m)
        cases.append((m, n, k, gops, w4.reference_v2(rops)))
    outs = {}   # (variant, case) → output
    for mode, pdl, nk in _variants(fmt):
        name = _name(fmt, mode, pdl, nk)
        for i, (m, n, k, gops, ref) in enumerate(cases):
            at = f"M={m} N={n} K={k}"
            try:
                gops["out"].fill_(float("nan"))
                y = _launch(gops, fmt, m, mode, pdl, nk).clone()
                torch.cuda.synchronize()
                if not torch.isfinite(y).all():
                    fail(name, f"{at}: {(~torch.isfinite(y)).sum().item()} unwritten (NaN) outputs")
                    break
                err = float((y.double().cpu() - ref).norm() / ref.norm())
                res[name]["err"] = max(res[name]["err"], err)
                if err >= 1e-2:
                    fail(name, f"{at}: rel err {err:.2e}")
                gops["out"].fill_(float("nan"))
                if not torch.equal(_launch(gops, fmt, m, mode, pdl, nk), y):
                    fail(name, f"{at}: not bit-identical over repeats")
                outs[(mode, pdl, nk, i)] = y
                base = outs.get(("tile", False, False, i))
                if fmt == "int4_2l" and base is not None and not torch.equal(y, base):
                    # expected equal (int32 partial sums): a note only, the reference check above is the gate
                    res[name]["notes"].append(f"{at}: bits differ from the tile kernel's (max |Δ| "
                                              f"{float((y.float() - base.float()).abs().max()):.2e})")
                if pdl and (mode, False, nk, i) in outs and not torch.equal(y, outs[(mode, False, nk, i)]):
                    fail(name, f"{at}: PDL bits differ from the non-PDL launch")
            except Exception as exc:
                traceback.print_exc()
                fail(name, f"{at}: {type(exc).__name__}: {exc}"[:300])
                break
        if not _tickets_zero():
            fail(name, "tickets not back at zero")
        print(f"{name}: max rel err {res[name]['err']:.2e} {'ok' if res[name]['ok'] else 'FAIL'}", flush=True)
        report(name)
    # a graph of [producer → stream-K + PDL GEMM] × 2 operand sets, replayed
    name = _name(fmt, "stream", True, False)
    try:
        pairs = [_producer_pair(kind, fmt, *_operands(fmt, 16, N, K, seed=s))
                 for s, kind in enumerate(("plain", "trigger"))]
        want = [_produce_and_launch(prod, gops, fmt, 16, "stream", False).clone() for prod, gops in pairs]

        def body():
            for prod, gops in pairs:
                _produce_and_launch(prod, gops, fmt, 16, "stream", True)
        from lowrank_gemm.bench.common import capture_graph
        _, g, _ = capture_graph(body)
        for _ in range(2):
            for _, gops in pairs:
                gops["out"].fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            if not all(torch.equal(gops["out"], w) for (_, gops), w in zip(pairs, want)):
                fail(name, "graph [producer → PDL GEMM] replay differs from eager")
                break
        if not _tickets_zero():
            fail(name, "tickets not back at zero after graph replays")
    except Exception as exc:
        traceback.print_exc()
        fail(name, f"graph: {type(exc).__name__}: {exc}"[:300])
    report(name)
    return res


def check(fmts: list[str]) -> dict:
    variants = {}
    for fmt in fmts:
        try:
            variants.update(_check_format(fmt))
        except Exception as exc:
            traceback.print_exc()
            variants.update({_name(fmt, *v): dict(ok=False, err=None, notes=[f"{type(exc).__name__}: {exc}"[:300]])
                             for v in _variants(fmt)})
    passed = [k for k, v in variants.items() if v["ok"]]
    return dict(ok=len(passed) == len(variants), passed=passed, variants=variants)


# -------------------------------------------------------------------------------------------------------- time
def time_all(ms: list[int], fmts: list[str], passed: set, deadline: float, rows: list, flush) -> None:
    import torch
    from lowrank_gemm.bench.common import time_impl
    from lowrank_gemm.bench.w4a4 import _providers
    from lowrank_gemm.kernels.gluon.w4a4_decode import SPLIT_ENV
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    dev = torch.device("cuda")

    def rec(m, impl, fn, sets, **extra):
        row = dict(M=m, N=N, K=K, r=R, impl=impl, **extra)
        if time.time() > deadline:
            row["error"] = "skipped: time budget"
        else:
            try:
                row.update(time_impl(fn, sets))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                traceback.print_exc(limit=2)
        rows.append(row)
        print(f"M={m:3d} {impl:44s} graph {row.get('graph_us')} µs {row.get('error', '')}", flush=True)
        flush()
        return row.get("graph_us")

    for m in ms:
        prov = _providers(m, N, K, dev, impls=("decode", ))
        for name in ("cublas_bf16", "fp8_scaled_mm"):
            fn, make, _ = prov[name]
            rec(m, name, fn, [make() for _ in range(2)])
        for fmt in fmts:
            opsets = [_operands(fmt, m, N, K, seed=s) for s in range(2)]    # (GEMM operands, packed operands)
            sets = [o for o, _ in opsets]
            if fmt != "int4_2l":
                rec(m, f"expand_act_f8:{fmt}", lambda o: expand_act_f8(o["x_q"], o["x_scale"], 64),
                    [(p, ) for _, p in opsets])
            gemm = {}
            for mode, pdl, nk in _variants(fmt):
                name = _name(fmt, mode, pdl, nk)
                if pdl or name not in passed:
                    continue
                gemm[(mode, nk)] = rec(m, f"gemm:{name}", lambda o, mode=mode, nk=nk: _launch(o, fmt, m, mode, False, nk),
                                       [(s, ) for s in sets])
            base = gemm.get(("tile", False))
            for r in rows:
                if r["M"] == m and r["impl"].startswith(f"gemm:{fmt}:") and base and r.get("graph_us"):
                    r["vs_tile"] = round(r["graph_us"] / base, 3)
            # (the +rb modes have their own layer rows: the SPLIT env takes no row_box)
            timed = {k: v for k, v in gemm.items() if v and not k[1] and not k[0].endswith("+rb")}
            best = min(timed, key=timed.get)[0] if timed else "tile"    # the fastest way to deal the work
            # PDL: [producer → GEMM] graphs, off vs on
            for mode in ["tile"] + ([best] if best != "tile" else []):
                if _name(fmt, mode, True, False) not in passed:
                    continue
                for kind in ("plain", "trigger"):
                    pairs = [_producer_pair(kind, fmt, *o) for o in opsets]
                    for pdl in (False, True):
                        rec(m, f"pdl:{fmt}:{mode}:{kind}:{'on' if pdl else 'off'}",
                            lambda prod, gops, mode=mode, pdl=pdl: _produce_and_launch(prod, gops, fmt, m, mode, pdl),
                            pairs)
                    del pairs
            del opsets, sets
            torch.cuda.empty_cache()
            # the whole layer through the op: today, the fastest GEMM mode, + PDL (+ nonempty_k for 2l)
            fn, make, _ = prov[f"w4a4_layer:{fmt}:decode"]
            lsets = [make() for _ in range(2)]
            rec(m, f"layer:{fmt}:today", fn, lsets)
            split = None if best == "tile" else (best if best.startswith("stream") else best[5:])
            nk = "1" if fmt == "int4_2l" and ("tile", True) in gemm else None
            if best != "tile":
                with scoped_env(**{SPLIT_ENV: split}):
                    rec(m, f"layer:{fmt}:{best}", fn, lsets)
            with scoped_env(**{SPLIT_ENV: split, "LOWRANK_GEMM_PDL": "1", "LOWRANK_GEMM_DECODE_NONEMPTY_K": nk}):
                rec(m, f"layer:{fmt}:{best}:pdl" + (":nk" if nk else ""), fn, lsets)
            # the row box (+ nonempty_k for 2l, its default now), without and with PDL
            if _name(fmt, "tile+rb", False, fmt == "int4_2l") in passed:
                for pdl in ("0", "1"):
                    with scoped_env(**{"LOWRANK_GEMM_DECODE_ROW_BOX": "1", "LOWRANK_GEMM_PDL": pdl,
                                 "LOWRANK_GEMM_DECODE_NONEMPTY_K": "1" if fmt == "int4_2l" else None}):
                        rec(m, f"layer:{fmt}:tile+rb" + (":pdl" if pdl == "1" else ""), fn, lsets)
            del lsets
            torch.cuda.empty_cache()


def _markdown(data: dict) -> str:
    chk = data["check"]
    lines = [f"# probe_decode_split ({data.get('wall_s')} s)\n",
             f"check: **{chk.get('status')}** — passed {len(chk.get('passed', []))} of {len(chk.get('variants', {}))}"]
    for name, v in chk.get("variants", {}).items():
        if v.get("notes"):
            lines.append(f"- {'note' if v.get('ok') else 'FAIL'} `{name}` (max rel err {v.get('err')}): "
                         f"{'; '.join(v['notes'])[:400]}")
    lines += ["", "| M | impl | graph µs | eager µs | ÷ tile GEMM | ÷ cuBLAS bf16 | note |", "|---|---|---|---|---|---|---|"]
    bf16 = {r["M"]: r.get("graph_us") for r in data["rows"] if r["impl"] == "cublas_bf16"}
    for r in data["rows"]:
        g = r.get("graph_us")
        ratio = round(g / bf16[r["M"]], 3) if g and bf16.get(r["M"]) else ""
        lines.append(f"| {r['M']} | {r['impl']} | {g} | {r.get('median_us')} | {r.get('vs_tile', '')} | {ratio} | "
                     f"{r.get('error', '')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ms", default="1,16,64")
    ap.add_argument("--fmts", default="int4_2l,int4_g64")
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for each format's correctness child")
    ap.add_argument("--budget", type=float, default=140.0, help="seconds for the timing phase (rows after it: skipped)")
    args = ap.parse_args()
    fmts = [f for f in args.fmts.split(",") if f]
    if args.child == "check":
        try:
            res = check(fmts)
        except Exception as exc:
            traceback.print_exc()
            res = dict(ok=False, passed=[], variants={}, note=f"{type(exc).__name__}: {exc}"[:500])
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    res = dict(passed=[], variants={}, formats={})
    for fmt in fmts:   # one child per format: a hang in one leaves the other's variants checked
        st, log, r, done = run_child([sys.executable, __file__, "--child", "check", "--fmts", fmt], env, args.timeout,
                                     row_prefix="VARIANT ")
        st = st or ("PASS" if r.get("ok") else "FAIL" if r.get("variants") else "ERROR")
        print(log[-3000:])
        variants = {_name(fmt, *v): dict(ok=False, err=None, notes=[f"not finished ({st})"]) for v in _variants(fmt)}
        for line in done:            # every variant the child finished (also before a hang)
            variants.update(line)
        variants.update(r.get("variants") or {})
        res["formats"][fmt] = st
        res["variants"].update(variants)
        res["passed"] += [k for k, v in variants.items() if v["ok"]]
        print(f"[check {fmt}] {st}: passed {[k for k, v in variants.items() if v['ok']]}", flush=True)
    status = "PASS" if all(v == "PASS" for v in res["formats"].values()) else \
        "HANG" if "HANG" in res["formats"].values() else "FAIL"
    data = {"check": dict(status=status, **res), "rows": [], "fmts": fmts}

    def flush():
        data["wall_s"] = round(time.time() - t0, 1)
        (out / "probe_decode_split.json").write_text(json.dumps(data, indent=1))
        (out / "probe_decode_split.md").write_text(_markdown(data))

    flush()
    if res["passed"] and not args.no_time:   # (a hung format's variants are not in passed)
        from lowrank_gemm.bench.common import device_meta, measure_copy_tbps
        data["meta"] = device_meta(measure_copy_tbps(2**30))
        try:
            time_all([int(m) for m in args.ms.split(",")], fmts, set(res["passed"]), time.time() + args.budget,
                     data["rows"], flush)
        except Exception as exc:
            traceback.print_exc()
            data["time_error"] = f"{type(exc).__name__}: {exc}"[:500]
    flush()
    return 0 if status == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
