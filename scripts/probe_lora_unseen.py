"""GPU probe (session 17): LoRA plan families on shapes the tuned table has never seen, against the heuristic.

    PYTHONPATH=src python scripts/probe_lora_unseen.py --out DIR [--budget-s 300] [--write-tuned PATH]

Why: ``bench lora --kn 4096x1024,4096x14336,14336x4096,4096x6144`` (``probes/s17/unseen``) found the heuristic plan
for untuned shapes 1.75–4.2× cuBLAS at M = 64–1024 on PEFT's Llama-3-8B projections, slower than torch's unfused
branch (1.57–2.3×): its one-launch split-K cuts 128×256 tiles into up to 8 pieces at M = 256. This probe times,
per (shape, M, r), the plan families that won the tuned shapes — kloop 64×BN at M = 64, persistent or split
128×128 / 128×256 / 256×128 above — next to cuBLAS, torch's unfused branch and today's ``auto``, in one process.
Every candidate: NaN-poisoned output, float64 reference, second call bit-identical, then a CUDA-graph median.

Outputs (DIR): ``probe_lora_unseen.{json,md}`` and ``lora_h200_updates.json`` — per tuned key the fastest
candidate when it beats ``auto`` by more than ``--margin`` (default 3 %). ``--write-tuned PATH`` merges them.
The table says which family wins where; the heuristic is rewritten from it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from probe_lora_persistent import (merge_updates, probe_arguments, probe_candidates, run_points,  # noqa: E402
                                   updates)

from lowrank_gemm.bench.common import device_meta, markdown_table, parse_shapes  # noqa: E402
from lowrank_gemm.plan.config import KernelConfig  # noqa: E402
from lowrank_gemm.kernels.schedule import num_sms  # noqa: E402
from lowrank_gemm.plan.planner import (block_r_for, can_implement, group_m_for, lora_ledger, stages_for,  # noqa: E402
                                       wave_split)

KNS = ((4096, 6144), (4096, 1024), (14336, 4096), (4096, 14336))
MS = (256, 64, 1024, 4096, 16)       # most broken first: the budget may stop the last
RANKS = (16, 64)


def _cfg(strategy, M, r, bm, bn, bk, warps, split_k=1, split_mode="reduce", swap_ab=False, group_m=None):
    br = block_r_for(r)
    if strategy == "split":
        br = min(br, 16)          # planner.SPLIT_BLOCK_R
    c = KernelConfig(block_m=bm, block_n=bn, block_k=bk, block_r=br, num_warps=warps, num_stages=2,
                     group_m=group_m or group_m_for(-(-M // bm)), split_k=split_k,
                     split_mode=split_mode if split_k > 1 else "reduce", swap_ab=swap_ab)
    return c.replace(num_stages=stages_for(lambda s: lora_ledger(strategy, c.replace(num_stages=s), 16)))


def candidates(M, N, K, r):
    """(label, strategy, config) per M bucket: the families that won the tuned shapes, tiles at ~1 wave."""
    c = []
    sms = num_sms(torch.device("cuda")) if torch.cuda.is_available() else 132
    if M <= 16:
        c += [("sw_64x256", "split", _cfg("split", M, r, 16, 64, 256, 4, swap_ab=True)),
              ("sw_128x64", "split", _cfg("split", M, r, 16, 128, 64, 4, swap_ab=True)),
              ("swk_128x128", "kloop", _cfg("kloop", M, r, 16, 128, 128, 4, swap_ab=True))]
    elif M <= 64:
        for bn, bk in ((32, 256), (64, 128), (128, 128), (256, 64)):
            c.append((f"k_{bn}", "kloop", _cfg("kloop", M, r, 64, bn, bk, 4)))
        tiles32 = -(-N // 32)
        if tiles32 < 100:                       # too few output tiles even at 32 columns: split K in the launch
            c.append(("k_32_sk2", "kloop", _cfg("kloop", M, r, 64, 32, 256, 4, 2, "fixup")))
            c.append(("k_64_sk4", "kloop", _cfg("kloop", M, r, 64, 64, 128, 4, 4, "fixup")))
        for bn in (128, 64, 32):
            # session 20: S once (one S task) instead of once per N tile, on the widest tile with a wave of tiles
            if -(-N // bn) + 1 <= sms and -(-N // bn) >= sms // 2:
                c.append((f"ps_64x{bn}", "persistent_static", _cfg("persistent_static", M, r, 64, bn, 128, 4)))
    else:
        c += [("ps_128x256", "persistent_static", _cfg("persistent_static", M, r, 128, 256, 64, 8)),
              ("ps_128x128", "persistent_static", _cfg("persistent_static", M, r, 128, 128, 64, 8)),
              ("sp_128x256", "split", _cfg("split", M, r, 128, 256, 64, 8)),
              ("sp_128x128", "split", _cfg("split", M, r, 128, 128, 64, 4))]
        if M >= 1024:
            c.append(("ps_256x128", "persistent_static", _cfg("persistent_static", M, r, 256, 128, 64, 8)))
        # the partial last wave of 128×256 tiles split in the launch (planner.wave_split, fixup): session 17's
        # held-out 3584→18944 M=256 ran 148 tiles = 1.12 waves at 1.55×
        t256 = -(-M // 128) * -(-N // 256)
        ws = wave_split(t256, -(-K // 64), sms)
        if ws > 1 and t256 > sms:
            c.append((f"sp_128x256_ws{ws}", "split", _cfg("split", M, r, 128, 256, 64, 8, ws, "fixup")))
        tiles = -(-M // 128) * -(-N // 128)
        if tiles < 100:
            c.append(("sp_128x128_sk2", "split", _cfg("split", M, r, 128, 128, 64, 4, 2, "reduce")))
            c.append(("sp_128x128_fx2", "split", _cfg("split", M, r, 128, 128, 64, 4, 2, "fixup")))
        if tiles < 66:
            # narrow N (k/v projections, N=1024): cuBLAS runs them in 5–15 µs, where split's three launches cost
            # ~2× (session 18). One launch: kloop (S recomputed per N tile) or split-K in the launch on narrower
            # tiles; or the branch in cuBLAS's K (kcat, the derived-weight cache standing in for the packed layout)
            c.append(("kl_128x64_fx4", "kloop", _cfg("kloop", M, r, 128, 64, 64, 4, 4, "fixup")))
            c.append(("kl_64x64_fx2", "kloop", _cfg("kloop", M, r, 64, 64, 128, 4, 2, "fixup")))
            c.append(("sp_128x64_fx4", "split", _cfg("split", M, r, 128, 64, 64, 4, 4, "fixup")))
        if M <= 256 and -(-M // 64) * -(-N // 128) <= sms:
            # session 19: 4096² at M=256 (1.37–1.59×, split 2 on 64 tiles of 128×128): one kloop launch on a wave
            # of 64×128 tiles (S recomputed per N tile: +r/128 of the MMA), unsplit and K split 2 in the launch
            c.append(("kl_64x128", "kloop", _cfg("kloop", M, r, 64, 128, 128, 4)))
            c.append(("kl_64x128_fx2", "kloop", _cfg("kloop", M, r, 64, 128, 128, 4, 2, "fixup")))
        rows = -(-M // 64)
        for bn in (128, 64):
            # session 20: the same wave of 64-row tiles with S computed once per row block (persistent_static's
            # S tasks, one more CTA per row block) instead of once per N tile (kloop: +r/BN of the MMA, +50 % at r64)
            if M <= 256 and rows * -(-N // bn) + rows <= sms:
                c.append((f"ps_64x{bn}", "persistent_static", _cfg("persistent_static", M, r, 64, bn, 128, 4)))
        if tiles < 66 or N < K:
            c.append(("kcat", "kcat", _cfg("kcat", M, r, 128, 128, 64, 4)))
    return [(lb, s, cf) for lb, s, cf in c if can_implement(s, (M, N, K, r), cf, 16)]


def rule_plan(M, N, K, r):
    """The plan ``auto`` would take with the tuned table hidden: the rules alone (session 20: at an M between
    buckets, e.g. 128, the table's entry for the bucket's own M (256) serves it — which of the two is faster?)."""
    from lowrank_gemm.plan import planner as P
    saved = P.load_tuned
    P.load_tuned = lambda path: {}
    P.clear_plan_cache()
    try:
        return P.plan_lora(M, N, K, r, torch.bfloat16, torch.device("cuda"))
    finally:
        P.load_tuned = saved
        P.clear_plan_cache()


def bucket_entry(M, N, K, r):
    """The tuned table's entry for M's bucket as (label, strategy, config), or None: what ``auto`` ran at every M
    of the bucket before session 20's :func:`~lowrank_gemm.plan.planner.entry_serves`."""
    from lowrank_gemm.plan import planner as P
    hit = P.load_tuned(P.tuned_file("lora", torch.device("cuda"))).get(P.tuned_key(M, N, K, r, torch.bfloat16))
    return ("entry", hit["strategy"], KernelConfig.from_dict(hit["config"])) if hit else None


def probe_point(M, K, N, r, rule=False):
    cands = candidates(M, N, K, r)
    if rule:
        entry = bucket_entry(M, N, K, r)
        cands = [("rule", *rule_plan(M, N, K, r))] + ([entry] if entry else []) + cands
    return probe_candidates(M, K, N, r, cands, unfused=True)


def main(argv=None):
    ap = probe_arguments(__doc__, 300.0, 0.03)
    ap.add_argument("--from-json", type=Path, default=None, help="no GPU: rebuild the report from a saved run's rows")
    ap.add_argument("--kn", default=None, help="K×N shapes, e.g. 3584x18944,18944x3584 (default: KNS)")
    ap.add_argument("--ms", default=None, help="M values in order, e.g. 256,16 (default: MS)")
    ap.add_argument("--ranks", default=None, help="ranks, e.g. 16,64 (default: RANKS)")
    ap.add_argument("--rule", action="store_true", help="also time the rules' plan (table hidden) and the bucket's tuned entry")
    args = ap.parse_args(argv)
    kns = parse_shapes(args.kn) if args.kn else KNS
    ms = [int(v) for v in args.ms.split(",")] if args.ms else MS
    ranks = [int(v) for v in args.ranks.split(",")] if args.ranks else RANKS
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_json is not None:
        saved = json.loads(args.from_json.read_text())
        report(saved["rows"], saved["meta"], saved["skipped"], args)
        return
    meta = device_meta()
    rows, skipped = run_points([(M, K, N, r) for M in ms for K, N in kns for r in ranks],
                               lambda *pt: probe_point(*pt, rule=args.rule), args.budget_s,
                               args.out / "probe_lora_unseen.json", meta)
    report(rows, meta, skipped, args)


def report(rows, meta, skipped, args):
    """``probe_lora_unseen.md``, ``lora_h200_updates.json`` (winners over ``auto`` by > margin; the torch
    baseline is never a winner) and, with ``--write-tuned``, the merged table."""
    # never a table winner: torch's branch, and kcat (on unpacked weights it would keep a [W | B] copy per layer;
    # ``auto`` takes it only on the packed layout, kernels/lora_gemm.kcat_preferred)
    fused = [x for x in rows if x["label"] not in ("unfused", "kcat")]
    upd = {k: dict(v, source="scripts/probe_lora_unseen.py") for k, v in updates(fused, args.margin).items()}
    (args.out / "lora_h200_updates.json").write_text(json.dumps(upd, indent=1))
    table = []
    for (M, N, K, r) in dict.fromkeys((x["M"], x["N"], x["K"], x["r"]) for x in rows):
        rs = [x for x in rows if (x["M"], x["N"], x["K"], x["r"]) == (M, N, K, r)]
        cub = rs[0]["graph_us"]
        ok = [x for x in rs if x.get("graph_us") and x["label"] not in ("cublas", "unfused", "auto")]
        best = min(ok, key=lambda x: x["graph_us"]) if ok else None
        auto = next(x for x in rs if x["label"] == "auto")
        table.append([M, N, K, r, cub, next(x["x_cublas"] for x in rs if x["label"] == "unfused"),
                      f"{auto.get('x_cublas')} ({auto['strategy']})",
                      f"{best['x_cublas']} ({best['label']})" if best else "-",
                      " ".join(f"{x['label']}={x.get('x_cublas', 'err')}" for x in rs[3:])])
    md = (f"# LoRA plan families on untuned shapes\n\n{json.dumps(meta)}\n\n(× cuBLAS without the branch, CUDA-graph "
          f"medians; skipped: {skipped})\n\n" +
          markdown_table(["M", "N", "K", "r", "cuBLAS µs", "unfused", "auto", "best", "all"], table))
    (args.out / "probe_lora_unseen.md").write_text(md + "\n")
    print(md)
    if args.write_tuned is not None:
        merge_updates(args.write_tuned, upd, meta, "unseen_probe_runs")


if __name__ == "__main__":
    main()
