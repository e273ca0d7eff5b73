"""GPU probe (≈ 40 s): the W8A8 LoRA op (an fp8 base weight, ``fp8_activations`` 1 or 2) split into its two launches —
the per-token quantizer (``row_quant.fp8_rows``) alone, the main kernel alone on pre-quantized x
(``lora_gemm.run_strategy`` with ``x_fp8``, the plan ``auto`` picks), and the whole op — in one process, CUDA-graph
replays over rotated weight sets. Why: in every ``bench lora --fp8`` since session 35 the two-term op takes ~5 µs more
at M = 1 than at M = 16 (H200 46.5 vs 41.7 µs, N = 28672), the one-term op the same at both.

    PYTHONPATH=src python scripts/probe_w8a8_parts.py --out DIR [--ms 1,2,4,8,16] [--shapes N:K,…]

Writes DIR/probe_w8a8_parts.{json,md}.
"""

from __future__ import annotations

import argparse

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ms", default="1,2,4,8,16")
    ap.add_argument("--shapes", default="28672:4096")
    ap.add_argument("--rank", type=int, default=16)
    a = ap.parse_args()
    from _decode_probe import graph_row, write_err_table
    from lowrank_gemm.bench.common import device_meta, rotation_count
    from lowrank_gemm.kernels import lora_gemm as lg
    from lowrank_gemm.kernels.row_quant import fp8_rows
    from lowrank_gemm.plan.planner import plan_lora
    from lowrank_gemm.reference import lora_linear_ref

    meta, rows = device_meta(), []

    def row(*args, **kw):
        graph_row(rows, *args, **kw)

    r = a.rank
    for shape in a.shapes.split(","):
        N, K = (int(v) for v in shape.split(":"))
        g = torch.Generator(device="cuda").manual_seed(N + K)
        ws = []
        for _ in range(min(3, rotation_count(N * K))):
            w8, wsc = fp8_rows(torch.randn(N, K, device="cuda", generator=g).bfloat16())
            ws.append(dict(weight=w8, weight_scale=wsc))
        lora_a = (torch.randn(r, K, device="cuda", generator=g) * 0.02).bfloat16()
        lora_b = (torch.randn(N, r, device="cuda", generator=g) * 0.02).bfloat16()
        bias = torch.randn(N, device="cuda", generator=g).bfloat16()
        for M in (int(v) for v in a.ms.split(",")):
            xs = [torch.randn(M, K, device="cuda", generator=g).bfloat16() for _ in ws]
            for terms in (1, 2):
                tag = f"x{terms}:"
                row(M, K, N, tag + "fp8_rows", lambda x, terms=terms: fp8_rows(x, terms=terms), [(x, ) for x in xs])
                strategy, cfg = plan_lora(M, N, K, r, torch.bfloat16, xs[0].device)
                strategy, cfg = lg._fp8_weight_plan(strategy, cfg, M, N, K, r, torch.bfloat16, xs[0].device, terms)
                pre = [(x, fp8_rows(x, terms=terms), w) for x, w in zip(xs, ws)]

                def main_kernel(x, x8, w, strategy=strategy, cfg=cfg):
                    return lg.run_strategy(strategy, x, w["weight"], lora_a, lora_b, 1.0, bias, cfg,
                                           weight_scale=w["weight_scale"], x_fp8=x8)
                row(M, K, N, tag + f"main:{strategy}:{cfg.block_m}x{cfg.block_n}x{cfg.block_k}"
                    f"{':swap' if cfg.swap_ab else ''}", main_kernel, pre)

                def op(x, w, terms=terms):
                    return lg.lora_linear(x, w["weight"], lora_a, lora_b, 1.0, bias, weight_scale=w["weight_scale"],
                                          fp8_activations=terms if terms == 2 else True)
                ref = lora_linear_ref(xs[0], ws[0]["weight"], lora_a, lora_b, 1.0, bias,
                                      weight_scale=ws[0]["weight_scale"]).cpu()
                y = op(xs[0], ws[0]).double().cpu()
                row(M, K, N, tag + "op", op, list(zip(xs, ws)), float((y - ref).norm() / ref.norm()))
    write_err_table("probe_w8a8_parts", meta, rows, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
