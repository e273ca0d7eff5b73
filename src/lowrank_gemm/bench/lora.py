"""Benchmark (and tuner) of the single-adapter LoRA GEMM on the GPU.

    python -m lowrank_gemm.bench.lora [--quick] [--out DIR]        # table + lora.json/.md/.png
    python -m lowrank_gemm.bench.lora --tune [--quick] --out DIR   # sweep → DIR/lora_<gpu>.json

(``--tune`` sweeps issue 2's grid for the shipped tables; a user's own shapes: ``python -m lowrank_gemm tune lora``,
:mod:`lowrank_gemm.plan.autotune`, which shares the sweep.)

One process times, on the same inputs: cuBLAS base GEMM without LoRA (``x @ W.T``), torch
unfused LoRA (``addmm(x@W.T, x@A.T, (scale·B).T)``), every plausible strategy of
``lora_linear`` and ``auto``, eager and as CUDA-graph replays (``bench.common.time_impl``).
Inputs rotate so that one pass over them is ≥ 3× the L2 (``rotation_count``).
Bytes for the bandwidth column: W + X + Y + A + B (bf16), once each. ``auto`` / ``auto_packed`` rows also carry
``ratio_paired``: their graph replay and cuBLAS's timed in three alternating rounds (``bench.common.paired_ratio``),
the ratio the targets are best read from where the clock drifts over the run.

``merged`` / ``concat`` rows are the steady state: their derived weights (W + scale·B·A, [W; A])
come from an LRU cache (16 entries, ≤ 2 GiB: ``LOWRANK_GEMM_WEIGHT_CACHE_MB``) that holds the
whole rotation, so the one-off merge is not in the time (with the earlier one-entry cache every
call re-merged: 210 µs at K=N=4096).

``--fp8`` adds four rows on fp8 copies of the same weights (e4m3, a float32 scale per output channel): ``auto_fp8w``,
our op with the fp8 base weight (W read as 1 byte and widened on chip; the branch and x stay bf16; its error column
is against the fp8 weight's own float64 result), ``auto_w8a8`` (the same with ``fp8_activations``: x quantized per
token inside the call, fp8 × fp8 base product, the branch on the bf16 x), ``auto_w8a8x2`` (x in two e4m3 terms,
``fp8_activations=2``) and ``fp8_scaled_mm``, cuBLAS's fp8 GEMM
(``torch._scaled_mm``, x quantized outside the timing, no branch) as the fp8 reference point.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from ..kernels.lora_gemm import kcat_preferred
from ..kernels.lora_kcat import pack_lora_weights
from ..plan.autotune import SCALE, Candidate, check_candidate, reference_rows, sweep_candidates
from ..plan.planner import LORA_STRATEGIES, pinned, plan_lora, tuned_key
from .common import (device_meta, markdown_table, measure_copy_tbps, meta_header,
                     paired_ratio, parse_shapes, results_dir, rotation_count, time_graph, time_impl,
                     write_results)

SHAPES_KN = [(4096, 28672), (4096, 4096), (8192, 8192)]
RANKS = [8, 16, 64]
MS = [1, 16, 64, 256, 1024, 4096]
QUICK = [  # (M, K, N, r)
    (64, 4096, 28672, 16), (256, 4096, 28672, 16), (64, 4096, 4096, 16), (1, 4096, 4096, 16),
    (1024, 4096, 4096, 64), (4096, 8192, 8192, 16)]
STRATS = [s for s in LORA_STRATEGIES if s not in ("torch", "unfused")]   # unfused: the torch_unfused row
# rows timed on the packed layout (W and B views of one buffer): kcat then needs no derived weight
PACKED_IMPLS = ("auto_packed", "kcat")
# the rows the targets are read from: also timed in alternation with cuBLAS (``ratio_paired``)
PAIRED_IMPLS = ("auto", "auto_packed")
# --fp8: on fp8 copies of each set's weight (fp8_sets)
FP8_IMPLS = ("auto_fp8w", "auto_w8a8", "auto_w8a8x2", "fp8_scaled_mm")


def plausible(strategy: str, M: int, r: int, quick: bool) -> bool:
    """Which strategies to time in the full grid (keeps it ≤ ~6 minutes); --quick times all."""
    if quick:
        return True
    if strategy in ("merged", "streams", "concat"):
        return r == 16 and (strategy != "concat" or M >= 256)   # rank-independent baselines
    if strategy == "kcat":
        return M >= 256
    if strategy.startswith("persistent"):
        return M >= 64
    if strategy == "flat":
        return M >= 1024     # a persistent grid of 128×256 tiles (session 50: measured from M = 1024)
    if strategy == "kloop":
        return r <= 64
    return True


def nbytes(M, N, K, r, elem=2):
    return elem * (N * K + M * K + M * N + r * K + N * r)


def flops(M, N, K, r):
    return 2 * M * N * K + 2 * M * r * (K + N)


def make_sets(M, N, K, r, dtype, device):
    n = rotation_count(nbytes(M, N, K, r))
    n = min(n, max(1, (8 << 30) // nbytes(M, N, K, r)))   # stay well inside GPU memory
    sets = []
    for i in range(n):
        g = torch.Generator(device=device).manual_seed(i)
        x = torch.randn(M, K, device=device, dtype=dtype, generator=g)
        w = torch.randn(N, K, device=device, dtype=dtype, generator=g) / K ** 0.5
        a = torch.randn(r, K, device=device, dtype=dtype, generator=g) / K ** 0.5
        b = torch.randn(N, r, device=device, dtype=dtype, generator=g) / r ** 0.5
        sets.append((x, w, a, b, (SCALE * b).contiguous()))
    return sets


def fp8_sets(sets):
    """Per set (x, W8, A, B, W's per-channel scale, x8, x's per-token scale): W as e4m3 scaled per output channel,
    x as e4m3 per token (only ``fp8_scaled_mm`` reads x8)."""
    from ..kernels.lora_gemm import fp8_rows
    out = []
    for x, w, a, b, _bs in sets:
        w8, ws = fp8_rows(w)
        x8, xs = fp8_rows(x)
        out.append((x, w8, a, b, ws, x8, xs[:, None].contiguous()))
    return out


def impls():
    from ..kernels.lora_gemm import lora_linear
    out = {"cublas_base": lambda x, w, a, b, bs: x @ w.T,
           "torch_unfused": lambda x, w, a, b, bs: torch.addmm(x @ w.T, x @ a.T, bs.T),
           "auto": lambda x, w, a, b, bs: lora_linear(x, w, a, b, SCALE),
           # W and B as views of one [W | B | 0] buffer (pack_lora_weights): there auto may run kcat
           "auto_packed": lambda x, w, a, b, bs: lora_linear(x, w, a, b, SCALE)}
    for s in STRATS:
        out[s] = (lambda s_: lambda x, w, a, b, bs: lora_linear(x, w, a, b, SCALE, strategy=s_))(s)
    out["auto_fp8w"] = lambda x, w8, a, b, ws, x8, xs: lora_linear(x, w8, a, b, SCALE, weight_scale=ws)
    out["auto_w8a8"] = lambda x, w8, a, b, ws, x8, xs: lora_linear(x, w8, a, b, SCALE, weight_scale=ws,
                                                                 fp8_activations=True)
    out["auto_w8a8x2"] = lambda x, w8, a, b, ws, x8, xs: lora_linear(x, w8, a, b, SCALE, weight_scale=ws,
                                                                   fp8_activations=2)
    out["fp8_scaled_mm"] = lambda x, w8, a, b, ws, x8, xs: torch._scaled_mm(
        x8, w8.t(), scale_a=xs, scale_b=ws[None, :], out_dtype=x.dtype)
    return out


def rel_err(y, x, w, a, b):
    ref = x.float() @ w.float().T + SCALE * (x.float() @ a.float().T) @ b.float().T
    return float((y.float() - ref).norm() / ref.norm())


def bench_point(M, N, K, r, dtype, copy_tbps, quick, fns):
    sets = make_sets(M, N, K, r, dtype, "cuda")
    packed = []
    if quick or M >= 256:
        for x, w, a, b, bs in sets:
            wv, bv = pack_lora_weights(w, b)
            packed.append((x, wv, a, bv, bs))
    fp8 = fp8_sets(sets) if any(name in FP8_IMPLS for name in fns) else []
    rows = []
    for name, fn in fns.items():
        if name in STRATS and not plausible(name, M, r, quick):
            continue
        if name in PACKED_IMPLS and not (quick or M >= 256):
            continue
        use = packed if name in PACKED_IMPLS else fp8 if name in FP8_IMPLS else sets
        row = {"suite": "lora", "impl": name, "M": M, "N": N, "K": K, "r": r,
               "dtype": str(dtype).replace("torch.", "")}
        try:
            if name in ("auto", "auto_packed"):
                row["plan"] = plan_lora(M, N, K, r, dtype, torch.device("cuda"))[0]
                if name == "auto_packed" and kcat_preferred(M, N, K, r, row["plan"]):
                    row["plan"] = "kcat"
            y = fn(*use[0])
            if name in ("auto_fp8w", "auto_w8a8", "auto_w8a8x2"):   # against the fp8 weight's own result
                # (auto_w8a8's also holds the e4m3 rounding of x: ~2e-2; two terms: ~2e-3)
                x, w8, a, b, ws = use[0][:5]
                row["rel_err"] = round(rel_err(y, x, (w8.float() * ws[:, None]), a, b), 6)
            elif name not in ("cublas_base", "fp8_scaled_mm"):
                row["rel_err"] = round(rel_err(y, *sets[0][:4]), 6)
            row.update(time_impl(fn, use))
            if name in PAIRED_IMPLS and row.get("graph_us"):
                try:        # the row's own timings stand whatever happens here
                    row.update(paired_ratio(fn, use, fns["cublas_base"], sets))
                except Exception as exc:
                    row["paired_error"] = f"{type(exc).__name__}: {exc}"[:200]
        except Exception as exc:  # a failing impl is a row, not a crash of the whole run
            row.update(median_us=None, graph_us=None, error=f"{type(exc).__name__}: {exc}"[:300])
        t = row.get("graph_us") or row.get("median_us")
        if t:
            row["tflops"] = round(flops(M, N, K, r) / (t * 1e-6) / 1e12, 1)
            row["bw_pct"] = round(100 * nbytes(M, N, K, r) / (t * 1e-6) / 1e12 / copy_tbps, 1)
        rows.append(row)
        print(f"  {name:>20} M={M:<5} N={N:<6} K={K:<5} r={r:<3} eager {row.get('median_us')} "
              f"graph {row.get('graph_us')} err {row.get('rel_err')} {row.get('error', '')}", flush=True)
    base = next((x for x in rows if x["impl"] == "cublas_base"), None)
    for x in rows:
        if base and base.get("graph_us") and x.get("graph_us"):
            x["ratio_cublas"] = round(x["graph_us"] / base["graph_us"], 3)
    del sets, packed, fp8
    torch.cuda.empty_cache()
    return rows


def to_markdown(meta, rows):
    hdr = ["M", "N", "K", "r", "impl", "graph µs", "eager µs", "× cuBLAS", "× cuBLAS (paired)", "% copy BW",
           "TFLOP/s", "rel err"]
    body = [[r["M"], r["N"], r["K"], r["r"], r["impl"] + (f" ({r['plan']})" if r.get("plan") else ""),
             r.get("graph_us"), r.get("median_us"), r.get("ratio_cublas"), r.get("ratio_paired"), r.get("bw_pct"),
             r.get("tflops"), r.get("rel_err")] for r in rows]
    return "# LoRA GEMM (single adapter)\n\n" + meta_header(meta) + markdown_table(hdr, body)


def plot(data, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in data["rows"] if r.get("ratio_cublas")]
    groups = sorted({(r["K"], r["N"], r["r"]) for r in rows})
    fig, axes = plt.subplots(1, max(1, len(groups)), figsize=(4 * max(1, len(groups)), 3.5), squeeze=False)
    for ax, (K, N, r) in zip(axes[0], groups):
        sub = [x for x in rows if (x["K"], x["N"], x["r"]) == (K, N, r)]
        for impl in sorted({x["impl"] for x in sub}):
            pts = sorted((x["M"], x["ratio_cublas"]) for x in sub if x["impl"] == impl)
            if len(pts) >= 1:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"K={K} N={N} r={r}", fontsize=9)
        ax.set_xlabel("M")
        ax.set_ylabel("time / cuBLAS base (graph)")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------------- tuning (the shipped tables)

def tune(quick: bool, outdir: Path | None, kn: list[tuple[int, int]] | None = None, dtype=torch.bfloat16, *,
         device="cuda", timer=None, points: list[tuple[int, int, int, int]] | None = None):
    """Check every candidate against the float64 reference (a NaN-poisoned output, ≤ ``MAX_REL_ERR``, as
    ``tune lora`` does), time the ones that pass as CUDA-graph replays, keep the fastest per tuned-table key; a
    wrong or failing candidate goes to the log with its reason and is never chosen. Merges into an existing
    OUT/lora_<gpu>.json (``h200``, ``h100``: the device's name in the results folder, :func:`~.common.results_dir`),
    so the grid can be tuned in several runs (``--kn``). ``timer(fn, sets) → µs`` replaces the graph timing;
    ``points`` ((M, N, K, r), …) replaces the grid."""
    from ..kernels.lora_gemm import lora_linear
    from ..kernels.schedule import num_sms
    timer = timer or (lambda fn, sets: time_graph(fn, sets).median_us)
    shapes = kn or SHAPES_KN
    points = points or ([(m, n, k, r) for (m, k, n, r) in QUICK] if quick else
                        [(m, n, k, r) for (k, n) in shapes for r in (16, 64) for m in MS])
    here = results_dir()
    outdir = Path(outdir) if outdir is not None else here
    out_json = outdir / f"lora_{here.name}.json"
    table = json.loads(out_json.read_text()).get("lora", {}) if out_json.exists() else {}
    log = []
    t0 = time.time()
    sms = num_sms(torch.device(device))
    for M, N, K, r in points:
        sets = make_sets(M, N, K, r, dtype, device)
        ref, rows = reference_rows(*sets[0][:4])
        best = None
        for s, cfg in sweep_candidates(M, N, K, r, sms):
            fn = (lambda s_, c_: lambda x, w, a, b, bs: _pinned_call(lora_linear, s_, c_, x, w, a, b))(s, cfg)
            entry = {"M": M, "N": N, "K": K, "r": r, "strategy": s, "config": cfg.to_dict()}
            log.append(entry)
            try:
                check_candidate(Candidate(s, s, cfg), *sets[0][:4], ref, rows, record=entry)
                us = timer(fn, sets)
            except Exception as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"[:200]
                continue
            entry["us"] = round(us, 3)
            if best is None or us < best[0]:
                best = (us, s, cfg)
        if best:
            table[tuned_key(M, N, K, r, dtype)] = {"strategy": best[1], "config": best[2].to_dict(),
                                                   "us": round(best[0], 3)}
            print(f"tuned M={M} N={N} K={K} r={r}: {best[1]} {best[2]} {best[0]:.1f} µs "
                  f"[{time.time() - t0:.0f}s]", flush=True)
        del sets, ref
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    outdir.mkdir(parents=True, exist_ok=True)
    meta = device_meta(device=device)
    out_json.write_text(json.dumps({"version": 1, "meta": meta, "lora": table}, indent=1) + "\n")
    (outdir / "lora_tune_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"wrote {out_json} ({len(table)} entries) — copy it to src/lowrank_gemm/plan/tuned/ (an H100 reads "
          f"lora_h100.json there before the H200's)")


def _pinned_call(fn, strategy, cfg, x, w, a, b):
    with pinned(strategy=strategy, config=cfg):
        return fn(x, w, a, b, SCALE)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="representative subset (≤ 3 minutes)")
    ap.add_argument("--out", type=Path, default=None, help="default benchmarks/results/<gpu> (bench.common.results_dir)")
    ap.add_argument("--tune", action="store_true", help="sweep candidates, write OUT/lora_<gpu>.json")
    ap.add_argument("--kn", default=None, help="only these K×N shapes, e.g. 4096x28672,4096x4096")
    ap.add_argument("--only", default="", help="time only these impls, e.g. cublas_base,torch_unfused,auto")
    ap.add_argument("--skip", default="", help="strategies not to time, e.g. persistent_static,persistent_dynamic")
    ap.add_argument("--ms", default=None, help=f"only these M, e.g. 256,1024 (default {','.join(map(str, MS))})")
    ap.add_argument("--ranks", default=None, help=f"only these ranks, e.g. 64 (default {','.join(map(str, RANKS))})")
    ap.add_argument("--fp8", action="store_true", help="also time the fp8 rows: " + ", ".join(FP8_IMPLS))
    ap.add_argument("--name", default="lora", help="results file stem under OUT (default lora: the canonical table; "
                                                   "e.g. lora_fp8 for a run of the fp8 rows)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    kn = parse_shapes(args.kn) if args.kn else None
    if args.tune:
        tune(args.quick, args.out, kn)
        return 0
    copy = measure_copy_tbps()
    meta = device_meta(copy)
    ms = [m for (m,) in parse_shapes(args.ms, dims=1)] if args.ms else MS
    ranks = [r for (r,) in parse_shapes(args.ranks, dims=1)] if args.ranks else RANKS
    points = QUICK if args.quick else [(m, k, n, r) for (k, n) in (kn or SHAPES_KN) for r in ranks for m in ms]
    skip = {x for x in args.skip.split(",") if x}
    only = {x for x in args.only.split(",") if x}
    fns = {k: v for k, v in impls().items() if k not in skip and (not only or k in only)
           and (args.fp8 or k not in FP8_IMPLS)}
    rows, t0 = [], time.time()
    for M, K, N, r in points:
        rows += bench_point(M, N, K, r, torch.bfloat16, copy, args.quick, fns)
        write_results(args.name, meta, rows, args.out)   # partial results survive a time limit
        print(f"[{time.time() - t0:.0f}s]", flush=True)
    path = write_results(args.name, meta, rows, args.out, md=to_markdown(meta, rows), plot=plot)
    print(to_markdown(meta, rows))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
