"""Probe: multi-LoRA on an fp8 base weight (``multi_lora_linear(..., weight_scale=, fp8_activations=)``) beside
cuBLAS bf16 / fp8 without adapters and the bf16 multi-LoRA op, one process, CUDA-graph replays over rotated inputs.

    PYTHONPATH=src python scripts/probe_multilora_fp8.py --out DIR [--cases M x N x K x adapters, …]

Rows: ``cublas_bf16`` (x·Wᵀ), ``fp8_scaled_mm`` (e4m3 × e4m3, per-token / per-channel scales, x pre-quantized: no
branch), ``ml_bf16`` (the op on the bf16 W), ``ml_w8a16`` (fp8 W widened on chip; ``ml_w8a16_tuned_bk``: on the
tuned table's K step instead of ``fp8_plan``'s 128), ``ml_w8a8`` / ``ml_w8a8x2`` (x per token in one / two e4m3
terms, quantized inside the call). ``--w8a16-tiles`` adds ``ml_w8a16:BMxBNxBKwW`` rows: the W8A16 plan's main tile
replaced by that swapped tile (the deepest ring the ledger fits) where fp8_plan gave a 128×256 tile, which spills
128 bytes per thread at sm_90 (NOTES.md, session 36, lists the tiles that do not). Every fp8 row is first checked
against float64 on its own quantized operands (rel. err < 1e-2; ``err`` is against the bf16 W's exact result).
Rank 16, ids drawn over the adapters (−1 = base only included), ``max_adapters`` = the adapter count. Writes
DIR/probe_multilora_fp8.{json,md}.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

DEFAULT_CASES = ("1x28672x4096x4,16x28672x4096x4,16x28672x4096x16,64x28672x4096x16,256x28672x4096x16,"
                 "16x4096x4096x4,64x4096x4096x16,1024x4096x4096x64")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--w8a16-tiles", default="", help="e.g. 128x128x64w8,64x256x64w8 (swapped W8A16 tiles to A/B)")
    args = ap.parse_args()
    from lowrank_gemm.bench.common import parse_shapes
    tiles = []
    for t in filter(None, args.w8a16_tiles.split(",")):
        dims, _, warps = t.partition("w")
        tiles.append((t, *parse_shapes(dims, dims=3)[0], int(warps or 8)))
    from lowrank_gemm.bench.common import device_meta, markdown_table, meta_header, time_graph, write_results
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

        def tile_override(fn, bm, bn, bk, warps):
            """The W8A16 row with fp8_plan's 128×256 main tile replaced by a swapped bm×bn×bk tile on ``warps``."""
            def plan_with_tile(plan, terms, _keep=mg.fp8_plan):
                p = _keep(plan, terms)
                if terms or (p.main.block_m, p.main.block_n) != (128, 256):
                    return p
                for stages in range(6, 1, -1):
                    main = p.main.replace(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages,
                                          swap_ab=True)
                    if main.swap_ab_mismatch() is None and mg.can_implement(
                            main, 16, p.fuse_d, p.epi_d, p.epi_pipe, p.b_vec,
                            p.append_stages if p.expand == "appended" else 0, p.append_d):
                        print(f"  tile {bm}x{bn}x{bk}w{warps}: {main}", flush=True)
                        return replace(p, main=main)
                raise SystemExit(f"no ring of {bm}x{bn}x{bk}w{warps} fits the ledger")

            def wrapped(*a_):
                keep, mg.fp8_plan = mg.fp8_plan, plan_with_tile
                try:
                    return fn(*a_)
                finally:
                    mg.fp8_plan = keep
            return wrapped

        fns = {"cublas_bf16": lambda x, w, *_: x @ w.T,
               "fp8_scaled_mm": lambda x, w, w8, ws, *rest: torch._scaled_mm(
                   rest[-2], w8.T, scale_a=rest[-1][:, None], scale_b=ws[None, :], out_dtype=torch.bfloat16),
               "ml_bf16": ml(False, 0), "ml_w8a16": ml(True, 0), "ml_w8a16_tuned_bk": tuned_bk(ml(True, 0)),
               "ml_w8a8": ml(True, 1), "ml_w8a8x2": ml(True, 2),
               **{f"ml_w8a16:{t}": tile_override(ml(True, 0), bm, bn, bk, wp) for t, bm, bn, bk, wp in tiles}}
        s0 = sets[0]
        exact = multi_lora_linear_ref(s0[0], s0[1], s0[4], s0[5], s0[8], s0[7], s0[6])
        base = None
        for name, fn in fns.items():
            err = None
            if name.startswith("ml_"):
                y = fn(*s0)
                err = float((y.double() - exact).norm() / exact.norm())
                if name != "ml_bf16":
                    terms = {"ml_w8a8": 1, "ml_w8a8x2": 2}.get(name, 0)
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
