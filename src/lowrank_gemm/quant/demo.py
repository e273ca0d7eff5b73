"""CPU demo: quantize all-MiniLM-L6-v2 with SVDQuant (W4A4, r=32, g64, refit) and RTN for contrast."""

from __future__ import annotations

import time

from .accuracy import (
    COLUMNS,
    SchemeSpec,
    embed,
    evaluate_scheme,
    format_row,
    load_minilm,
    load_sentences,
    tokenize,
)

DEMO_SCHEMES = (SchemeSpec("w4a4_rtn"), SchemeSpec("svdquant", (("rank", 32), ("group_size", 64), ("refit", True))))


def run_svdquant_demo(print_fn=print) -> list[dict]:
    """Quantize MiniLM twice, print an accuracy table and the linear layers' memory; returns the rows."""
    start = time.perf_counter()
    base, tokenizer = load_minilm()
    calib = tokenize(tokenizer, load_sentences("calib"))
    evalb = tokenize(tokenizer, load_sentences("eval"))
    fp_emb = embed(base, evalb)
    print_fn(f"all-MiniLM-L6-v2: {len(load_sentences('calib'))} calibration / {len(load_sentences('eval'))} evaluation sentences; "
             "quantizing the 36 nn.Linear of the encoder")
    rows, memory = [], []
    for spec in DEMO_SCHEMES:
        row, model = evaluate_scheme(base, spec, calib, evalb, fp_emb)
        rows.append(row)
        memory.append(_linear_memory(base, model))
    print_fn(" | ".join(COLUMNS))
    for row in rows:
        print_fn(format_row(row))
    fp32, bf16, _ = memory[0]
    print_fn(f"linear-layer weights: fp32 {fp32 / 2**20:.2f} MiB, bf16 {bf16 / 2**20:.2f} MiB")
    for row, (_, _, stored) in zip(rows, memory):
        print_fn(f"  {row['scheme']:>9} r={row['rank']}: {stored / 2**20:.2f} MiB "
                 f"({stored / bf16:.3f}× bf16, {row['bits_per_weight']:.2f} bits/weight)")
    print_fn(f"demo took {time.perf_counter() - start:.1f} s")
    return rows


def _linear_memory(base, quantized) -> tuple[int, int, int]:
    """(fp32 bytes, bf16 bytes, stored quantized bytes) of the converted layers' weights (biases excluded)."""
    names = [n for n, m in quantized.named_modules() if hasattr(m, "stored_bytes")]
    weights = sum(base.get_submodule(n).weight.numel() for n in names)
    return 4 * weights, 2 * weights, sum(quantized.get_submodule(n).stored_bytes() for n in names)


if __name__ == "__main__":
    run_svdquant_demo()
