"""Tune the LoRA planner for your own shapes on your own GPU: ``python -m lowrank_gemm tune lora``.

The shipped tables (``plan/tuned/``) were measured on an H200 / H100 at issue 2's shapes; elsewhere the planner's
rules decide, and on some untuned layers they lose to plain PyTorch (README, "Status"). This module measures
instead. Per shape (M, K, N, r), in one process:

1. **Candidates** (:func:`lora_candidates`): today's plan, the shipped table's entry (where an earlier tuning's entry
   sits over it), the rules' plan for every strategy that keeps no derived copy of the weight
   (:data:`TUNE_STRATEGIES`), :func:`~.planner.flat_plan`, a small tile × split-K sweep (:data:`SWEEP_TILES`) with the
   one-launch splits and stream-K that even out a partial wave of tiles, and ``unfused`` — the three library GEMMs
   PyTorch runs without this package.
2. **Correctness first**: each candidate writes into a NaN-poisoned output and is compared with the float64
   reference (:func:`~lowrank_gemm.reference.lora_linear_ref`; rows past 1024 by their first and last 256); one
   that raises, leaves an element unwritten or misses :data:`MAX_REL_ERR` is reported and never chosen.
3. **Timing** as CUDA-graph replays over inputs rotated past the L2 (:func:`~lowrank_gemm.bench.common.time_graph`),
   next to cuBLAS without the branch, torch's unfused LoRA and today's ``auto``, all in the same process.
4. The fastest correct candidate, where it beats today's ``auto`` by more than :data:`MARGIN` (else nothing is
   written for the shape), becomes the shape's entry (its exact M and r: :func:`~.planner.tuned_key`) in the user's
   table ``<user_tuned_dir>/lora_<gpu>.json`` (:func:`~.tuned.user_tuned_file`; other entries kept), which
   :func:`~.planner.plan_lora` reads before anything else. ``auto`` is then never slower there than the fastest
   candidate measured, ``unfused`` included — up to the run-to-run noise of one measurement.

From Python, :func:`tune_model` tunes every fused LoRA layer of a model at the token counts you serve.

Outputs stay deterministic: a tuned entry is a plan, and every plan gives bit-identical results call to call. Two
processes that tuned on different machines may pick different plans, hence different roundings (all within the
reference's tolerance).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from .config import KernelConfig
from ..kernels.schedule import cdiv
from .planner import (FIXUP_STRATEGIES, block_r_for, can_implement, clear_plan_cache, flat_plan, group_m_for,
                      heuristic_lora, lora_ledger, makespan_split, plan_lora, resolve_device, split_k_for, stages_for,
                      table_plan, tuned_key, wave_split)
from .tuned import device_slug, read_table, tuned_file, user_tuned_dir

__all__ = ["TUNE_STRATEGIES", "SWEEP_TILES", "MAX_REL_ERR", "MARGIN", "Candidate", "ShapeReport", "lora_candidates",
           "sweep_candidates", "tune_lora", "tune_model", "lora_layer_shapes", "parse_tune_shapes", "user_table_path",
           "main"]

# the strategies whose rules' plan is a candidate: not concat / merged / kcat (each keeps a derived copy of the weight
# that the user did not ask for), not torch (fp32 on the GPU); streamk (no rules of its own) comes with the sweep's
# tiles, unfused on its own
TUNE_STRATEGIES = ("split", "kloop", "persistent_static", "persistent_dynamic", "flat", "streams")
# (block_m, block_n, block_k, warps) by M class, each with and without the wave-filling split-K: the tiles of the
# shipped tables' winners (bench lora --tune's sweep)
SWEEP_TILES = {64: [(64, 64, 128, 4), (64, 128, 128, 4), (64, 256, 64, 4)],
               256: [(128, 128, 64, 4), (128, 256, 64, 8), (64, 128, 128, 4)],
               None: [(128, 128, 64, 4), (128, 256, 64, 8)]}
SWEEP_STRATEGIES = {64: ("kloop", "split", "persistent_dynamic"),
                    256: ("kloop", "split", "persistent_dynamic", "persistent_static"),
                    None: ("split", "kloop", "persistent_dynamic", "persistent_static")}
# issue 2's bar for every strategy in 16-bit (float64 reference)
MAX_REL_ERR = 1e-2
REF_ROWS = 256          # M > 1024: the reference covers the first and last REF_ROWS rows
# a candidate replaces today's auto only if faster by more than this fraction: session 58's first run on an H100 had
# four "winners" 0.06–1.3 % ahead of the plan auto already ran, the same plan among them (run-to-run noise)
MARGIN = 0.02
# the branch scale of every timed LoRA call, the tuner's and ``bench lora``'s (they share ``make_sets``, whose last
# operand is SCALE·B for the unfused baseline)
SCALE = 0.5


@dataclass(frozen=True)
class Candidate:
    label: str
    strategy: str
    config: KernelConfig


@dataclass
class ShapeReport:
    """One shape's measurements (µs: CUDA-graph medians) and the entry written (``chosen``)."""
    M: int
    K: int
    N: int
    r: int
    cublas_us: float | None = None
    torch_unfused_us: float | None = None
    auto_before_us: float | None = None
    auto_before_plan: str | None = None
    rows: list[dict] = field(default_factory=list)
    chosen: dict | None = None
    kept_auto: bool = False
    # after the table is written, timed afresh (the winner's own time was the minimum of many: biased low)
    cublas_after_us: float | None = None
    auto_after_us: float | None = None
    auto_after_plan: str | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _bits(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits


def _label(strategy: str, c: KernelConfig) -> str:
    if strategy == "unfused":
        return "unfused"
    extra = "".join([f" sk{c.split_k} {c.split_mode}" if c.split_k > 1 else "", " swap" if c.swap_ab else "",
                     f" prod{c.s_producers}" if c.s_producers else ""])
    return f"{strategy} {c.block_m}x{c.block_n}x{c.block_k} w{c.num_warps} s{c.num_stages} br{c.block_r}{extra}"


def sweep_candidates(M: int, N: int, K: int, r: int, sms: int, dtype_bits: int = 16, *, wave_fits: bool = False
                     ) -> list[tuple[str, KernelConfig]]:
    """The tile × split-K sweep (:data:`SWEEP_TILES`), each at its deepest pipeline the ledger allows; only the
    plans that :func:`~.planner.can_implement` accepts. Splits: none, and the fill-the-SMs split
    (:func:`~.planner.split_k_for`, two launches). ``wave_fits`` adds, for the strategies that reduce in the launch
    (``fixup``), the split of least predicted makespan over every integer (:func:`~.planner.makespan_split`) and
    :func:`~.planner.wave_split`'s, and from M > 64 ``streamk`` on each tile: the fixes of wave quantization."""
    cls = 64 if M <= 64 else 256 if M <= 256 else None
    out = []
    for bm, bn, bk, warps in SWEEP_TILES[cls]:
        npm = cdiv(M, bm)
        tiles, k_tiles = npm * cdiv(N, bn), cdiv(K, bk)
        plans = [(s, split, "reduce") for s in SWEEP_STRATEGIES[cls]
                 for split in sorted({1, split_k_for(tiles, k_tiles, sms)} if not s.startswith("persistent") else {1})]
        if wave_fits:
            fits = {makespan_split(tiles, k_tiles, sms), wave_split(tiles, k_tiles, sms)} - {1}
            plans += [(s, split, "fixup") for s in SWEEP_STRATEGIES[cls] if s in FIXUP_STRATEGIES
                      for split in sorted(fits)]
            plans += [("streamk", 1, "reduce")] if cls != 64 else []
        for s, split, mode in plans:
            cfg = KernelConfig(block_m=bm, block_n=bn, block_k=bk, block_r=block_r_for(r), group_m=group_m_for(npm),
                               num_warps=warps, num_stages=2, split_k=split, split_mode=mode)
            try:
                cfg = cfg.replace(num_stages=stages_for(
                    lambda st: lora_ledger(s, cfg.replace(num_stages=st), dtype_bits)))
            except Exception:       # no stage count fits this tile
                continue
            if can_implement(s, (M, N, K, r), cfg, dtype_bits) and (s, cfg) not in out:
                out.append((s, cfg))
    return out


def lora_candidates(M: int, N: int, K: int, r: int, dtype: torch.dtype, device) -> list[Candidate]:
    """Every plan the tuner times for one shape, without duplicates, each one that can run it (module doc, 1.)."""
    from ..kernels.schedule import num_sms
    device = torch.device(device)
    gpu, bits, sms = device.type == "cuda", _bits(dtype), num_sms(device)
    out, seen = [], set()

    def add(strategy, cfg):
        if (strategy, cfg) in seen or not can_implement(strategy, (M, N, K, r), cfg, bits):
            return
        seen.add((strategy, cfg))
        out.append(Candidate(_label(strategy, cfg), strategy, cfg))

    add(*plan_lora(M, N, K, r, dtype, device))
    shipped = table_plan(tuned_file("lora", device), M, N, K, r, dtype, bits, sms)   # under a user's own entry
    if shipped is not None:
        add(*shipped)
    for s in TUNE_STRATEGIES:
        try:
            add(*heuristic_lora(M, N, K, r, bits, gpu=gpu, sms=sms, strategy=s))
        except Exception:       # the rules have no plan of this strategy for this shape
            continue
    if gpu and (fp := flat_plan(M, N, K, r, bits, sms)) is not None:
        add(*fp)
    for s, cfg in sweep_candidates(M, N, K, r, sms, bits, wave_fits=True):
        add(s, cfg)
    add("unfused", KernelConfig())
    return out


def user_table_path(device) -> Path:
    """Where :func:`tune_lora` writes by default: the file :func:`~.tuned.user_tuned_file` reads for ``device``."""
    return user_tuned_dir() / f"lora_{device_slug(device)}.json"


def parse_tune_shapes(text: str) -> list[tuple[int, int, int, int]]:
    """``"256x3584x18944x16,64x4096x1024x8"`` → ``[(M, K, N, r), …]``: x [M, K], W [N, K], rank r."""
    out = []
    for item in text.split(","):
        parts = item.strip().split("x")
        if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"a shape is MxKxNxR, four positive integers joined by 'x' (x [M, K], W [N, K], rank R; "
                             f"e.g. 256x3584x18944x16), got {item!r}")
        out.append(tuple(int(p) for p in parts))
    return out


def check_candidate(candidate: Candidate, x, w, a, b, ref: torch.Tensor, rows: torch.Tensor | None,
                    record: dict | None = None) -> float:
    """Run the candidate once into a NaN-poisoned output → its relative error against ``ref`` (float64 rows),
    rounded, also as ``record["rel_err"]``; raise where it left an element unwritten or misses :data:`MAX_REL_ERR`."""
    from ..kernels.lora_gemm import run_strategy
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype, device=x.device)
    y = run_strategy(candidate.strategy, x, w, a, b, SCALE, None, candidate.config, out=out)
    y = y if rows is None else y[rows]
    if not bool(torch.isfinite(y).all()):
        raise RuntimeError("left output elements unwritten (NaN-poisoned output)")
    err = round(float((y.double() - ref).norm() / ref.norm()), 7)
    if record is not None:
        record["rel_err"] = err
    if not err <= MAX_REL_ERR:
        raise RuntimeError(f"relative error {err:.3g} > {MAX_REL_ERR}")
    return err


def reference_rows(x, w, a, b) -> tuple[torch.Tensor, torch.Tensor | None]:
    from ..reference import lora_linear_ref
    M = x.shape[0]
    rows = None
    if M > 4 * REF_ROWS:
        rows = torch.cat([torch.arange(REF_ROWS), torch.arange(M - REF_ROWS, M)]).to(x.device)
        x = x[rows]
    return lora_linear_ref(x, w, a, b, SCALE), rows


def _graph_us(fn, sets) -> float:
    from ..bench.common import time_graph
    return time_graph(fn, sets).median_us


def _input_sets(M: int, N: int, K: int, r: int, dtype, device) -> list[tuple]:
    from ..bench.lora import make_sets
    return make_sets(M, N, K, r, dtype, device)


def _load_user_table(path: Path) -> dict:
    if not path.exists():
        return {"version": 1, "lora": {}}
    data = read_table(path)
    if not isinstance(data.get("lora"), dict):
        raise ValueError(f"{path}: a LoRA tuned table has a 'lora' object of entries")
    return data


def tune_lora(shapes: Sequence[tuple[int, int, int, int]], *, dtype: torch.dtype = torch.bfloat16, device=None,
              path: Path | str | None = None, timer: Callable | None = None, budget_s: float | None = None,
              progress: bool = True, verify: bool = True, print_fn: Callable[[str], None] = print,
              on_shape: Callable[[list[ShapeReport]], None] | None = None, margin: float = MARGIN
              ) -> list[ShapeReport]:
    """Tune each (M, K, N, r) of ``shapes`` (module doc) and merge the winners that beat today's ``auto`` into the
    table at ``path`` (default :func:`user_table_path`) by more than ``margin`` (a fraction of auto's time: a plan
    is not swapped for a tie within the noise), written after every shape that got an entry (an interrupted
    run keeps what it measured). ``timer(fn, input_sets) → µs`` replaces the CUDA-graph timing (tests);
    ``budget_s``: no new shape is started after that many seconds (a shape begun is finished); ``on_shape(reports)``
    after every shape. ``verify``: at the end, time cuBLAS and ``auto`` again for every shape that got an entry
    (``auto`` now reads it), side by side — the winner's own time is the least of many measurements, so it reads
    low. → one report per shape tuned."""
    device = resolve_device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda" and timer is None:
        raise RuntimeError("tuning times CUDA-graph replays: it needs a CUDA GPU (or a timer, in tests)")
    if dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"tuning covers 16-bit LoRA layers: dtype float16 or bfloat16, got {dtype}")
    path = Path(path) if path is not None else user_table_path(device)
    table = _load_user_table(path)              # a corrupted table is refused before any time is spent
    timer = timer or _graph_us
    t0 = time.time()
    reports = []
    bar = _progress(len(shapes), progress)
    for M, K, N, r in shapes:
        if budget_s is not None and time.time() - t0 > budget_s:
            print_fn(f"budget of {budget_s:.0f} s spent: {M}x{K}x{N}x{r} and later shapes not tuned")
            break
        rep = _tune_shape(M, K, N, r, dtype, device, timer, margin)
        reports.append(rep)
        if rep.chosen:
            table["lora"][tuned_key(M, N, K, r, dtype, exact=True)] = rep.chosen
            _write_table(table, path, device)
        bar.update(1)
        print_fn(summary_line(rep))
        if on_shape is not None:
            on_shape(reports)
    bar.close()
    if any(rep.chosen for rep in reports):
        print_fn(f"wrote {path} ({len(table['lora'])} entries); plan_lora reads it first on this GPU")
        if verify and device.type == "cuda" and path == user_table_path(device):
            for rep in reports:
                if rep.chosen:
                    _verify(rep, dtype, device, timer)
                    print_fn(f"M={rep.M} K={rep.K} N={rep.N} r={rep.r}: auto now [{rep.auto_after_plan}] "
                             f"{rep.auto_after_us:.1f} µs, cuBLAS {rep.cublas_after_us:.1f} µs "
                             f"({rep.auto_after_us / rep.cublas_after_us:.3f}×; before "
                             f"{_ratio(rep.auto_before_us, rep.cublas_us)})")
            if on_shape is not None:
                on_shape(reports)
    return reports


def _tune_shape(M: int, K: int, N: int, r: int, dtype, device, timer, margin: float) -> ShapeReport:
    """One shape: the baselines and today's auto, then every candidate checked and timed (module doc, 1.–4.)."""
    from ..kernels.lora_gemm import lora_linear
    from .planner import pinned
    rep = ShapeReport(M, K, N, r)
    sets = _input_sets(M, N, K, r, dtype, device)
    x, w, a, b, _ = sets[0]
    ref, rows = reference_rows(x, w, a, b)
    rep.cublas_us = timer(lambda x, w, a, b, bs: x @ w.T, sets)
    rep.torch_unfused_us = timer(lambda x, w, a, b, bs: torch.addmm(x @ w.T, x @ a.T, bs.T), sets)
    rep.auto_before_plan = plan_lora(M, N, K, r, dtype, device)[0]
    try:
        rep.auto_before_us = timer(lambda x, w, a, b, bs: lora_linear(x, w, a, b, SCALE), sets)
    except Exception as exc:        # reported; the candidates still run
        rep.auto_before_plan += f" (failed: {type(exc).__name__}: {exc})"[:200]
    best = None
    for cand in lora_candidates(M, N, K, r, dtype, device):
        row = {"label": cand.label, "strategy": cand.strategy, "config": cand.config.to_dict()}
        try:
            check_candidate(cand, x, w, a, b, ref, rows, record=row)

            def call(x, w, a, b, bs, _c=cand):
                with pinned(strategy=_c.strategy, config=_c.config):
                    return lora_linear(x, w, a, b, SCALE)
            row["us"] = round(timer(call, sets), 3)
        except Exception as exc:        # reported, never chosen
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rep.rows.append(row)
        if row.get("us") is not None and (best is None or row["us"] < best[1]["us"]):
            best = (cand, row)
    if best is not None and rep.auto_before_us is not None and best[1]["us"] >= rep.auto_before_us * (1 - margin):
        rep.kept_auto = True        # today's route (a v2 or kcat route included) measured as fast, within the margin
    elif best is not None:
        cand, row = best
        rep.chosen = {"strategy": cand.strategy, "config": cand.config.to_dict(), "label": cand.label,
                      "us": row["us"], "cublas_us": _r(rep.cublas_us), "torch_unfused_us": _r(rep.torch_unfused_us),
                      "auto_before_us": _r(rep.auto_before_us), "auto_before_plan": rep.auto_before_plan,
                      "x_cublas": round(row["us"] / rep.cublas_us, 3) if rep.cublas_us else None}
    del sets, x, w, a, b, ref
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rep


def _write_table(table: dict, path: Path, device) -> None:
    table["version"] = 1
    table["meta"] = dict(table.get("meta", {}), **_meta(device))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")         # never a half-written table where the planner reads
    tmp.write_text(json.dumps(table, indent=1) + "\n")
    tmp.replace(path)
    clear_plan_cache()


def _ratio(v, base) -> str:
    return f"{v / base:.3f}×" if v and base else "—"


def _verify(rep: ShapeReport, dtype, device, timer) -> None:
    from ..kernels.lora_gemm import lora_linear
    M, K, N, r = rep.M, rep.K, rep.N, rep.r
    sets = _input_sets(M, N, K, r, dtype, device)
    rep.auto_after_plan = plan_lora(M, N, K, r, dtype, device)[0]
    rep.cublas_after_us = timer(lambda x, w, a, b, bs: x @ w.T, sets)
    rep.auto_after_us = timer(lambda x, w, a, b, bs: lora_linear(x, w, a, b, SCALE), sets)
    del sets
    if device.type == "cuda":
        torch.cuda.empty_cache()


def lora_layer_shapes(model: torch.nn.Module) -> dict[torch.dtype, list[tuple[int, int, int]]]:
    """The distinct (K, N, r) of a model's fused LoRA layers (:class:`~lowrank_gemm.nn.LoRALinear`, e.g. after
    :func:`~lowrank_gemm.integrations.peft.fuse_lora_`) by weight dtype; layers with an fp8 weight are left out
    (tuning covers 16-bit layers)."""
    from ..nn.lora import LoRALinear
    out: dict[torch.dtype, set] = {}
    for m in model.modules():
        if isinstance(m, LoRALinear) and m.weight_scale is None and m.weight.dtype in (torch.float16, torch.bfloat16):
            out.setdefault(m.weight.dtype, set()).add((m.in_features, m.out_features, m.rank))
    return {d: sorted(v) for d, v in out.items()}


def tune_model(model: torch.nn.Module, tokens: Sequence[int], **kw) -> list[ShapeReport]:
    """:func:`tune_lora` on every distinct fused LoRA layer of ``model`` (:func:`lora_layer_shapes`) at each token
    count in ``tokens`` (the M your serving runs: decode batch sizes, prefill chunks); ``kw`` as for tune_lora."""
    if not tokens or any(int(m) < 1 for m in tokens):
        raise ValueError(f"tokens: one or more positive token counts (M), got {tokens!r}")
    shapes = lora_layer_shapes(model)
    if not shapes:
        raise ValueError("the model has no 16-bit LoRALinear layers to tune (fuse PEFT layers first: fuse_lora_)")
    reports = []
    for dtype, kns in shapes.items():
        reports += tune_lora([(int(m), k, n, r) for (k, n, r) in kns for m in tokens], dtype=dtype, **kw)
    return reports


def _r(v):
    return None if v is None else round(v, 3)


def _meta(device) -> dict:
    from ..bench.common import device_meta
    meta = device_meta(device=device)
    meta.pop("copy_tbps")
    return dict(meta, source="python -m lowrank_gemm tune lora")


class _NoBar:
    def update(self, n):
        pass

    def close(self):
        pass


def _progress(total: int, on: bool):
    if not on:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc="tuning LoRA shapes", unit="shape")


def summary_line(rep: ShapeReport) -> str:
    def us(v):
        if v is None:
            return "—"
        return f"{v:.1f} µs" + (f" ({v / rep.cublas_us:.3f}×)" if rep.cublas_us else "")
    head = (f"M={rep.M} K={rep.K} N={rep.N} r={rep.r}: cuBLAS {us(rep.cublas_us)}; torch unfused "
            f"{us(rep.torch_unfused_us)}; auto before {us(rep.auto_before_us)} [{rep.auto_before_plan}]; ")
    if rep.kept_auto:
        best = min(row["us"] for row in rep.rows if row.get("us") is not None)
        return head + f"best candidate {us(best)}: not faster by the margin, nothing written"
    if rep.chosen is None:
        return head + f"no candidate ran correctly ({len(rep.rows)} tried): nothing written"
    return head + f"tuned {us(rep.chosen['us'])} [{rep.chosen['label']}]"


def to_markdown(reports: Sequence[ShapeReport], meta: dict) -> str:
    from ..bench.common import markdown_table, meta_header
    body = []
    for rep in reports:
        c = rep.chosen or {}
        ratio = (lambda v: round(v / rep.cublas_us, 3) if rep.cublas_us and v else None)
        body.append([rep.M, rep.K, rep.N, rep.r, rep.cublas_us, rep.torch_unfused_us, ratio(rep.torch_unfused_us),
                     rep.auto_before_us, ratio(rep.auto_before_us), rep.auto_before_plan, c.get("us"),
                     ratio(c.get("us")), c.get("label") or ("auto kept" if rep.kept_auto else "none correct"),
                     rep.auto_after_us,
                     round(rep.auto_after_us / rep.cublas_after_us, 3) if rep.auto_after_us and rep.cublas_after_us
                     else None])
    hdr = ["M", "K", "N", "r", "cuBLAS µs", "torch unfused µs", "×", "auto before µs", "×", "before plan", "tuned µs",
           "×", "tuned plan", "auto after µs (fresh)", "× cuBLAS (fresh)"]
    return "# LoRA tuning (`python -m lowrank_gemm tune lora`)\n\n" + meta_header(meta) + markdown_table(hdr, body)


def _report_writer(out: Path) -> Callable[[list[ShapeReport]], None]:
    """``on_shape`` for the command line: ``tune_lora.json`` / ``.md`` under ``out`` after every shape (an interrupted
    run keeps its report)."""
    from ..bench.common import device_meta
    meta = device_meta()

    def write(reports):
        out.mkdir(parents=True, exist_ok=True)
        (out / "tune_lora.json").write_text(json.dumps(
            {"meta": meta, "reports": [r.as_dict() for r in reports]}, indent=1) + "\n")
        (out / "tune_lora.md").write_text(to_markdown(reports, meta))
    return write


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m lowrank_gemm tune lora", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", required=True, help="MxKxNxR,… (x [M, K], W [N, K], rank R), e.g. 256x3584x18944x16")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--table", type=Path, default=None,
                    help="the table to merge into (default: the file the planner reads, under $LOWRANK_GEMM_TUNED_DIR "
                         "or ~/.cache/lowrank_gemm/tuned)")
    ap.add_argument("--budget-s", type=float, default=None, help="start no new shape after this many seconds")
    ap.add_argument("--margin", type=float, default=MARGIN,
                    help=f"replace auto only where a candidate is faster by more than this fraction (default {MARGIN})")
    ap.add_argument("--out", type=Path, default=None, help="also write tune_lora.json / .md (every candidate) here")
    args = ap.parse_args(argv)
    try:
        shapes = parse_tune_shapes(args.shapes)
    except ValueError as exc:
        ap.error(str(exc))
    if not torch.cuda.is_available():
        print("tuning times CUDA-graph replays on the GPU it tunes for: no CUDA GPU here", flush=True)
        return 2
    reports = tune_lora(shapes, dtype=getattr(torch, args.dtype), path=args.table, budget_s=args.budget_s,
                        on_shape=_report_writer(args.out) if args.out is not None else None, margin=args.margin)
    if args.out is not None:
        print(f"wrote {args.out / 'tune_lora.json'} and .md")
    return 0 if reports and all(r.chosen or r.kept_auto for r in reports) else 1
