"""What every benchmark suite shares: timing, ceilings, result files.

Rules (README "Benchmarks"): CUDA-event timing through ``triton.testing.do_bench`` (median, with
p20/p80), warm-up, inputs rotated when one set fits in L2, every baseline in the same process,
eager and CUDA-graph-replay times side by side. Results are JSON in one schema for all suites::

    {"meta": {"device", "torch", "triton", "date", "copy_tbps", ...},
     "rows": [{"suite", "impl", "M", "N", "K", "r", "dtype", "median_us", "graph_us", ...}]}

Markdown tables and PNG plots are drawn from the stored rows only.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

__all__ = ["Timing", "capture_graph", "time_eager", "time_graph", "time_impl", "measure_copy_tbps", "device_meta",
           "rotation_count", "write_results", "load_results", "RESULTS_ROOT", "results_dir", "GRAPH_CALLS"]

RESULTS_ROOT = Path("benchmarks/results")
L2_BYTES_DEFAULT = 60 * 2**20


@dataclass(frozen=True)
class Timing:
    median_us: float
    p20_us: float
    p80_us: float


def _bench(fn: Callable[[], object], warmup_ms: int = 25, rep_ms: int = 100) -> Timing:
    import triton.testing
    q = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
    return Timing(*(1e3 * float(v) for v in q))


def rotation_count(bytes_per_set: int, l2_bytes: int | None = None) -> int:
    """How many input sets to rotate so that one pass over them is ≥ 3× the L2 (at least 1)."""
    if l2_bytes is None:
        l2_bytes = L2_BYTES_DEFAULT
        if torch.cuda.is_available():
            l2_bytes = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", l2_bytes)
    return max(1, min(64, -(-3 * l2_bytes // max(1, bytes_per_set))))


class _Rotator:
    """Calls ``fn(*inputs[i])`` with i cycling, so repeated calls do not measure the cache."""

    def __init__(self, fn, input_sets):
        self.fn, self.sets, self.i = fn, input_sets, 0

    def __call__(self):
        args = self.sets[self.i]
        self.i = (self.i + 1) % len(self.sets)
        return self.fn(*args)


def time_eager(fn, input_sets: Sequence[tuple]) -> Timing:
    return _bench(_Rotator(fn, input_sets))


def capture_graph(fn, captured=None):
    """(the result of ``fn()`` run on a side stream — compiles, autotuning and allocations stay outside the
    capture —, a CUDA graph of one ``(captured or fn)()`` call, that call's output). The benches, probes and GPU
    tests make their graphs here."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        warm = fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = (captured or fn)()
    return warm, graph, out


# Calls per captured graph, the same for every implementation: a replay has a fixed cost (the graph launch and the
# first kernel's start, ~15 µs on the H200 — session 9 found cuBLAS bf16 at K=4096, N=28672, M=1 at 70.1 µs with one
# call per graph and 62.5 with two), divided by the calls in the graph. Before session 9 the graph held one call per
# rotated input set, so an implementation with big operands (one set) carried the whole fixed cost and one with small
# operands (three or four sets) a third or a quarter — ratios between them leaned towards the small one.
GRAPH_CALLS = 8


def _rotation_graph(fn, input_sets: Sequence[tuple], calls: int | None = None):
    """(a CUDA graph of ``calls`` calls of ``fn`` cycling through the input sets — default :data:`GRAPH_CALLS`, at
    least one per set —, that number of calls)."""
    n = len(input_sets)
    calls = max(calls or GRAPH_CALLS, n)

    def run():
        for i in range(calls):
            fn(*input_sets[i % n])
    return capture_graph(run)[1], calls


def time_graph(fn, input_sets: Sequence[tuple], calls: int | None = None) -> Timing:
    """Time one call as a CUDA-graph replay (:func:`_rotation_graph`); the replay time is divided by the number of
    calls in the graph."""
    graph, calls = _rotation_graph(fn, input_sets, calls)
    t = _bench(graph.replay)
    return Timing(t.median_us / calls, t.p20_us / calls, t.p80_us / calls)


def paired_ratio(fn, input_sets: Sequence[tuple], base_fn, base_sets: Sequence[tuple], rounds: int = 3) -> dict:
    """``fn`` ÷ ``base_fn`` as CUDA-graph replays timed in alternation (base, fn, base, fn, …), the median of the
    per-round ratios. Compute-bound rows drift with the clock under power limits (session 16: cuBLAS alone read
    1415–1650 µs at one 4096×28672×4096 shape across a bench run), so a ratio to a base timed minutes earlier
    carries that drift; adjacent pairs share more of the GPU's state. The median survives one spoiled round, not
    two: slow spells on the H200 last whole rounds (NOTES.md, session 16).
    → ``{"ratio_paired", "paired_us": [[base, fn], …]}``."""
    (g_fn, c_fn), (g_base, c_base) = _rotation_graph(fn, input_sets), _rotation_graph(base_fn, base_sets)
    pairs = []
    for _ in range(rounds):
        b = _bench(g_base.replay).median_us / c_base
        f = _bench(g_fn.replay).median_us / c_fn
        pairs.append([round(b, 3), round(f, 3)])
    ratios = sorted(f / b for b, f in pairs)
    return {"ratio_paired": round(ratios[len(ratios) // 2], 4), "paired_us": pairs}


def parse_shapes(text: str, dims: int = 2) -> list[tuple[int, ...]]:
    """``"4096x6144,14336x4096"`` → ``[(4096, 6144), (14336, 4096)]`` (the benches' and probes' ``--kn``);
    ``dims=1``: ``"256,1024"`` → ``[(256,), (1024,)]`` (``--ms``, ``--ranks``)."""
    out = []
    for item in text.split(","):
        parts = item.strip().split("x")
        if len(parts) != dims or not all(p.isdigit() and int(p) > 0 for p in parts):
            what = ("a positive integer" if dims == 1 else
                    f"{dims} positive integers joined by 'x' (e.g. {'x'.join(['4096', '6144', '4096'][:dims])})")
            raise ValueError(f"expected {what}, got {item!r}")
        out.append(tuple(int(p) for p in parts))
    return out


def time_impl(fn, input_sets: Sequence[tuple], graph: bool = True) -> dict:
    """Eager and graph timings of one implementation, as row fields."""
    e = time_eager(fn, input_sets)
    row = {"median_us": round(e.median_us, 3), "p20_us": round(e.p20_us, 3), "p80_us": round(e.p80_us, 3)}
    if graph:
        try:
            g = time_graph(fn, input_sets)
            row.update(graph_us=round(g.median_us, 3), graph_p20_us=round(g.p20_us, 3),
                       graph_p80_us=round(g.p80_us, 3))
        except Exception as exc:  # a path that cannot be captured is reported, not hidden
            row.update(graph_us=None, graph_error=f"{type(exc).__name__}: {exc}"[:200])
    return row


def checked_timing(fn, input_sets: Sequence[tuple], want: torch.Tensor, out_rows: int | None = None,
                   takes_out: bool = True, tol: float = 1e-2) -> dict:
    """A probe's cell: ``fn(*input_sets[0], out=…)`` into a NaN-poisoned output (``out_rows`` rows, default
    ``want``'s; its first ``want.shape[0]`` rows are checked), its relative error against ``want`` (fp32 or wider),
    then its CUDA-graph replay time over the rotated sets. ``{"rel_err", "us"}``, or ``{"error"}`` where it fails,
    writes NaN or misses ``tol`` — a wrong kernel is never timed."""
    cell: dict = {}
    try:
        x0 = input_sets[0]
        out = torch.full((out_rows or want.shape[0], want.shape[1]), float("nan"), device=x0[0].device,
                         dtype=x0[0].dtype)
        y = (fn(*x0, out=out) if takes_out else fn(*x0))[:want.shape[0]]
        torch.cuda.synchronize()
        if y.isnan().any():
            raise RuntimeError("unwritten (NaN) outputs")
        cell["rel_err"] = round(float((y.float() - want).norm() / want.norm()), 6)
        if cell["rel_err"] > tol:
            raise RuntimeError(f"rel err {cell['rel_err']}")
        cell["us"] = round(time_graph(fn, input_sets).median_us, 3)
    except Exception as exc:
        cell["error"] = f"{type(exc).__name__}: {exc}"[:200]
    return cell


def measure_copy_tbps(nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy bandwidth in TB/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = _bench(lambda: dst.copy_(src))
    return round(2 * nbytes / (t.median_us * 1e-6) / 1e12, 3)


def _git_commit() -> str | None:
    if os.environ.get("LOWRANK_GEMM_COMMIT"):   # the device machine gets a tree without .git
        return os.environ["LOWRANK_GEMM_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:
        return None


def device_meta(copy_tbps: float | None = None, device=None) -> dict:
    """The result files' ``meta``: the device that ran (``device``, default the first GPU), versions, date, commit."""
    import triton
    if device is not None and torch.device(device).type != "cuda":
        dev = "cpu"
    else:
        dev = torch.cuda.get_device_name(0 if device is None else device) if torch.cuda.is_available() else "cpu"
    return {"device": dev, "torch": torch.__version__, "triton": triton.__version__,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "copy_tbps": copy_tbps, "commit": _git_commit()}


def results_dir(device=None, suffix: str = "") -> Path:
    """Where a suite writes by default: ``benchmarks/results/<gpu>`` — ``h100`` / ``h200``, another GPU's name in
    lower case with ``_`` for anything else (``nvidia_a100_sxm4_80gb``), ``cpu`` without CUDA — plus ``suffix``
    (``bench tp``: ``x<world>``). Named by the device that ran, so an H100's numbers never land among the H200's."""
    from ..plan.tuned import device_slug
    if not torch.cuda.is_available():
        return RESULTS_ROOT / f"cpu{suffix}"
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    return RESULTS_ROOT / f"{device_slug(dev)}{suffix}"


def write_results(name: str, meta: dict, rows: list[dict], outdir: Path | str | None = None,
                  md: str | None = None, plot: Callable[[dict, Path], None] | None = None) -> Path:
    """Write ``<name>.json`` (and ``.md``, ``.png`` when given) under ``outdir`` (default :func:`results_dir`)."""
    outdir = Path(outdir) if outdir is not None else results_dir()
    outdir.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "rows": rows}
    path = outdir / f"{name}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    if md is not None:
        (outdir / f"{name}.md").write_text(md)
    if plot is not None:
        try:
            plot(data, outdir / f"{name}.png")
        except ImportError:
            pass
    return path


def write_probe(name: str, title: str, rows: list[dict], columns: Sequence[tuple[str, str]], outdir: Path | str
                ) -> Path:
    """A probe's ``<name>.json`` and ``.md`` under ``outdir``: this device's meta, the rows, and a table of
    ``columns`` ((header, row key) pairs; a missing key reads —)."""
    meta = device_meta()
    md = f"# {title}\n\n" + meta_header(meta) + markdown_table([h for h, _ in columns],
                                                               [[r.get(k) for _, k in columns] for r in rows])
    return write_results(name, meta, rows, outdir, md=md)


def load_results(path: Path | str) -> dict:
    return json.loads(Path(path).read_text())


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def fmt(v):
        if v is None:
            return "—"
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def meta_header(meta: dict) -> str:
    return (f"{meta.get('device')} · torch {meta.get('torch')} · triton {meta.get('triton')} · "
            f"{meta.get('date')} · copy {meta.get('copy_tbps')} TB/s · commit {meta.get('commit')}\n\n")
