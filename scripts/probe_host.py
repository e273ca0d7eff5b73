"""GPU probe (≈ 30 s): host time per eager call of the public ops, and where it goes.

The benches show eager medians far above the graph replays for our ops (bench lora, b48d881: 4096², r = 16, M = 1
149 µs eager vs 14.6 graph, cuBLAS 19.4 eager; bench w4a4 decode layer, M = 1: ~300 µs eager vs 21 graph), i.e. the
eager path is bound by the host. Per op: the host time of one call (perf_counter over back-to-back calls, no sync
between them, the GPU queue kept short by a sync every 20 calls), next to ``x @ w.T``; then cProfile of 200 calls,
top functions by own time and by cumulative time.

    PYTHONPATH=src python scripts/probe_host.py --out $OUT [--ops lora,w4a4_g64,w4a4_2l,multilora] [--calls 300]

Further ops (session 36): ``w4a4_g64_m16`` (16 tokens: the Gluon decode kernel's route), ``w4a4_g64_flux`` (4608 ×
3072 × 3072: the v2 kernel's route, GPU time ~180 µs per call), ``lora_w8a8`` (fp8 W and x, 4096², one token).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# PROBE_SRC: another tree's src, to compare two commits on one host (one process each)
sys.path.insert(0, os.environ.get("PROBE_SRC") or str(ROOT / "src"))


def _ops(names):
    import torch
    from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
    from lowrank_gemm.formats.int4_twolevel import pack_weight_2l
    from lowrank_gemm.ops import lora_linear, multi_lora_linear, w4a4_linear
    dev, bf = "cuda", torch.bfloat16
    out = {}
    k = 4096
    x1 = torch.randn(1, k, device=dev, dtype=bf)
    w = torch.randn(4096, k, device=dev, dtype=bf) * 0.02
    out["cublas_4096"] = lambda: x1 @ w.T
    if "lora" in names:
        a = torch.randn(16, k, device=dev, dtype=bf) * 0.02
        b = torch.randn(4096, 16, device=dev, dtype=bf) * 0.02
        out["lora"] = lambda: lora_linear(x1, w, a, b, 2.0)
    n = 28672
    common = dict(smooth=(torch.rand(k, device=dev) + 0.5).to(bf),
                  lora_down=(torch.randn(32, k, device=dev) * 0.02).to(bf),
                  lora_up=(torch.randn(n, 32, device=dev) * 0.02).to(bf))
    wf = torch.randn(n, k, device=dev) * 0.02
    if "w4a4_g64" in names:
        q, sc = quantize_weight_int4(wf, 64)
        g64 = dict(qweight=pack_int4(q), wscales=sc)
        out["w4a4_g64"] = lambda: w4a4_linear(x1, **g64, **common)
    if "w4a4_g64_m16" in names:
        q, sc = quantize_weight_int4(wf, 64)
        x16 = torch.randn(16, k, device=dev, dtype=bf)
        g64_16 = dict(qweight=pack_int4(q), wscales=sc)
        out["w4a4_g64_m16"] = lambda: w4a4_linear(x16, **g64_16, **common)
    if "w4a4_g64_flux" in names:
        kf = nf = 3072
        qf, scf = quantize_weight_int4(torch.randn(nf, kf, device=dev) * 0.02, 64)
        xf = torch.randn(4608, kf, device=dev, dtype=bf)
        flux = dict(qweight=pack_int4(qf), wscales=scf, smooth=(torch.rand(kf, device=dev) + 0.5).to(bf),
                    lora_down=(torch.randn(32, kf, device=dev) * 0.02).to(bf),
                    lora_up=(torch.randn(nf, 32, device=dev) * 0.02).to(bf))
        out["w4a4_g64_flux"] = lambda: w4a4_linear(xf, **flux)
    if "lora_w8a8" in names:
        from lowrank_gemm.kernels.row_quant import fp8_rows
        w8, ws8 = fp8_rows(w)
        a8 = torch.randn(16, k, device=dev, dtype=bf) * 0.02
        b8 = torch.randn(4096, 16, device=dev, dtype=bf) * 0.02
        out["lora_w8a8"] = lambda: lora_linear(x1, w8, a8, b8, 2.0, weight_scale=ws8, fp8_activations=1)
    if "w4a4_2l" in names:
        wq, wmul, wsc = pack_weight_2l(wf, 64)
        tl2 = dict(qweight=wq, wscales=wsc, wmul=wmul)
        out["w4a4_2l"] = lambda: w4a4_linear(x1, **tl2, **common, fmt="int4_2l")
    if "multilora" in names:
        bank_a = torch.randn(4, 16, k, device=dev, dtype=bf) * 0.02
        bank_b = torch.randn(4, 4096, 16, device=dev, dtype=bf) * 0.02
        x4 = torch.randn(4, k, device=dev, dtype=bf)
        ids = torch.tensor([0, 1, 2, -1], device=dev, dtype=torch.int32)
        ranks = torch.full((4, ), 16, device=dev, dtype=torch.int32)
        scales = torch.ones(4, device=dev, dtype=torch.float32)
        out["multilora"] = lambda: multi_lora_linear(x4, w, bank_a, bank_b, ranks, scales, ids)
    return out


def main() -> int:
    import torch
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".")
    ap.add_argument("--ops", default="lora,w4a4_g64,w4a4_2l,multilora")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--no-profile", action="store_true", help="totals only (A/B runs)")
    args = ap.parse_args()
    ops = _ops(args.ops.split(","))
    report = io.StringIO()
    for name, fn in list(ops.items()):
        try:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        except Exception as exc:       # one broken op is reported, the others still measured
            print(f"{name}: FAILED {type(exc).__name__}: {exc}"[:300], file=report, flush=True)
            del ops[name]
            continue
        t = 0.0
        for i in range(args.calls):
            t0 = time.perf_counter()
            fn()
            t += time.perf_counter() - t0
            if i % 20 == 19:
                torch.cuda.synchronize()
        print(f"{name}: host {1e6 * t / args.calls:.1f} µs per call", file=report, flush=True)
        print(report.getvalue().splitlines()[-1], flush=True)
    for name, fn in ops.items():
        if name.startswith("cublas") or args.no_profile:
            continue
        prof = cProfile.Profile()
        prof.enable()
        for i in range(200):
            fn()
            if i % 20 == 19:
                torch.cuda.synchronize()
        prof.disable()
        for key in ("tottime", "cumulative"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(key).print_stats(28)
            print(f"\n===== {name}: by {key} (200 calls) =====\n{s.getvalue()}", file=report)
    text = report.getvalue()
    print(text)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probe_host.txt").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
