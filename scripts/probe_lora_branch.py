"""GPU probe (≈ 60 s): where the LoRA branch's 1.5–2.5 µs go at decode sizes (session 6 lead 1).

    PYTHONPATH=src python scripts/probe_lora_branch.py --out $OUT

For (K, N) ∈ {(4096, 4096), (8192, 8192), (4096, 28672)}, M=1, r ∈ {16, 64}, with the swap-AB plans of the tuned
table: CUDA-graph medians of cuBLAS, our rank-0 GEMM at the same tiles, ``split`` + swap with PDL on and off,
``kloop`` + swap (one launch), and per-kernel device durations from ``torch.profiler`` (down kernel, main
kernel) of one graph replay each — so the cost splits into the down kernel, the launch chain and the main
kernel's own epilogue. Every variant is checked against the float64 reference first (NaN-poisoned output).
Writes probe_lora_branch.json / .md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from lowrank_gemm.bench.common import device_meta, time_graph  # noqa: E402
from lowrank_gemm.kernels.lora_gemm import lora_options, run_strategy  # noqa: E402
from lowrank_gemm.plan.config import KernelConfig  # noqa: E402
from lowrank_gemm.plan.planner import block_r_for, lora_ledger, plan_lora, stages_for  # noqa: E402
from lowrank_gemm.reference import lora_linear_ref  # noqa: E402

SHAPES = [(4096, 4096), (8192, 8192), (4096, 28672)]


def _cfg(strategy, bn, bk, r):
    br = max(64, block_r_for(r)) if strategy == "kloop" else block_r_for(r)
    c = KernelConfig(block_m=16, block_n=bn, block_k=bk, block_r=br, group_m=1, num_warps=4, num_stages=2,
                     swap_ab=True)
    return c.replace(num_stages=stages_for(lambda s: lora_ledger(strategy, c.replace(num_stages=s))))


def kernel_times(fn):
    """{kernel name: device µs} of one CUDA-graph replay of fn (profiler, CUDA activity)."""
    g = torch.cuda.CUDAGraph()
    fn()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            g.replay()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if t and e.count:
            out[e.key[:60]] = round(t / e.count, 2)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for K, N in SHAPES:
        for r in (16, 64):
            g = torch.Generator(device="cuda").manual_seed(K + N + r)
            x = torch.randn(1, K, device="cuda", generator=g).bfloat16()
            ws = [(torch.randn(N, K, device="cuda", generator=g) / K**0.5).bfloat16() for _ in range(3)]
            la = (torch.randn(r, K, device="cuda", generator=g) / K**0.5).bfloat16()
            lb = (torch.randn(N, r, device="cuda", generator=g) / r**0.5).bfloat16()
            ref = lora_linear_ref(x, ws[0], la, lb, 0.5, None)
            s_today, c_today = plan_lora(1, N, K, r, torch.bfloat16, torch.device("cuda"))
            variants = {"cublas": ("cublas", None, True), f"today {s_today}": (s_today, c_today, True),
                        "rank0 @today": (s_today, c_today, True),
                        "split swap, PDL off": ("split", c_today if s_today == "split" else _cfg("split", 64, 256, r),
                                                False),
                        "kloop swap 64x128": ("kloop", _cfg("kloop", 64, 128, r), True),
                        "kloop swap 128x64": ("kloop", _cfg("kloop", 128, 64, r), True)}
            for name, (s, c, pdl) in variants.items():
                row = dict(K=K, N=N, r=r, M=1, variant=name, strategy=s, config=c.to_dict() if c else None, pdl=pdl)
                rank0 = name.startswith("rank0")

                def fn(w, s=s, c=c, pdl=pdl, rank0=rank0, o=None):
                    if s == "cublas":
                        return torch.nn.functional.linear(x, w)
                    with lora_options(pdl=pdl):
                        if rank0:
                            return run_strategy(s, x, w, la[:0], lb[:, :0], 0.5, None, c, out=o)
                        return run_strategy(s, x, w, la, lb, 0.5, None, c, out=o)
                try:
                    if s != "cublas":
                        o = torch.full((1, N), float("nan"), device="cuda", dtype=torch.bfloat16)
                        y = fn(ws[0], o=o)
                        torch.cuda.synchronize()
                        want = ref if not rank0 else (x.double() @ ws[0].double().T)
                        err = ((y.double() - want).norm() / want.norm()).item()
                        row["rel_err"] = float(f"{err:.2e}")
                        if not err < 1e-2:
                            raise RuntimeError(f"wrong: rel err {err}")
                    row["graph_us"] = round(time_graph(fn, [(w,) for w in ws]).median_us, 2)
                except Exception as exc:      # reported, not hidden
                    row["error"] = f"{type(exc).__name__}: {exc}"[:200]
                if "graph_us" in row:
                    try:
                        row["kernels"] = kernel_times(lambda: fn(ws[0]))
                    except Exception as exc:
                        row["kernels_error"] = f"{type(exc).__name__}: {exc}"[:200]
                rows.append(row)
                print(json.dumps(row), flush=True)
            del ws
            torch.cuda.empty_cache()
    (out / "probe_lora_branch.json").write_text(json.dumps({"meta": device_meta(), "rows": rows}, indent=1))
    lines = ["# LoRA branch cost at M=1 (swap-AB plans)\n", "| K×N | r | variant | graph µs | kernels (device µs) | err |",
             "|---|---|---|---|---|---|"]
    for r_ in rows:
        ks = "; ".join(f"{k}: {v}" for k, v in (r_.get("kernels") or {}).items())
        lines.append(f"| {r_['K']}×{r_['N']} | {r_['r']} | {r_['variant']} | {r_.get('graph_us', r_.get('error'))} | "
                     f"{ks} | {r_.get('rel_err', '')} |")
    (out / "probe_lora_branch.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
