"""Accuracy of other activation formats beside int4_g64 weights (CPU, the embedded MiniLM; session 41).

On Hopper the W4A4 kernels compute in 8 bits whatever the activations' storage, so the activation format is a free
choice of the runtime: the weights (and a Nunchaku checkpoint's 16-bit group scales) stay as they are. This scores
the SVDQuant r = 32 refit model (int4_g64 weights) with its activations quantized as:

- ``g64``   int4, group 64, a 16-bit scale per group (the standard format: the README's row),
- ``p2``    int4, group 64, the group's scale a power of two times a per-token fp32 scale (the group exponent folds
            into an e4m3 operand exactly, so the GEMM's per-group rescale is one multiply by the weight scale),
- ``e4m3``  float8 e4m3 with a per-token fp32 scale (W4A8),
- ``e4m3_g64`` float8 e4m3 with a per-group scale.

    python scripts/probe_act_formats.py [--out results.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from lowrank_gemm.quant import accuracy as acc
from lowrank_gemm.quant import svdquant as sq
from lowrank_gemm.nn import svdq as svdq_mod

E4M3_MAX = 448.0


def _groups(xs, g):
    m, k = xs.shape
    return xs.reshape(m, k // g, g)


def act_g64(xs, g):
    q, s = sq.quantize_act_int4(xs, g, torch.bfloat16)
    return sq.dequantize_int4(q, s, g).to(xs.dtype)


def act_p2(xs, g, emin=-9, emax=6):
    """Per-token t = amax/(7·2^emax); group scale t·2^e with the smallest e ≥ emin whose range holds the group."""
    x = _groups(xs.float(), g)
    row = x.abs().amax(dim=(1, 2), keepdim=True)
    t = torch.where(row > 0, row / (7.0 * 2.0 ** emax), torch.ones_like(row))
    gmax = x.abs().amax(dim=2, keepdim=True)
    e = torch.ceil(torch.log2(torch.clamp(gmax / (7.0 * t), min=2.0 ** emin))).clamp(emin, emax)
    scale = t * torch.exp2(e)
    q = torch.clamp(torch.round(x / scale), -8, 7)
    return (q * scale).reshape(xs.shape).to(xs.dtype)


def act_e4m3_row(xs, g):
    x = xs.float()
    row = x.abs().amax(dim=1, keepdim=True)
    s = torch.where(row > 0, row / E4M3_MAX, torch.ones_like(row))
    return ((x / s).to(torch.float8_e4m3fn).float() * s).to(xs.dtype)


def act_e4m3_g64(xs, g):
    x = _groups(xs.float(), g)
    gm = x.abs().amax(dim=2, keepdim=True)
    s = torch.where(gm > 0, gm / E4M3_MAX, torch.ones_like(gm))
    return ((x / s).to(torch.float8_e4m3fn).float() * s).reshape(xs.shape).to(xs.dtype)


VARIANTS = {"g64": act_g64, "p2": act_p2, "e4m3": act_e4m3_row, "e4m3_g64": act_e4m3_g64}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--rank", type=int, default=32)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    base, tok = acc.load_minilm()
    calib = acc.tokenize(tok, acc.load_sentences("calib"))
    evalb = acc.tokenize(tok, acc.load_sentences("eval"))
    fp_emb = acc.embed(base, evalb)
    row, model = acc.evaluate_scheme(base, acc._svdq(args.rank, True), calib, evalb, fp_emb)
    print("standard row:", acc.format_row(row))
    names = [n for n, m in model.named_modules() if isinstance(m, svdq_mod.SVDQLinear)]
    reference = {n: base.get_submodule(n) for n in names}
    original = svdq_mod.fake_quant_act
    rows = []
    try:
        for name, fn in VARIANTS.items():
            svdq_mod.fake_quant_act = lambda xs, bits, g, dt, shift=None, fn=fn: fn(xs, g)
            emb = acc.embed(model, evalb)
            cos = (emb * fp_emb).sum(-1)
            errs = acc.layer_errors(model, reference, evalb)
            r = {"act": name, "mean_cos": float(cos.mean()), "min_cos": float(cos.min()),
                 "spearman": acc.spearman(acc.pairwise_similarities(emb), acc.pairwise_similarities(fp_emb)),
                 "layer_err": sum(errs.values()) / len(errs)}
            rows.append(r)
            print(f"{name:9s} mean cos {r['mean_cos']:.4f}  min {r['min_cos']:.4f}  spearman {r['spearman']:.4f}  "
                  f"layer err {r['layer_err']:.4f}")
    finally:
        svdq_mod.fake_quant_act = original
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rank": args.rank, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
