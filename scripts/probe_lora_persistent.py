"""GPU probe (session 16): the persistent two-phase LoRA kernel at compute-bound M, against today's ``auto``.

    PYTHONPATH=src python scripts/probe_lora_persistent.py --out DIR [--budget-s 200] [--write-tuned PATH]

Why: the session-16 full ``bench lora`` (``probes/s16/first``) timed ``persistent_static`` on the heuristic
128×256×64 tile at 1.003–1.020× cuBLAS for 4096×28672 M=1024, where ``auto`` (tuned ``split``, same tile) read
1.07–1.12×; at 8192² M=1024 1.06–1.10× against 1.13–1.23×. Those were one-off cells of a 54-cell grid, so this
probe re-times them, with a few variants (group_m, stages, a 256×128 tile, ``epi_stages=1``, the dynamic
counter), next to cuBLAS and ``auto`` in one process. Every candidate: NaN-poisoned output, float64 reference
(the whole output, cheap at these sizes), a second call bit-identical to the first, then a CUDA-graph median.

Outputs (DIR): ``probe_lora_persistent.{json,md}`` and ``lora_h200_updates.json`` — per tuned key, the fastest
candidate when it beats ``auto`` of the same run by more than ``--margin`` (default 2 %), in the tuned-table
format. ``--write-tuned PATH`` merges those into the table at PATH (e.g. ``src/lowrank_gemm/plan/tuned/lora_h200.json``
before a ``bench lora`` in the same device call, so the bench measures the table it ships with).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from probe_lora import _call, _checked, _rel_err, finish_point  # noqa: E402

from lowrank_gemm.bench.common import device_meta, markdown_table, time_graph  # noqa: E402
from lowrank_gemm.bench.lora import SCALE, make_sets  # noqa: E402
from lowrank_gemm.plan.planner import (can_implement, heuristic_lora, lora_ledger, m_bucket,  # noqa: E402
                                       stages_for, tuned_key)
from lowrank_gemm.reference import lora_linear_ref  # noqa: E402

MS = (1024, 4096, 256)
KNS = ((4096, 28672), (8192, 8192), (4096, 4096))
RANKS = (16, 64)          # the tuned table's rank buckets (r=8 takes r16's entry)
TOL = 1e-2


def candidates(M, N, K, r, sms):
    """(label, strategy, config): the heuristic persistent tile and a few neighbours, all through the ledger."""
    out = []
    _, heur = heuristic_lora(M, N, K, r, 16, gpu=True, sms=sms, strategy="persistent_static")
    variants = [("ps", heur)]
    for g in (4, 16):
        if g != heur.group_m and g < -(-M // heur.block_m):     # a group as tall as the grid is the same order
            variants.append((f"ps_g{g}", heur.replace(group_m=g)))
    variants.append(("ps_s3", heur.replace(num_stages=3)))
    if M >= 256:
        t = heur.replace(block_m=256, block_n=128, num_warps=8, num_stages=2)
        t = t.replace(num_stages=stages_for(lambda s: lora_ledger("persistent_static", t.replace(num_stages=s), 16)))
        variants.append(("ps_256x128", t))
    if M <= 1024:
        t = heur.replace(block_m=128, block_n=128, num_warps=8, num_stages=2)
        t = t.replace(num_stages=stages_for(lambda s: lora_ledger("persistent_static", t.replace(num_stages=s), 16)))
        variants.append(("ps_128x128", t))
    # epi_stages=1 (session 16's lead): the epilogue's rank loop unpipelined — the A/B against the same tiles
    # pipelined by the compiler, and at rank 64 the freed shared memory as a deeper main pipeline
    for label, cfg in list(variants):
        if label in ("ps", "ps_256x128"):
            e1 = cfg.replace(epi_stages=1, num_stages=2)
            e1 = e1.replace(num_stages=stages_for(lambda s: lora_ledger("persistent_static", e1.replace(num_stages=s),
                                                                        16)))
            variants.append((label + "_e1", e1))
    for label, cfg in variants:
        if can_implement("persistent_static", (M, N, K, r), cfg, 16):
            out.append((label, "persistent_static", cfg))
    _, dyn = heuristic_lora(M, N, K, r, 16, gpu=True, sms=sms, strategy="persistent_dynamic")
    if can_implement("persistent_dynamic", (M, N, K, r), dyn, 16):
        out.append(("pd", "persistent_dynamic", dyn))
    return out


def probe_point(M, K, N, r, sms):
    return probe_candidates(M, K, N, r, candidates(M, N, K, r, sms))


def point_setup(M, K, N, r):
    """One point's rotated bf16 input sets, the float64 reference of the first, the rows' common fields and
    cuBLAS's row (the ratio every candidate is read against)."""
    sets = make_sets(M, N, K, r, torch.bfloat16, "cuda")
    x, w, a, b, _ = sets[0]
    ref = lora_linear_ref(x, w, a, b, SCALE)
    base = {"M": M, "N": N, "K": K, "r": r}
    cublas = dict(base, label="cublas", strategy="cublas",
                  graph_us=round(time_graph(lambda x, w, a, b, bs: x @ w.T, sets).median_us, 3))
    return sets, ref, base, cublas


def probe_candidates(M, K, N, r, cands, unfused=False):
    """cuBLAS (and torch's unfused branch if ``unfused``), today's ``auto`` and each (label, strategy, config) of
    ``cands`` on one point: every candidate checked against float64 into a NaN-poisoned output and for a
    bit-identical second call before its CUDA-graph median (a failure costs that candidate only)."""
    from lowrank_gemm.kernels.lora_gemm import lora_linear
    from lowrank_gemm.plan.planner import plan_lora
    sets, ref, base, cublas = point_setup(M, K, N, r)
    x, w, a, b, _ = sets[0]
    rows = [cublas]
    if unfused:
        rows.append(dict(base, label="unfused", strategy="torch_unfused", graph_us=round(time_graph(
            lambda x, w, a, b, bs: torch.addmm(x @ w.T, x @ a.T, bs.T), sets).median_us, 3)))
    strat, cfg = plan_lora(M, N, K, r, torch.bfloat16, x.device)
    auto = lambda x, w, a, b, bs: lora_linear(x, w, a, b, SCALE)
    row = dict(base, label="auto", strategy=strat, config=cfg.to_dict(),
               rel_err=round(_rel_err(auto(*sets[0]), ref), 6))
    row["graph_us"] = round(time_graph(auto, sets).median_us, 3)
    rows.append(row)
    for label, s, c in cands:
        row = dict(base, label=label, strategy=s, config=c.to_dict())
        try:
            y1 = _checked(s, c, x, w, a, b)
            y2 = _checked(s, c, x, w, a, b)
            torch.cuda.synchronize()
            row["rel_err"] = round(_rel_err(y1, ref), 6)
            row["bitwise_repeat"] = bool(torch.equal(y1, y2))
            if not (row["rel_err"] <= TOL and row["bitwise_repeat"]):
                row["error"] = f"wrong or not repeatable: rel err {row['rel_err']}, repeat {row['bitwise_repeat']}"
            else:
                row["graph_us"] = round(time_graph(_call(s, c), sets).median_us, 3)
        except Exception as exc:       # a compile/launch failure costs this candidate only
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
    del sets, ref
    return finish_point(rows)


def updates(rows, margin):
    """Per tuned key, the fastest candidate where it beats ``auto`` by more than ``margin``. Only a point at its
    bucket's own M (1, 16, 64, 256, …) pins: the table serves the whole bucket, and M=128's winner is not M=256's
    (session 19: 4096², 64×128 split 2 1.28× at M=128 but 1.63× at M=256, where unsplit read 1.14×)."""
    by_point, out = {}, {}
    for row in rows:
        by_point.setdefault((row["M"], row["N"], row["K"], row["r"]), []).append(row)
    for (M, N, K, r), rs in by_point.items():
        if M != m_bucket(M):
            continue
        cub = next(x["graph_us"] for x in rs if x["label"] == "cublas")
        auto = next((x for x in rs if x["label"] == "auto"), None)
        cands = [x for x in rs if x.get("graph_us") and x["label"] not in ("cublas", "auto")]
        if not cands or auto is None:
            continue
        best = min(cands, key=lambda x: x["graph_us"])
        if best["graph_us"] < auto["graph_us"] * (1 - margin):
            out[tuned_key(M, N, K, r, torch.bfloat16)] = {
                "strategy": best["strategy"], "config": best["config"], "us": best["graph_us"], "cublas_us": cub,
                "x_cublas": round(best["graph_us"] / cub, 3), "auto_us": auto["graph_us"],
                "source": "scripts/probe_lora_persistent.py"}
    return out


def probe_arguments(doc, budget_s, margin):
    """The options every table-writing LoRA probe takes: --out, --budget-s, --margin, --write-tuned."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=budget_s)
    ap.add_argument("--margin", type=float, default=margin)
    ap.add_argument("--write-tuned", type=Path, default=None)
    return ap


def main(argv=None):
    args = probe_arguments(__doc__, 200.0, 0.02).parse_args(argv)
    from lowrank_gemm.kernels.schedule import num_sms
    args.out.mkdir(parents=True, exist_ok=True)
    sms = num_sms(torch.device("cuda"))
    meta = device_meta()

    def saved(rows, skipped):
        (args.out / "lora_h200_updates.json").write_text(json.dumps(updates(rows, args.margin), indent=1))
    rows, skipped = run_points([(M, K, N, r) for M in MS for K, N in KNS for r in RANKS],
                               lambda M, K, N, r: probe_point(M, K, N, r, sms), args.budget_s,
                               args.out / "probe_lora_persistent.json", meta, saved)
    labels = ["auto", "ps", "ps_e1", "ps_g4", "ps_g16", "ps_s3", "ps_256x128", "ps_256x128_e1", "ps_128x128", "pd"]
    table = []
    for (M, N, K, r) in dict.fromkeys((x["M"], x["N"], x["K"], x["r"]) for x in rows):
        rs = {x["label"]: x for x in rows if (x["M"], x["N"], x["K"], x["r"]) == (M, N, K, r)}
        table.append([M, N, K, r, rs["cublas"]["graph_us"]] +
                     [rs[lb].get("x_cublas", "err") if lb in rs else "-" for lb in labels])
    md = (f"# persistent LoRA probe\n\n{json.dumps(meta)}\n\n(× cuBLAS without the branch, CUDA-graph medians; "
          f"skipped: {skipped})\n\n" + markdown_table(["M", "N", "K", "r", "cuBLAS µs"] + labels, table))
    (args.out / "probe_lora_persistent.md").write_text(md + "\n")
    print(md)
    if args.write_tuned is not None:
        merge_updates(args.write_tuned, updates(rows, args.margin), meta, "persistent_probe_runs")


def run_points(points, probe, budget_s, out_json, meta, after=None):
    """``probe(M, K, N, r)`` per point until ``budget_s`` is spent (later points are listed as skipped), the rows
    saved to ``out_json`` after every point (a time limit keeps what was measured). → (rows, skipped)."""
    t0, rows, skipped = time.time(), [], []
    for M, K, N, r in points:
        if time.time() - t0 > budget_s:
            skipped.append((M, K, N, r))
            continue
        pr = probe(M, K, N, r)
        rows += pr
        print(f"[{time.time() - t0:6.1f}s] M={M} K={K} N={N} r={r}: " +
              " ".join(f"{x['label']}={x.get('x_cublas', x.get('error', '?'))}" for x in pr), flush=True)
        out_json.write_text(json.dumps({"meta": meta, "rows": rows, "skipped": skipped}, indent=1))
        if after is not None:
            after(rows, skipped)
    return rows, skipped


def merge_updates(path, upd, meta, runs_key):
    """Write the probe's winners into the tuned table at ``path``, noting the run under ``meta[runs_key]``."""
    table = json.loads(path.read_text())
    for key, entry in upd.items():
        print(f"tuned: {key}: {table['lora'].get(key, {}).get('strategy')} -> {entry['strategy']} "
              f"{entry['x_cublas']}x (auto {entry['auto_us']} us)")
        table["lora"][key] = entry
    if upd:                             # a run that pinned nothing leaves no record
        table["meta"].setdefault(runs_key, []).append({**meta, "entries": sorted(upd)})
    path.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
