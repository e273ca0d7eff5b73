"""GPU probe of the LoRA v2 kernel (kernels/gluon/lora_ws.py): correctness rungs, then timings.

    PYTHONPATH=src python scripts/probe_lora_v2.py --out DIR [--budget 150] [--timeout 25] [--rungs c1,c2] [--no-time]

Every rung runs in its own process group under a timeout (a hung warp-specialized kernel never returns to
Python; the parent kills the group), as in scripts/bisect_gluon.py. Each correctness rung launches both
shrink modes ("fused", "pre") into NaN-poisoned outputs and compares with the float64 reference
(normalized max error < 1e-2):

  c1  1 tile, K shorter than the ring (M=17 N=40 K=64), grid 1
  c2  1 tile, long K (K=4096: 64 K steps ≫ STAGES), grid 1
  c3  3 tiles on 1 program: both consumers + ConsumerOrder hand-off; DEBUG (index, phase) trace vs host model
  c4  ragged M/N/K + bias, r=16 and r=5 (B padded to r8, masked store N % 8 ≠ 0), grid 3
  c5  2·grid+1 tiles (grid 2), TMA-store epilogue
  time  only if c1–c5 all pass: per shape (M, K, N, r) v2 fused, v2 pre, v1 lora_linear(strategy="auto"),
        cuBLAS x@Wᵀ (no LoRA) — same process, same input sets, bench.common.time_impl (eager + CUDA-graph
        medians); every impl's error vs float64 on sampled rows is checked before it is timed; a failing
        impl is recorded and the others go on. Rows print as they finish (kept if the child times out).

Writes DIR/probe_lora_v2.json (shared schema rows: suite "lora_v2", impl, M, N, K, r, graph_us, …) and .md.
Pin the winner without code changes: env LOWRANK_GEMM_LORA_V2_SHRINK=fused|pre (or launch_lora_v2(shrink=…)).
"""

import json
import os
import sys
import time
from pathlib import Path

from _childproc import ladder_parser, run_child   # scripts/_childproc.py (this script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

TOL = 1e-2
RUNGS = {
    "c1": ("1 tile short K", dict(cases=[dict(M=17, N=40, K=64, rank=16, grid=1)])),
    "c2": ("1 tile long K", dict(cases=[dict(M=100, N=124, K=4096, rank=16, grid=1)])),
    "c3": ("3 tiles, 2 consumers + trace", dict(cases=[dict(M=3 * 128 - 5, N=124, K=1024, rank=16, grid=1)],
                                                trace=True)),
    "c4": ("ragged + bias, r=16 / r=5", dict(cases=[dict(M=250, N=300, K=1000, rank=16, grid=3),
                                                    dict(M=61, N=1003, K=777, rank=5, grid=3)])),
    "c5": ("2*grid+1 tiles, TMA store", dict(cases=[dict(M=5 * 128 - 7, N=120, K=640, rank=16, grid=2)])),
    "time": ("timings v2 vs v1 vs cuBLAS", {}),
}
SHAPES = [(64, 4096, 28672, 16), (256, 4096, 28672, 16), (1024, 4096, 28672, 16), (4096, 8192, 8192, 16),
          (256, 4096, 4096, 16), (4096, 4096, 4096, 64)]   # (M, K, N, r)
SCALE = 0.5


# =============================================================================================
def _trace(ops, shrink, grid):
    import torch

    from lowrank_gemm.kernels.gluon import lora_ws as L
    from lowrank_gemm.kernels.gluon import skeleton as sk
    ops = dict(ops, out=torch.full_like(ops["out"], float("nan")))
    _, dbg = L.launch_lora_v2(**ops, shrink=shrink, grid=grid, debug=True)
    torch.cuda.synchronize()
    M, K = ops["x"].shape
    N = ops["weight"].shape[0]
    g, _, cx, cfg, _, _ = L.kernel_args_v2(**dict(ops, out=None), shrink=shrink, grid=grid)
    want = sk.expected_role_states(g, M, N, K, cfg, {"loader": cx["STAGES"]}, cx["STAGES"])
    dbg = dbg.cpu()
    ok, lines = True, []
    for name, seq in want.items():
        seq = seq[:L.DEBUG_ITERS_DEFAULT]
        got = [tuple(v) for v in dbg[0, L.LORA_ROLE_IDS[name], :len(seq)].tolist()]
        ok &= got == seq
        lines.append(f"{shrink} {name:9s} {'ok ' if got == seq else 'BAD'} n={len(seq)} first {got[:6]}"
                     + ("" if got == seq else f" want {seq[:6]}"))
    return ok, lines


def _run_rung(cases, trace=False):
    import torch

    from lowrank_gemm.kernels.gluon import lora_ws as L
    from lowrank_gemm.kernels.gluon.smoke import normalized_error
    worst, ok, notes, lines = 0.0, True, [], []
    for c in cases:
        c = dict(c)
        grid = c.pop("grid")
        for shrink in ("fused", "pre"):
            ops = L.make_operands_v2(**c, device="cuda", scale=SCALE)
            g, _, cx, cfg, _, _ = L.kernel_args_v2(**dict(ops, out=None), shrink=shrink, grid=grid)
            print(f"  {shrink} {c} grid={g} {cfg} STAGES={cx['STAGES']} EPI_TMA={cx['EPI_TMA']}", flush=True)
            out = L.launch_lora_v2(**ops, shrink=shrink, grid=grid)
            torch.cuda.synchronize()
            err = normalized_error(out, L.reference_v2(ops))
            print(f"    err {err:.3e}", flush=True)
            worst = max(worst, err)
            ok &= err < TOL
            notes.append(f"{shrink} {c['M']}x{c['N']}x{c['K']} r{c['rank']}: {err:.2e}")
            if trace and err < TOL:
                tok, tl = _trace(ops, shrink, grid)
                ok &= tok
                lines += tl
    return dict(ok=ok, err=worst, note="; ".join(notes), trace=lines or None)


def _sampled_error(y, x, w, a, b, bias, scale, rows):
    """Normalized max error of rows ``rows`` of y against float64 (the full reference at M=4096, K=N=8192
    would take minutes on the host CPU)."""
    import torch

    from lowrank_gemm.reference import lora_linear_ref
    ref = lora_linear_ref(x[rows].cpu(), w.cpu(), a.cpu(), b.cpu(), scale, None if bias is None else bias.cpu())
    got = y[rows].detach().cpu().double()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def _run_time(shapes):
    import torch

    from lowrank_gemm.bench.common import time_impl
    from lowrank_gemm.bench.lora import make_sets
    from lowrank_gemm.kernels.gluon import lora_ws as L
    from lowrank_gemm.kernels.lora_gemm import lora_linear
    rows = []
    for M, K, N, r in shapes:
        sets = make_sets(M, N, K, r, torch.bfloat16, "cuda")[:3]
        args = [s[:4] for s in sets]
        impls = {
            "v2_fused": lambda x, w, a, b: L.launch_lora_v2(x, w, a, b, SCALE, shrink="fused"),
            "v2_pre": lambda x, w, a, b: L.launch_lora_v2(x, w, a, b, SCALE, shrink="pre"),
            "v1_auto": lambda x, w, a, b: lora_linear(x, w, a, b, SCALE, strategy="auto"),
            "cublas_base": lambda x, w, a, b: x @ w.T,
        }
        rows_idx = sorted({0, 1, M // 3, M // 2, M - 2, M - 1})
        flops = 2 * M * N * K + 2 * M * r * (K + N)
        for name, fn in impls.items():
            row = dict(suite="lora_v2", impl=name, M=M, N=N, K=K, r=r, dtype="bf16")
            try:
                if name != "cublas_base":
                    x, w, a, b = args[0]
                    y = fn(x, w, a, b)
                    torch.cuda.synchronize()
                    row["rel_err"] = _sampled_error(y, x, w, a, b, None, SCALE, rows_idx)
                    if not row["rel_err"] < TOL:
                        raise RuntimeError(f"wrong result: sampled normalized error {row['rel_err']:.3e}")
                row.update(time_impl(fn, args))
                t = row.get("graph_us") or row["median_us"]
                row["tflops"] = round(flops / (t * 1e-6) / 1e12, 1)
            except Exception as exc:   # recorded; the other impls go on
                row.update(graph_us=None, error=f"{type(exc).__name__}: {exc}"[:300])
            print("ROW " + json.dumps(row), flush=True)
            rows.append(row)
        del sets, args
        torch.cuda.empty_cache()
    return dict(ok=True, err=0.0, note="timings", rows=rows)


def child(name, shapes) -> int:
    try:
        res = _run_time(shapes) if name == "time" else _run_rung(**RUNGS[name][1])
    except Exception as exc:
        import traceback
        traceback.print_exc()
        res = dict(ok=False, err=None, note=f"{type(exc).__name__}: {str(exc)[-600:]}")
    print("RESULT " + json.dumps(res), flush=True)
    return 0


# =============================================================================================
def _markdown(results, rows):
    from lowrank_gemm.bench.common import markdown_table
    md = "# LoRA v2 probe\n\n## Correctness rungs\n\n" + markdown_table(
        ["rung", "what", "status", "err", "s", "note"],
        [[r["rung"], r["desc"], r["status"], r.get("err"), r.get("wall_s"), r.get("note", "")[:160]] for r in results])
    base = {(r["M"], r["N"], r["K"]): r.get("graph_us") for r in rows if r["impl"] == "cublas_base"}
    v1 = {(r["M"], r["N"], r["K"]): r.get("graph_us") for r in rows if r["impl"] == "v1_auto"}
    table = []
    for r in rows:
        key, t = (r["M"], r["N"], r["K"]), r.get("graph_us")
        table.append([r["M"], r["K"], r["N"], r["r"], r["impl"], t, r.get("median_us"),
                      round(t / base[key], 3) if t and base.get(key) else None,
                      round(t / v1[key], 3) if t and v1.get(key) else None, r.get("rel_err"), r.get("error")])
    md += "\n\n## Timings (CUDA-graph medians, µs)\n\n" + markdown_table(
        ["M", "K", "N", "r", "impl", "graph µs", "eager µs", "× cuBLAS", "× v1", "rel err", "error"], table)
    return md


def parent(args) -> int:
    names = args.rungs.split(",") if args.rungs else [n for n in RUNGS if not (n == "time" and args.no_time)]
    t0 = time.monotonic()
    results, rows = [], []
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}", PYTHONUNBUFFERED="1")
    for name in names:
        desc = RUNGS[name][0]
        if name == "time" and not all(r["status"] == "PASS" for r in results):
            results.append(dict(rung=name, desc=desc, status="SKIPPED", note="a correctness rung did not pass"))
            continue
        left = args.budget - (time.monotonic() - t0)
        limit = left - 3 if name == "time" else min(args.timeout, left)
        if limit < 5:
            results.append(dict(rung=name, desc=desc, status="SKIPPED", note="budget spent"))
            continue
        print(f"[{name}] {desc} (timeout {limit:.0f}s)", flush=True)
        start = time.monotonic()
        cmd = [sys.executable, __file__, "--child", name, "--shapes", args.shapes]
        status, out, res, child_rows = run_child(cmd, env, limit, row_prefix="ROW " if name == "time" else None)
        rows += child_rows
        if status == "HANG" and name == "time":
            status = "TIMEOUT"
        if status is None:
            status = "PASS" if res.get("ok") else "FAIL"
        row = dict(rung=name, desc=desc, status=status, wall_s=round(time.monotonic() - start, 1), err=res.get("err"),
                   note=res.get("note", ""), trace=res.get("trace"),
                   log_tail=(out or "")[-2000:] if status != "PASS" else None)
        results.append(row)
        err = f"{row['err']:.3e}" if isinstance(row["err"], float) else "-"
        print(f"[{name}] {status} err={err} {row['wall_s']}s {row['note'][:200]}", flush=True)
        for line in row["trace"] or []:
            print(f"    {line}", flush=True)
        if status != "PASS" and row["log_tail"]:
            print("    " + "\n    ".join(row["log_tail"].strip().splitlines()[-15:]), flush=True)
    for r in rows:
        print(f"  {r['impl']:12s} M={r['M']:5d} K={r['K']:5d} N={r['N']:5d} r={r['r']:2d} graph {r.get('graph_us')} "
              f"eager {r.get('median_us')} err {r.get('rel_err')} {r.get('error') or ''}")
    print(f"total {time.monotonic() - t0:.0f}s")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {}
        try:
            from lowrank_gemm.bench.common import device_meta
            meta = device_meta()
        except Exception as exc:   # the JSON still gets written
            meta = dict(error=str(exc)[:200])
        (out / "probe_lora_v2.json").write_text(json.dumps(dict(meta=meta, rungs=results, rows=rows), indent=1))
        (out / "probe_lora_v2.md").write_text(_markdown(results, rows))
    return 0 if all(r["status"] in ("PASS", "SKIPPED") for r in results) else 1


def main(argv=None) -> int:
    ap = ladder_parser(__doc__, 25.0, "c1,c2,time")
    ap.add_argument("--shapes", default=";".join(",".join(map(str, s)) for s in SHAPES),
                    help="timing shapes 'M,K,N,r;…'")
    args = ap.parse_args(argv)
    if args.child:
        shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";") if s]
        return child(args.child, shapes)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
