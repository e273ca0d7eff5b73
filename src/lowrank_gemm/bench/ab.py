"""A/B: plain-Triton v1 vs warp-specialized Gluon v2, with the cuBLAS baselines in the same process.

    python -m lowrank_gemm.bench.ab [--quick] [--out DIR] [--suite w4a4|lora|all]

Writes ``ab.json`` (shared schema; ``impl`` ∈ {v1, v2, cublas_bf16, fp8_scaled_mm, unfused_bf16},
``suite`` ∈ {w4a4, lora}, ``format`` for W4A4 rows) plus ``ab.md`` and ``ab.png``. Every implementation
runs on the same inputs; a failing one is recorded with its error instead of ending the run.
"""

import argparse
import traceback

import torch

from .common import device_meta, markdown_table, measure_copy_tbps, meta_header, rotation_count, time_impl, write_results

FLUX = [(3072, 12288), (12288, 3072), (3072, 3072), (3072, 9216)]   # (K, N) at M = 4608
DECODE_M = [1, 16, 64]


def _w4a4_shapes(quick):
    if quick:
        return [(4608, 3072, 12288), (16, 4096, 28672)]
    return [(4608, k, n) for k, n in FLUX] + [(m, 4096, 28672) for m in DECODE_M]


def _lora_shapes(quick):
    """(M, K, N, r): the LoRA v2 probe's shapes (scripts/probe_lora_v2.py)."""
    if quick:
        return [(64, 4096, 28672, 16), (4096, 4096, 4096, 64)]
    return [(64, 4096, 28672, 16), (256, 4096, 28672, 16), (1024, 4096, 28672, 16), (4096, 8192, 8192, 16),
            (256, 4096, 4096, 16), (4096, 4096, 4096, 64)]


def _row(suite, impl, M, N, K, r, dtype, fn, sets, flops, **extra):
    row = dict(suite=suite, impl=impl, M=M, N=N, K=K, r=r, dtype=dtype, **extra)
    try:
        row.update(time_impl(fn, sets))
        t = row.get("graph_us") or row["median_us"]
        row["tops"] = round(flops / (t * 1e-6) / 1e12, 1)
    except Exception as exc:   # recorded, not hidden: the table shows which impl failed and why
        row.update(median_us=None, graph_us=None, error=f"{type(exc).__name__}: {exc}"[:300])
        traceback.print_exc()
    print({k: v for k, v in row.items() if k not in ("p20_us", "p80_us", "graph_p20_us", "graph_p80_us")},
          flush=True)
    return row


def bench_w4a4(quick, rank=32):
    from ..kernels.gluon.w4a4_ws import launch_w4a4_v2, make_operands_v2, two_level_enabled
    try:
        from ..kernels.w4a4_gemm import launch_w4a4_v1
    except ImportError as err:
        launch_w4a4_v1 = None
        print(f"v1 W4A4 rows skipped: {err}")
    rows = []
    for M, K, N in _w4a4_shapes(quick):
        flops = 2 * M * N * K
        per_set = M * K + N * K // 2 + M * N * 2
        n_sets = min(rotation_count(per_set), 2 if quick else 4)
        for fmt in ("int4_g64", "int4_2l"):
            sets = [make_operands_v2(fmt, M, N, K, rank, 64, device="cuda", seed=i) for i in range(n_sets)]
            keys = ["x_q", "x_scale", "w_q", "w_scale", "w_mul", "lowrank_act", "lora_up", "bias", "out", "fmt",
                    "group_size"]
            args = [tuple(o[k] for k in keys) for o in sets]
            if fmt == "int4_g64" or two_level_enabled():   # the launcher refuses 2l otherwise
                rows.append(_row("w4a4", "v2", M, N, K, rank, "bf16", launch_w4a4_v2, args, flops, format=fmt))
            if launch_w4a4_v1 is not None:
                rows.append(_row("w4a4", "v1", M, N, K, rank, "bf16", launch_w4a4_v1, args, flops, format=fmt))
            del sets, args
        # baselines: same M, N, K (no low-rank branch)
        xs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(n_sets)]
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        rows.append(_row("w4a4", "cublas_bf16", M, N, K, 0, "bf16", lambda x: x @ w.T, [(x, ) for x in xs], flops))
        x8 = [x.to(torch.float8_e4m3fn) for x in xs]
        w8 = w.to(torch.float8_e4m3fn)
        sa = torch.ones(M, 1, device="cuda")
        sb = torch.ones(1, N, device="cuda")
        rows.append(_row("w4a4", "fp8_scaled_mm", M, N, K, 0, "fp8", lambda x: torch._scaled_mm(
            x, w8.T, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), [(x, ) for x in x8], flops))
        del xs, x8, w, w8
        torch.cuda.empty_cache()
    return rows


def bench_lora(quick):
    """v1 (``lora_linear(strategy="auto")``) vs v2 (``kernels/gluon/lora_ws.launch_lora_v2``, shrink chosen by
    ``shrink_mode``: env LOWRANK_GEMM_LORA_V2_SHRINK pins it) + cuBLAS baselines, in this process. v2 runs
    in-process here ONLY because scripts/probe_lora_v2.py proved it on the GPU first (child processes with
    timeouts): run the probe before this suite after any change to lora_ws.py."""
    rows = []
    try:
        from ..kernels.lora_gemm import lora_linear
    except ImportError as err:
        lora_linear = None
        print(f"v1 LoRA rows skipped: {err}")
    try:
        from ..kernels.gluon.lora_ws import launch_lora_v2, shrink_mode
    except ImportError as err:
        launch_lora_v2 = None
        print(f"v2 LoRA rows skipped: {err}")
    scale = 0.5
    for M, K, N, rank in _lora_shapes(quick):
        flops = 2 * M * N * K + 2 * M * rank * (K + N)
        n_sets = min(rotation_count(2 * (M * K + N * K)), 2 if quick else 3)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02
        a = torch.randn(rank, K, device="cuda", dtype=torch.bfloat16) * 0.02
        b = torch.randn(N, rank, device="cuda", dtype=torch.bfloat16) * 0.02
        xs = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), ) for _ in range(n_sets)]
        rows.append(_row("lora", "cublas_bf16", M, N, K, 0, "bf16", lambda x: x @ w.T, xs, flops))
        rows.append(_row("lora", "unfused_bf16", M, N, K, rank, "bf16",
                         lambda x: torch.addmm(x @ w.T, x @ a.T, b.T, alpha=scale), xs, flops))
        if lora_linear is not None:
            rows.append(_row("lora", "v1", M, N, K, rank, "bf16", lambda x: lora_linear(x, w, a, b, scale), xs, flops))
        if launch_lora_v2 is not None:
            rows.append(_row("lora", "v2", M, N, K, rank, "bf16", lambda x: launch_lora_v2(x, w, a, b, scale), xs, flops,
                             format=f"shrink={shrink_mode(M)}"))
        del w, a, b, xs
        torch.cuda.empty_cache()
    return rows


def _ratios(rows):
    """vs_fp8 / vs_bf16: graph time over the same shape's baseline (lower is better)."""
    base = {}
    for r in rows:
        if r["impl"] in ("fp8_scaled_mm", "cublas_bf16") and r.get("graph_us"):
            base[(r["suite"], r["impl"], r["M"], r["N"], r["K"])] = r["graph_us"]
    for r in rows:
        t = r.get("graph_us")
        for impl, key in (("fp8_scaled_mm", "vs_fp8"), ("cublas_bf16", "vs_bf16")):
            b = base.get((r["suite"], impl, r["M"], r["N"], r["K"]))
            r[key] = round(t / b, 3) if t and b else None
    return rows


def _markdown(meta, rows):
    head = ["suite", "impl", "format", "M", "N", "K", "r", "median_us", "graph_us", "tops", "vs_fp8", "vs_bf16",
            "error"]
    return ("# v1 vs v2 (A/B)\n\n" + meta_header(meta) +
            markdown_table(head, [[r.get(h) for h in head] for r in rows]))


def _plot(data, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in data["rows"] if r.get("graph_us")]
    suites = sorted({r["suite"] for r in rows})
    fig, axes = plt.subplots(1, max(1, len(suites)), figsize=(7 * max(1, len(suites)), 4.5), squeeze=False)
    for ax, suite in zip(axes[0], suites):
        sr = [r for r in rows if r["suite"] == suite]
        shapes = sorted({(r["M"], r["N"], r["K"]) for r in sr})
        impls = sorted({(r["impl"], r.get("format")) for r in sr}, key=str)
        width = 0.8 / max(1, len(impls))
        for i, (impl, fmt) in enumerate(impls):
            ys = [next((r["graph_us"] for r in sr if (r["M"], r["N"], r["K"]) == s and r["impl"] == impl
                        and r.get("format") == fmt), 0) for s in shapes]
            ax.bar([j + i * width for j in range(len(shapes))], ys, width, label=f"{impl} {fmt or ''}".strip())
        ax.set_xticks([j + 0.4 for j in range(len(shapes))])
        ax.set_xticklabels([f"{m}×{n}×{k}" for m, n, k in shapes], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("CUDA-graph µs (lower is better)")
        ax.set_title(suite)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None, help="default benchmarks/results/<gpu> (bench.common.results_dir)")
    ap.add_argument("--suite", default="all", choices=["all", "w4a4", "lora"])
    args = ap.parse_args(argv)
    meta = device_meta(measure_copy_tbps())
    rows = []
    if args.suite in ("all", "w4a4"):
        rows += bench_w4a4(args.quick)
    if args.suite in ("all", "lora"):
        rows += bench_lora(args.quick)
    rows = _ratios(rows)
    path = write_results("ab", meta, rows, args.out, md=_markdown(meta, rows), plot=_plot)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
