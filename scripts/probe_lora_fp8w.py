"""Probe: LoRA on an fp8 base weight with 16-bit activations (``lora_linear(..., weight_scale=)``), the plan ``auto``
picks against tile / pipeline / swap-AB candidates of the same strategies, beside cuBLAS bf16, cuBLAS fp8 and W8A8.

    PYTHONPATH=src python scripts/probe_lora_fp8w.py --out DIR [--cases 1x28672x4096,...] [--budget-s 200]

Session 33's bench put auto_fp8w at 1.06× cuBLAS bf16 at M=1 and 2.0× at M=64 (N=28672, K=4096), where reading
half the bytes predicted ~0.55×: this asks whether any config of the widening kernels gets there. Every candidate
is checked against the float64 reference first (rel. err < 1e-2) and timed as a CUDA-graph replay over rotated
input sets. ``hilo_w8a8_unfused`` (M ≤ 64) asks whether x split into two e4m3 terms (hi + residual, each scaled per
token: about bf16's 8 significant bits) as 2M rows of the W8A8 kernel beats widening W: no conversion in the K loop,
twice the (idle at decode) MMA work; ``hilo_fused`` is the same from one quantizer launch into one kernel launch
(X_TERMS = 2: session 34 with two accumulators, session 35 one, the terms on one row scale). Writes DIR/probe_lora_fp8w.{json,md}; prints ``ROW {...}`` per row.
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

DEFAULT_CASES = "1x28672x4096,16x28672x4096,64x28672x4096,64x4096x4096,1024x28672x4096"


def candidates(M, base_strategy, base_cfg):
    out = [(base_strategy, base_cfg, "auto_plan"), (base_strategy, base_cfg.replace(swap_ab=not base_cfg.swap_ab),
                                                    "auto_plan_swap_toggled")]
    strategies = ("split", "kloop")
    if M <= 64:
        bm = max(16, 1 << (M - 1).bit_length())
        for s, bn, bk, st in itertools.product(strategies, (64, 128), (128, 256), (4, 6)):
            out.append((s, base_cfg.replace(block_m=bm, block_n=bn, block_k=bk, num_stages=st, swap_ab=True,
                                            num_warps=4, split_k=1, s_producers=0), f"{s}:swap:{bm}x{bn}x{bk}:st{st}"))
    else:
        for s, (bn, bk, w), st in itertools.product(strategies, ((128, 64, 4), (128, 128, 8), (256, 64, 8)), (3, 4)):
            out.append((s, base_cfg.replace(block_m=128, block_n=bn, block_k=bk, num_stages=st, swap_ab=False,
                                            num_warps=w, split_k=1, s_producers=0), f"{s}:{128}x{bn}x{bk}:w{w}:st{st}"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--no-sweep", action="store_true", help="baselines, auto and the hi/lo rows only")
    args = ap.parse_args()
    from lowrank_gemm.bench import lora as bl
    from lowrank_gemm.bench.common import (device_meta, markdown_table, meta_header, parse_shapes, time_graph,
                                           write_results)
    from lowrank_gemm.kernels import lora_gemm as LG
    from lowrank_gemm.kernels.row_quant import fp8_rows
    from lowrank_gemm.plan.planner import can_implement, plan_lora
    from lowrank_gemm.reference import lora_linear_ref

    t0 = time.time()
    meta = device_meta()
    rows = []
    r = 16
    fns = bl.impls()
    for M, N, K in parse_shapes(args.cases, 3):
        sets = bl.make_sets(M, N, K, r, torch.bfloat16, "cuda")
        f8 = bl.fp8_sets(sets)
        x, w8, a, b, ws = f8[0][:5]
        ref = lora_linear_ref(x, w8, a, b, bl.SCALE, None, weight_scale=ws)

        def add(impl, us, err=None):
            rows.append(dict(M=M, N=N, K=K, impl=impl, graph_us=None if us is None else round(us, 3),
                             err=None if err is None else float(f"{err:.3g}")))
            print("ROW", rows[-1], flush=True)

        add("cublas_bf16", time_graph(fns["cublas_base"], sets).median_us)
        for name in ("fp8_scaled_mm", "auto_w8a8", "auto_fp8w"):
            add(name, time_graph(fns[name], f8).median_us)
        if M <= 64:
            hilo_plan = LG._fp8_weight_plan(*plan_lora(2 * M, N, K, r, torch.bfloat16, x.device), 2 * M, N, K, r,
                                            torch.bfloat16, x.device, True)

            def hilo(x_, w_, a_, b_, ws_, *_):
                """x as two e4m3 terms (x ≈ hi·s_hi + lo·s_lo: ~8 significant bits, bf16's own) stacked as 2M
                rows of one fp8 × fp8 GEMM; S from [x; 0], the halves summed after (unfused: a feasibility row)."""
                hi, s_hi = fp8_rows(x_)
                lo, s_lo = fp8_rows(x_.float() - hi.float() * s_hi[:, None])
                y2 = LG.run_strategy(hilo_plan[0], torch.cat([x_, torch.zeros_like(x_)]), w_, a_, b_, bl.SCALE,
                                     None, hilo_plan[1], weight_scale=ws_,
                                     x_fp8=(torch.cat([hi, lo]), torch.cat([s_hi, s_lo])))
                return y2[:M] + y2[M:]
            y = hilo(*f8[0])
            add("hilo_w8a8_unfused", time_graph(hilo, f8).median_us,
                float(((y.double() - ref).norm() / ref.norm()).item()))
        w8a8_plan = LG._fp8_weight_plan(*plan_lora(M, N, K, r, torch.bfloat16, x.device), M, N, K, r,
                                        torch.bfloat16, x.device, True)

        def hilo_fused(x_, w_, a_, b_, ws_, *_):
            """The same two terms from one quantizer launch (fp8_rows terms=2) into one W8A8 launch whose K loop
            feeds both into one accumulator (X_TERMS = 2; the terms share the row scale)."""
            return LG.run_strategy(w8a8_plan[0], x_, w_, a_, b_, bl.SCALE, None, w8a8_plan[1], weight_scale=ws_,
                                   x_fp8=fp8_rows(x_, terms=2))
        y = hilo_fused(*f8[0])
        add("hilo_fused", time_graph(hilo_fused, f8).median_us, float(((y.double() - ref).norm() / ref.norm()).item()))
        if args.no_sweep:
            continue
        planned = plan_lora(M, N, K, r, torch.bfloat16, x.device)
        strategy, cfg = LG._fp8_weight_plan(*planned, M, N, K, r, torch.bfloat16, x.device)
        print("PLAN", M, N, K, strategy, cfg, flush=True)
        for s, c, label in candidates(M, strategy, cfg):
            if time.time() - t0 > args.budget_s:
                add(label + ":skipped_budget", None)
                continue
            if not can_implement(s, (M, N, K, r), c):
                continue
            try:
                y = LG.run_strategy(s, x, w8, a, b, bl.SCALE, None, c, weight_scale=ws)
                err = float(((y.double() - ref).norm() / ref.norm()).item())
                if not err < 1e-2:
                    add(label + ":WRONG", None, err)
                    continue
                us = time_graph(lambda x_, w_, a_, b_, ws_, *_: LG.run_strategy(
                    s, x_, w_, a_, b_, bl.SCALE, None, c, weight_scale=ws_), f8).median_us
                add(label, us, err)
            except Exception as exc:  # a candidate that cannot compile or launch is reported, not fatal
                add(f"{label}:{type(exc).__name__}", None)
    write_results("probe_lora_fp8w", meta, rows, args.out, md=meta_header(meta) + "\n" + markdown_table(
        list(rows[0]), [list(r_.values()) for r_ in rows]))

if __name__ == "__main__":
    main()
