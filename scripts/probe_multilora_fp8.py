"""Probe: multi-LoRA on an fp8 base weight (``multi_lora_linear(..., weight_scale=, fp8_activations=)``) beside
cuBLAS bf16 / fp8 without adapters and the bf16 multi-LoRA op, one process, CUDA-graph replays over rotated inputs.

    PYTHONPATH=src python scripts/probe_multilora_fp8.py --out DIR [--cases M x N x K x adapters, …]

Rows: ``cublas_bf16`` (x·Wᵀ), ``fp8_scaled_mm`` (e4m3 × e4m3, per-token / per-channel scales, x pre-quantized: no
branch), ``ml_bf16`` (the op on the bf16 W), ``ml_w8a16`` (fp8 W widened on chip; ``ml_w8a16_tuned_bk``: on the
tuned table's K step instead of ``fp8_plan``'s 128), ``ml_w8a8`` / ``ml_w8a8x2`` (x per
token in one / two e4m3 terms, quantized inside the call). Every fp8 row is first checked against float64 on its own
quantized operands (rel. err < 1e-2; ``err`` is against the bf16 W's exact result). Rank 16, ids drawn over the
adapters (−1 = base only included), ``max_adapters`` = the adapter count. Writes DIR/probe_multilora_fp8.{json,md}.
"""

from __future__ import annotations

import argparse

import torch

DEFAULT_CASES = ("1x28672x4096x4,16x28672x4096x4,16x28672x4096x16,64x28672x4096x16,256x28672x4096x16,"
                 "16x4096x4096x4,64x4096x4096x16,1024x4096x4096x64")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=DEFAULT_CASES)
    args = ap.parse_args()
    from lowrank_gemm.bench.common import (device_meta, markdown_table, meta_header, parse_shapes, time_graph,
                                           write_results)
    from lowrank_gemm.kernels import multilora_gemm as mg
    from lowrank_gemm.kernels.multilora_gemm import multi_lora_linear
    from lowrank_gemm.kernels.row_quant import fp8_rows
    from lowrank_gemm.reference import multi_lora_linear_ref

    meta, rows, r = device_meta(), [], 16
    for M, N, K, L in parse_shapes(args.cases, dims=4):
        g = torch.Generator(device="cuda").manual_seed(M + N + L)
        sets = []
        for _ in range(3):
            x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
            w = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).bfloat16()
            w8, ws = fp8_rows(w)
            a = (torch.randn(L, r, K, device="cuda", generator=g) / K ** 0.5).bfloat16()
            b = (torch.randn(L, N, r, device="cuda", generator=g) * 0.1).bfloat16()
            ids = torch.randint(-1, L, (M,), device="cuda", generator=g, dtype=torch.int32)
            x8, xs = fp8_rows(x)
            sets.append((x, w, w8, ws, a, b, torch.full((L,), r, dtype=torch.int32, device="cuda"),
                         torch.ones(L, device="cuda"), ids, x8, xs))

        def ml(wkind, terms):
            def fn(x, w, w8, ws, a, b, ranks, scales, ids, *_):
                return multi_lora_linear(x, w8 if wkind else w, a, b, ranks, scales, ids, weight_scale=ws if wkind
                                         else None, fp8_activations=terms, validate=False, max_adapters=L)
            return fn

        def tuned_bk(fn):
            """The W8A16 row on the tuned table's K step (``fp8_plan`` without its 128-wide K rule), for the A/B."""
            def wrapped(*a_):
                keep, mg.FP8_W_BLOCK_K = mg.FP8_W_BLOCK_K, 0
                try:
                    return fn(*a_)
                finally:
                    mg.FP8_W_BLOCK_K = keep
            return wrapped

        fns = {"cublas_bf16": lambda x, w, *_: x @ w.T,
               "fp8_scaled_mm": lambda x, w, w8, ws, *rest: torch._scaled_mm(
                   rest[-2], w8.T, scale_a=rest[-1][:, None], scale_b=ws[None, :], out_dtype=torch.bfloat16),
               "ml_bf16": ml(False, 0), "ml_w8a16": ml(True, 0), "ml_w8a16_tuned_bk": tuned_bk(ml(True, 0)),
               "ml_w8a8": ml(True, 1), "ml_w8a8x2": ml(True, 2)}
        s0 = sets[0]
        exact = multi_lora_linear_ref(s0[0], s0[1], s0[4], s0[5], s0[8], s0[7], s0[6])
        base = None
        for name, fn in fns.items():
            err = None
            if name.startswith("ml_"):
                y = fn(*s0)
                err = float((y.double() - exact).norm() / exact.norm())
                if name != "ml_bf16":
                    terms = {"ml_w8a16": 0, "ml_w8a16_tuned_bk": 0, "ml_w8a8": 1, "ml_w8a8x2": 2}[name]
                    xq = s0[0] if not terms else (lambda q, s: (q.double().reshape(terms, M, K).sum(0)
                                                               * s.double()[:, None]))(*fp8_rows(s0[0], terms=terms))
                    own = multi_lora_linear_ref(s0[0], s0[2].double() * s0[3].double()[:, None], s0[4], s0[5], s0[8],
                                                s0[7], s0[6])
                    own = own + (xq.double() - s0[0].double()) @ (s0[2].double() * s0[3].double()[:, None]).T
                    own_err = float((y.double() - own).norm() / own.norm())
                    if own_err > 1e-2:
                        print(f"SKIP {name} M={M} N={N} L={L}: rel. err {own_err:.3g} against its own operands")
                        continue
            t = time_graph(fn, sets).median_us
            base = t if name == "cublas_bf16" else base
            row = dict(M=M, N=N, K=K, adapters=L, r=r, impl=name, graph_us=round(t, 2),
                       vs_cublas=round(t / base, 3), err=None if err is None else round(err, 5))
            rows.append(row)
            print("ROW", row, flush=True)
    md = meta_header(meta) + markdown_table(["M", "N", "K", "adapters", "impl", "graph µs", "× cuBLAS bf16", "err"],
                                            [[r_["M"], r_["N"], r_["K"], r_["adapters"], r_["impl"], r_["graph_us"],
                                              r_["vs_cublas"], r_["err"]] for r_ in rows])
    write_results("probe_multilora_fp8", meta, rows, args.out, md=md)
    print(md)


if __name__ == "__main__":
    main()
