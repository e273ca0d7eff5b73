"""How much of the MiniLM accuracy table is fp32 rounding noise (CPU).

Every quantizer rounds, so a one-ulp change in a weight or an activation can flip a code, and the table's rows can
move between machines whose BLAS sums in another order (session 41 saw min_cos move by up to 0.004 with the
quantizers bit-identical). This reruns chosen rows with every base-model parameter multiplied by (1 + 2⁻²⁴·ε),
ε ~ N(0, 1) per element and seed (seed 0: the model as loaded), and reports each metric's spread over the seeds.
A difference between two rows smaller than that spread is not a finding.

    python scripts/probe_accuracy_noise.py --seeds 8 --out benchmarks/results/accuracy/minilm_noise.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch

from lowrank_gemm.quant import accuracy as acc

METRICS = ("mean_cos", "min_cos", "spearman", "layer_err")
ROWS = {
    "w4a4_rtn": acc.SchemeSpec("w4a4_rtn"),
    "svdquant r32 refit": acc._svdq(32, True),
    "svdquant r32 refit, int4_2l": acc._svdq(32, True, weight_format="int4_2l"),
    "svdquant r64 refit": acc._svdq(64, True),
    "svdquant r32 refit, e4m3 act": acc._svdq(32, True, act_bits=8),
}


def perturbed(base: torch.nn.Module, seed: int) -> torch.nn.Module:
    model = copy.deepcopy(base)
    if seed:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + 2.0 ** -24 * torch.randn(p.shape, generator=gen))
    return model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8, help="runs per row, the first on the unperturbed model")
    parser.add_argument("--out", default="benchmarks/results/accuracy/minilm_noise.json")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    base0, tokenizer = acc.load_minilm()
    calib = acc.tokenize(tokenizer, acc.load_sentences("calib"))
    evalb = acc.tokenize(tokenizer, acc.load_sentences("eval"))
    runs: dict[str, list[dict]] = {}
    for seed in range(args.seeds):
        base = perturbed(base0, seed)
        fp_emb = acc.embed(base, evalb)
        for name, spec in ROWS.items():
            row, _ = acc.evaluate_scheme(base, spec, calib, evalb, fp_emb)
            runs.setdefault(name, []).append({m: row[m] for m in METRICS})
        print(f"seed {seed}: " + "; ".join(f"{n} {r[-1]['mean_cos']:.4f}/{r[-1]['min_cos']:.4f}"
                                           for n, r in runs.items()), flush=True)
    summary = {name: {m: {"min": min(r[m] for r in rs), "max": max(r[m] for r in rs),
                          "stdev": statistics.stdev(r[m] for r in rs) if len(rs) > 1 else 0.0}
                      for m in METRICS} for name, rs in runs.items()}
    meta = {**acc.metadata(), "seeds": args.seeds, "perturbation": "p *= 1 + 2^-24 * N(0,1) per element, seed > 0"}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=2) + "\n")
    lines = [f"# MiniLM accuracy table: spread under one-ulp weight perturbations ({args.seeds} runs per row)\n",
             f"{meta['date']}, {meta['device']}, torch {meta['torch']}; `scripts/probe_accuracy_noise.py`. "
             "Run 0 is the model as loaded; runs 1… multiply every parameter by (1 + 2⁻²⁴·N(0, 1)). "
             "Each cell: min – max over the runs (stdev).\n",
             "| row | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
    for name, s in summary.items():
        lines.append(f"| {name} | " + " | ".join(f"{s[m]['min']:.4f} – {s[m]['max']:.4f} ({s[m]['stdev']:.4f})"
                                                 for m in METRICS) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out} and {out.with_suffix('.md')} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
