"""GPU probe (≈ 20 s): where the host time of one eager call goes, piece by piece, at decode sizes.

``probe_host.py`` gives the total per op and a cProfile (which inflates Python-heavy code). This one times each
stage of the shipped path on its own (perf_counter over back-to-back calls, a sync every 20), so the stages add up to
the op and the floor is visible: the Triton launch of precomputed arguments (``jit[grid](...)``) and the compiled
kernel's own launcher with pre-bound arguments (``CompiledKernel.run``, what a cached launch could cost).

    PYTHONPATH=src python scripts/probe_host_parts.py --out $OUT [--calls 400]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# PROBE_SRC: another tree's src, to compare two commits on one host (one process each)
sys.path.insert(0, os.environ.get("PROBE_SRC") or str(ROOT / "src"))


def _time(fn, calls: int) -> float:
    import torch
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = 0.0
    for i in range(calls):
        t0 = time.perf_counter()
        fn()
        t += time.perf_counter() - t0
        if i % 20 == 19:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return 1e6 * t / calls


def direct_launch(jit_fn, grid, args, kwargs):
    """A closure that launches ``jit_fn[grid](*args, **kwargs)`` through the compiled kernel's launcher with the
    arguments bound once (no binder, no cache-key hashing): the floor of a cached launch."""
    from triton.runtime.driver import driver
    device = driver.active.get_current_device()
    kernel = jit_fn.run(*args, grid=grid, warmup=False, **kwargs)
    binder = jit_fn.device_caches[device][4]
    bound, _, _ = binder(*args, **kwargs)
    vals = tuple(bound.values())
    g = tuple(grid) + (1, 1)

    def launch():
        stream = driver.active.get_current_stream(device)
        kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata, None, None, None, *vals)
    return launch


def main() -> int:
    import torch
    from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
    from lowrank_gemm.kernels import w4a4_gemm as wg
    from lowrank_gemm.kernels import w4a4_gemv as gv
    from lowrank_gemm.kernels.act_quant import act_quant
    from lowrank_gemm.kernels import lora_gemm as lg
    from lowrank_gemm.plan.planner import plan_lora
    from lowrank_gemm.ops import lora_linear, w4a4_linear

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".")
    ap.add_argument("--calls", type=int, default=400)
    a = ap.parse_args()
    dev, bf = "cuda", torch.bfloat16
    k, n, r = 4096, 28672, 32
    x1 = torch.randn(1, k, device=dev, dtype=bf)
    w = torch.randn(4096, k, device=dev, dtype=bf) * 0.02
    smooth = (torch.rand(k, device=dev) + 0.5).to(bf)
    down = (torch.randn(r, k, device=dev) * 0.02).to(bf)
    up = (torch.randn(n, r, device=dev) * 0.02).to(bf)
    q, sc = quantize_weight_int4(torch.randn(n, k, device=dev) * 0.02, 64)
    qw = pack_int4(q)
    rows = []

    def row(name, fn):
        try:
            us = _time(fn, a.calls)
            rows.append((name, us))
        except Exception as exc:          # a broken stage is reported, the others still timed
            rows.append((name, f"FAILED {type(exc).__name__}: {exc}"[:200]))
        print(rows[-1], flush=True)

    row("cublas x@w.T 4096²", lambda: x1 @ w.T)
    row("torch.empty(1, 28672) bf16", lambda: torch.empty(1, n, device=dev, dtype=bf))
    # ---- W4A4 int4_g64, M = 1, N = 28672 (act_quant + GEMV)
    row("w4a4_linear g64 M=1", lambda: w4a4_linear(x1, qw, sc, smooth, down, up))
    row("  check_linear_args", lambda: wg.check_linear_args(x1, qw, sc, smooth, down, up, None, None, 64, "int4_g64"))
    row("  _layer_wants_f8", lambda: wg._layer_wants_f8("auto", "int4_g64", 1, n, k, r, 64, x1.device, bf, sc))
    row("  _early_launch", lambda: wg._early_launch("auto", "int4_g64", 1, n, k, x1.device))
    el = wg._early_launch("auto", "int4_g64", 1, n, k, x1.device)
    row("  act_quant", lambda: act_quant(x1, smooth, down, 64, "int4_g64", bf, out="packed", early_launch=el))
    xq, xs, s = act_quant(x1, smooth, down, 64, "int4_g64", bf, out="packed", early_launch=el)
    row("  _w4a4_gemm_impl", lambda: wg._w4a4_gemm_impl(xq, xs, qw, sc, None, s, up, None, 64, "int4_g64", bf,
                                                         "auto"))
    row("    check_gemm_args", lambda: wg.check_gemm_args(xq, xs, qw, sc, None, s, up, None, 64, "int4_g64"))
    row("    _route", lambda: wg._route("auto", "int4_g64", 1, n, k, r, 64, x1.device, xs, sc, None))
    out = torch.empty(1, n, device=dev, dtype=bf)
    row("    launch_w4a4_gemv", lambda: gv.launch_w4a4_gemv(xq, xs, qw, sc, None, s, up, None, out))
    row("      gemv_args", lambda: gv.gemv_args(xq, xs, qw, sc, None, s, up, None, out))
    grid, args, cx, cfg = gv.gemv_args(xq, xs, qw, sc, None, s, up, None, out)
    cx.pop("KERNEL")
    kw = dict(cx, num_warps=cfg.num_warps, launch_pdl=cx["PDL"])
    row("      jit[grid](precomputed)", lambda: gv.w4a4_gemv_gl_kernel[grid](*args, **kw))
    from lowrank_gemm.kernels.launch import launch
    row("      kernels.launch.launch(precomputed)", lambda: launch(gv.w4a4_gemv_gl_kernel, grid, *args, **kw))
    try:
        row("      CompiledKernel.run (bound once)", direct_launch(gv.w4a4_gemv_gl_kernel, grid, args, kw))
    except Exception as exc:
        rows.append(("      CompiledKernel.run", f"FAILED {type(exc).__name__}: {exc}"[:200]))
    # ---- LoRA, M = 1, 4096², r = 16
    la = torch.randn(16, k, device=dev, dtype=bf) * 0.02
    lb = torch.randn(4096, 16, device=dev, dtype=bf) * 0.02
    row("lora_linear M=1 4096² r16", lambda: lora_linear(x1, w, la, lb, 2.0))
    row("  check_inputs", lambda: lg.check_inputs(x1, w, la, lb, None, "auto"))
    row("  _v2_choice", lambda: lg._v2_choice(1, 4096, k, 16, x1.device))
    row("  plan_lora", lambda: plan_lora(1, 4096, k, 16, bf, x1.device))
    strategy, lcfg = plan_lora(1, 4096, k, 16, bf, x1.device)
    row(f"  run_strategy ({strategy})", lambda: lg.run_strategy(strategy, x1, w, la, lb, 2.0, None, lcfg))
    row("  TensorDescriptor.from_tensor ×1", lambda: lg._desc(w, 64, 64))
    lines = [f"{name:<44} {us:8.1f} µs" if isinstance(us, float) else f"{name:<44} {us}" for name, us in rows]
    text = "\n".join(lines)
    print(text)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "probe_host_parts.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
