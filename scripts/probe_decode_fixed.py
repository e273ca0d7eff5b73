"""GPU probe (≈ 40 s): what the low-rank branch and the bias cost in the M = 1 decode layer's fixed part.

Session 13 found the act_quant + GEMV layer linear in N, with ~6.8 µs fixed at K = 4096 (NOTES.md). Graph µs in
one process, three rotated weight sets of 62 MB (past the L2):
- the layer with rank 32 or rank 0, with or without bias;
- the GEMV alone, with or without the S·Bᵀ epilogue.
Rank 0 drops act_quant's S programs and the GEMV's up-projection loads. The difference is the branch's share of the
fixed cost.

    PYTHONPATH=src python scripts/probe_decode_fixed.py --out $OUT [--n 28672] [--fmt int4_g64]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main() -> int:
    import torch
    from lowrank_gemm.bench.common import device_meta, time_impl
    from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
    from lowrank_gemm.kernels.act_quant import act_quant
    from lowrank_gemm.kernels.w4a4_gemv import launch_w4a4_gemv
    from lowrank_gemm.ops import w4a4_linear

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".")
    ap.add_argument("--n", type=int, default=28672)
    ap.add_argument("--k", type=int, default=4096)
    a = ap.parse_args()
    dev, bf = "cuda", torch.bfloat16
    n, k = a.n, a.k
    rows = []
    x = [torch.randn(1, k, device=dev, dtype=bf) for _ in range(3)]
    w = [torch.randn(n, k, device=dev, dtype=bf) * 0.02 for _ in range(3)]
    rows.append(dict(impl="cublas_bf16", **time_impl(lambda xx, ww: xx @ ww.T, list(zip(x, w)))))
    layers = []
    for s in range(3):
        q, sc = quantize_weight_int4(torch.randn(n, k, device=dev) * 0.02, 64)
        layers.append(dict(qweight=pack_int4(q), wscales=sc, smooth=(torch.rand(k, device=dev) + 0.5).to(bf),
                           lora_down=(torch.randn(32, k, device=dev) * 0.02).to(bf),
                           lora_up=(torch.randn(n, 32, device=dev) * 0.02).to(bf),
                           bias=torch.randn(n, device=dev, dtype=bf)))
    del w
    for rank in (32, 0):
        for bias in (True, False):
            def layer(xx, p, rank=rank, bias=bias):
                return w4a4_linear(xx, p["qweight"], p["wscales"], p["smooth"], p["lora_down"][:rank],
                                   p["lora_up"][:, :rank].contiguous() if rank else p["lora_up"][:, :0],
                                   p["bias"] if bias else None)
            rows.append(dict(impl=f"layer r{rank}{' bias' if bias else ''}",
                             **time_impl(layer, list(zip(x, layers)))))
            print(rows[-1], flush=True)
    # the GEMV alone on act_quant's outputs (computed once per set, outside the timing)
    ops = []
    for xx, p in zip(x, layers):
        xq, xs, s = act_quant(xx, p["smooth"], p["lora_down"], 64, "int4_g64", bf)
        ops.append((xq, xs, p["qweight"], p["wscales"], s, p["lora_up"], p["bias"], torch.empty(1, n, device=dev, dtype=bf)))
    for lowrank in (True, False):
        def gemv(xq, xs, wq, ws, s, up, b, out, lowrank=lowrank):
            return launch_w4a4_gemv(xq, xs, wq, ws, None, s if lowrank else None, up if lowrank else None, b, out)
        rows.append(dict(impl=f"gemv {'r32' if lowrank else 'r0'} bias", **time_impl(gemv, ops)))
        print(rows[-1], flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe_decode_fixed.json").write_text(json.dumps({"meta": device_meta(), "n": n, "k": k, "rows": rows},
                                                             indent=1))
    lines = [f"| {r['impl']} | {r.get('graph_us')} | {r['median_us']} |" for r in rows]
    text = "| impl | graph µs | eager µs |\n|---|---|---|\n" + "\n".join(lines) + "\n"
    (out / "probe_decode_fixed.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
