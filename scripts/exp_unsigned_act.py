"""CPU experiment (≈ 1 min): int4 activations of the post-GELU layers quantized unsigned after a constant shift
(Nunchaku's fc2 scheme) instead of signed, on the embedded real model (all-MiniLM-L6-v2, ``quant/accuracy.py``).

The model is quantized once (svdquant, rank ``--rank``, refit, group 64, as the accuracy table's row). Then the six
``encoder.layer.*.output.dense`` layers, whose input is a GELU output (≥ −0.17), are scored twice on the eval
sentences with the same weights:
- ``signed``: today's activation quantizer, per 64-group q ∈ [−8, 7], scale = amax / 7;
- ``unsigned``: u = x/λ + c/λ with c = 0.171875 (Nunchaku's GELU shift), q = clamp(RNE(u / s), 0, 15),
  s = max(u) / 15, both rounded as today's 16-bit scale; dequantized as q·s − c/λ, so the constant shift term is
  exact (a kernel would fold W·(c/λ) into the bias).

Nothing is recalibrated for the unsigned rows. Metrics as in the accuracy table: the embedding cosine to fp32, the
Spearman correlation of pairwise similarities, and the local relative output error of the six layers.

    PYTHONPATH=src python scripts/exp_unsigned_act.py [--rank 32] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from lowrank_gemm.formats.int4 import GELU_SHIFT


def fake_quant_unsigned(xs: torch.Tensor, shift: torch.Tensor, group_size: int, scale_dtype) -> torch.Tensor:
    """dequant(quant_u4(xs + shift)) − shift, per token and group (float32)."""
    u = xs + shift
    m, k = u.shape
    g = u.reshape(m, k // group_size, group_size)
    s = (g.amax(-1, keepdim=True).clamp_min(0) / 15).to(scale_dtype).float()
    s = torch.where(s > 0, s, torch.ones_like(s))
    q = torch.clamp(torch.round(g / s), 0, 15)
    return (q * s).reshape(m, k) - shift


def _forward(layer, unsigned: bool):
    from lowrank_gemm.formats.int4 import dequantize_int4, quantize_act_int4
    from lowrank_gemm.quant.svdquant import lowrank_output
    lam = layer.smooth.float()
    shift = GELU_SHIFT / lam

    def fwd(x):
        x2 = x.reshape(-1, layer.in_features).float()
        xs = x2 / lam
        if unsigned:
            xa = fake_quant_unsigned(xs, shift, layer.group_size, layer.wscales.dtype)
        else:
            xa = dequantize_int4(*quantize_act_int4(xs, layer.group_size, layer.wscales.dtype), layer.group_size)
        y = lowrank_output(xa, xs, layer.dequantized_weight(), layer.lora_down.float(), layer.lora_up.float())
        if layer.bias is not None:
            y = y + layer.bias.float()
        return y.to(x.dtype).reshape(*x.shape[:-1], layer.out_features)
    return fwd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from lowrank_gemm.nn.svdq import SVDQLinear
    from lowrank_gemm.quant import accuracy as acc
    torch.manual_seed(0)
    base, tok = acc.load_minilm()
    calib = acc.tokenize(tok, acc.load_sentences("calib"))
    evalb = acc.tokenize(tok, acc.load_sentences("eval"))
    fp_emb = acc.embed(base, evalb)
    row, model = acc.evaluate_scheme(base, acc._svdq(a.rank, True), calib, evalb, fp_emb)
    fc2 = [n for n, m in model.named_modules() if isinstance(m, SVDQLinear) and n.endswith(".output.dense")
           and ".attention." not in n]
    rows = []
    for unsigned in (False, True):
        for n in fc2:
            model.get_submodule(n).forward = _forward(model.get_submodule(n), unsigned)
        emb = acc.embed(model, evalb)
        cos = (emb * fp_emb).sum(-1)
        errs = acc.layer_errors(model, {n: base.get_submodule(n) for n in fc2}, evalb)
        rows.append(dict(fc2_activations="unsigned" if unsigned else "signed", rank=a.rank,
                         mean_cos=round(float(cos.mean()), 5), min_cos=round(float(cos.min()), 5),
                         spearman=round(acc.spearman(acc.pairwise_similarities(emb),
                                                     acc.pairwise_similarities(fp_emb)), 5),
                         fc2_layer_err=round(sum(errs.values()) / len(errs), 5),
                         per_layer={k: round(v, 5) for k, v in errs.items()}))
        print(json.dumps(rows[-1]))
    result = {"meta": {**acc.metadata(), "model_row": {k: row[k] for k in ("mean_cos", "min_cos", "spearman",
                                                                           "layer_err")},
                       "shift": GELU_SHIFT, "unsigned_layers": fc2},
              "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
