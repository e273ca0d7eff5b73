"""GPU probe (session 18): what rank 64 costs ``split`` on shapes the tuned table never saw, and two fixes.

    PYTHONPATH=src python scripts/probe_lora_down.py --out DIR [--budget-s 240]

Why: in ``probes/s17/families`` and ``s18/first`` the heuristic's ``split`` at r=64 read 10–40 % more than at r=16
(M=256, K=18944 → N=3584: 1.34× cuBLAS against 1.09×; M=1024, N=1024: 2.17× against 1.70×) while
``persistent_static`` on the same tiles moved 2–8 %. ``split``'s down kernel works in 16-rank blocks
(``SPLIT_BLOCK_R``, sized for the main epilogue's registers): at r=64 it reads X four times and puts four times
the CTAs on the SMs, each holding shared memory that delays the main kernel's CTAs there (PDL).

Per point, with the tuned table hidden (the heuristic alone), in one process: cuBLAS, ``auto`` at r=16 and r=64,
and at r=64 ``auto`` with ``down_full_rank`` (the down kernel takes all ranks per CTA: X once, a quarter of the
CTAs), the same with up to 8 K slices, and ``persistent_static`` on the heuristic's tile (S inside the kernel).
Every candidate: NaN-poisoned output, float64 reference, second call bit-identical, then a CUDA-graph median.
Outputs (DIR): ``probe_lora_down.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from probe_lora import _rel_err, finish_point  # noqa: E402
from probe_lora_persistent import TOL, point_setup, run_points  # noqa: E402

import lowrank_gemm.kernels.lora_gemm as LG  # noqa: E402
import lowrank_gemm.plan.planner as P  # noqa: E402
from lowrank_gemm.bench.common import device_meta, markdown_table, parse_shapes, time_graph  # noqa: E402
from lowrank_gemm.bench.lora import SCALE  # noqa: E402

# (K×N, M values): the Llama-3-8B and held-out shapes where the heuristic runs ``split`` above M=64
POINTS = (("4096x1024", (256, 1024, 4096)), ("14336x4096", (256, 1024, 4096)), ("4096x6144", (256, 1024, 4096)),
          ("18944x3584", (256, 1024, 4096)), ("4096x14336", (256,)), ("28672x8192", (256,)), ("3584x18944", (256,)))


def _variant(strategy, cfg, *, down_full_rank=False, max_splits=None):
    """A callable (x, w, a, b, out) under the given plan and launch options."""
    def fn(x, w, a, b, out=None):
        saved = LG._DOWN_MAX_SPLITS
        if max_splits is not None:
            LG._DOWN_MAX_SPLITS = max_splits
        try:
            with LG.lora_options(down_full_rank=down_full_rank):
                return LG.run_strategy(strategy, x, w, a, b, SCALE, None, cfg, out=out)
        finally:
            LG._DOWN_MAX_SPLITS = saved
    return fn


def probe_point(M, K, N, r):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    strat, cfg = P.heuristic_lora(M, N, K, r, 16, gpu=True, sms=sms)
    cands = [("auto", strat, cfg, {})]
    if r > P.SPLIT_BLOCK_R and strat == "split":
        cands += [("auto_dfr", strat, cfg, {"down_full_rank": True}),
                  ("auto_dfr_s8", strat, cfg, {"down_full_rank": True, "max_splits": 8})]
    if r > P.SPLIT_BLOCK_R and strat != "persistent_static":
        ps = cfg.replace(block_r=P.block_r_for(r), split_k=1, split_mode="reduce", num_stages=2)
        ps = ps.replace(num_stages=P.stages_for(lambda s: P.lora_ledger("persistent_static", ps.replace(num_stages=s),
                                                                        16)))
        if P.can_implement("persistent_static", (M, N, K, r), ps, 16):
            cands.append(("ps_same_tile", "persistent_static", ps, {}))
    sets, ref, base, cublas = point_setup(M, K, N, r)
    x, w, a, b, _ = sets[0]
    rows = [cublas]
    for label, s, c, opts in cands:
        fn = _variant(s, c, **opts)
        row = dict(base, label=label, strategy=s, config=c.to_dict(), options=opts)
        try:
            ys = []
            for _ in range(2):
                out = torch.full((M, N), float("nan"), dtype=x.dtype, device=x.device)
                ys.append(fn(x, w, a, b, out))
            torch.cuda.synchronize()
            row["rel_err"] = round(_rel_err(ys[0], ref), 6)
            row["bitwise_repeat"] = bool(torch.equal(ys[0], ys[1]))
            if row["rel_err"] <= TOL and row["bitwise_repeat"]:
                row["graph_us"] = round(time_graph(lambda x, w, a, b, bs: fn(x, w, a, b), sets).median_us, 3)
            else:
                row["error"] = f"wrong or not repeatable: rel err {row['rel_err']}, repeat {row['bitwise_repeat']}"
        except Exception as exc:       # a compile/launch failure costs this candidate only
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
    del sets, ref
    return finish_point(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=240.0)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = device_meta()
    points = [(M, K, N, r) for kn, ms in POINTS for (K, N) in parse_shapes(kn) for M in ms for r in (16, 64)]
    rows, skipped = run_points(points, probe_point, args.budget_s, args.out / "probe_lora_down.json", meta)
    labels = ["auto", "auto_dfr", "auto_dfr_s8", "ps_same_tile"]
    table = []
    for (M, N, K) in dict.fromkeys((x["M"], x["N"], x["K"]) for x in rows):
        rs = {(x["r"], x["label"]): x for x in rows if (x["M"], x["N"], x["K"]) == (M, N, K)}
        auto64 = rs.get((64, "auto"), {})
        table.append([M, N, K, f"{auto64.get('strategy', '-')} {auto64.get('config', {}).get('block_n', '')}",
                      rs.get((16, "auto"), {}).get("x_cublas", "-")] +
                     [rs[(64, lb)].get("x_cublas", rs[(64, lb)].get("error", "err")) if (64, lb) in rs else "-"
                      for lb in labels])
    md = (f"# rank 64 on split: the down kernel\n\n{json.dumps(meta)}\n\n(× cuBLAS without the branch, CUDA-graph "
          f"medians, tuned table hidden; skipped: {skipped})\n\n" +
          markdown_table(["M", "N", "K", "plan (r64)", "auto r16"] + [f"{lb} r64" for lb in labels], table))
    (args.out / "probe_lora_down.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
