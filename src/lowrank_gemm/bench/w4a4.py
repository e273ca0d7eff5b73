"""Bench suite ``w4a4``: the W4A4 + low-rank layer against bf16, fp8 and int8 cuBLAS, one process.

    python -m lowrank_gemm.bench.w4a4 [--quick] [--out DIR]

Implementations (r = 32 where a branch exists):
  cublas_bf16            x @ Wᵀ, bf16, no branch
  bf16_unfused_lowrank   addmm(x @ Wᵀ, x @ Aᵀ, Bᵀ): the usual unfused LoRA/SVD branch
  fp8_scaled_mm          torch._scaled_mm e4m3, rowwise scales, operands pre-quantized, no branch
  int8_int_mm            torch._int_mm, operands pre-quantized, no branch, int32 out (M > 16 only)
  w4a4_layer:<fmt>       our full layer: act_quant (x/λ, quantize, S) + W4A4 GEMM with the branch
  w4a4_gemm:<fmt>        our GEMM alone on pre-quantized operands (+ S·Bᵀ in the epilogue)
for fmt ∈ {int4_g64, int4_2l} (v1; plus ``...:<fmt>:v2`` rows when the Gluon v2 exists), and ``...:int4_g64:a8``:
the same int4_g64 weights with per-token e4m3 activations (``act_bits=8``, W4A8; the v2 kernel's A8 route). Rows carry µs (eager and CUDA-graph replay), TOPS = 2·M·N·K / t of the main
product, and ratios to cublas_bf16 and fp8_scaled_mm (graph times). Writes w4a4.{json,md,png}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from .common import device_meta, markdown_table, measure_copy_tbps, meta_header, rotation_count, \
    time_impl, write_results

RANK = 32
FLUX_M = 4608
FLUX_KN = [(3072, 12288), (12288, 3072), (3072, 3072), (3072, 9216)]
DECODE = [(1, 4096, 28672), (16, 4096, 28672), (64, 4096, 28672)]
FORMATS = ("int4_g64", "int4_2l")


def _impls() -> tuple[str, ...]:
    """Every kernel generation, ``auto`` (what users get) included: v1 (rows ``w4a4_*:<fmt>``), the Gluon ones when
    they import (``:v2``, ``:decode``), the GEMV and the skinny GEMM (decode rows only), ``:auto``. Session 10 found
    the suite's default had been v1 / v2 only, so a plain ``bench w4a4`` left out the routed layer."""
    try:
        from ..kernels.gluon.w4a4_ws import launch_w4a4_v2  # noqa: F401
        return ("v1", "v2", "decode", "gemv", "skinny", "auto", "a8")
    except ImportError:
        return ("v1", "auto")


IMPLS = _impls()


def shapes(quick: bool, only: str | None = None) -> list[tuple[str, int, int, int]]:
    """(suite, M, N, K); ``only``: "decode" or "flux" keeps that suite's shapes."""
    if only:
        return [s for s in shapes(quick) if s[0] == only]
    if quick:
        return [("flux", FLUX_M, 12288, 3072), ("decode", 1, 28672, 4096), ("decode", 64, 28672, 4096)]
    return [("flux", FLUX_M, n, k) for k, n in FLUX_KN] + [("decode", m, n, k) for m, k, n in DECODE]


def _layer_weights(n: int, k: int, dev) -> dict:
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
    return {"w": w, "a": torch.randn(RANK, k, device=dev, dtype=torch.bfloat16) * 0.02,
            "b": torch.randn(n, RANK, device=dev, dtype=torch.bfloat16) * 0.02,
            "smooth": (torch.rand(k, device=dev) + 0.5).to(torch.bfloat16)}


def unsigned_layer_case(n: int, k: int, rank: int = 32, *, device="cuda", seed: int = 0, shift: float | None = None):
    """A random int4_g64 layer with unsigned activations (``act_shift``), as ``w4a4_linear`` takes it:
    (kwargs qweight / wscales / smooth / lora_down / lora_up, the true bias [N], the shift vector RN(c/λ) [K], the
    bias the kernels add: bias − Q(W)·shift, and ``draw(m)``: GELU-shaped bf16 inputs [m, K] from the same seed).
    ``shift`` (None: ``formats.int4.GELU_SHIFT``). For ``probe_unsigned.py`` and the GPU tests of
    ``tests/test_w4a4_unsigned.py``."""
    from ..formats.int4 import GELU_SHIFT, act_shift_vector, dequantize_int4, pack_int4, quantize_weight_int4
    g = torch.Generator(device=device).manual_seed(seed)
    lam = (torch.rand(k, device=device, generator=g) + 0.5).bfloat16()
    qw, sw = quantize_weight_int4(torch.randn(n, k, device=device, generator=g) * 0.02, 64)
    p = dict(qweight=pack_int4(qw), wscales=sw, smooth=lam,
             lora_down=(torch.randn(rank, k, device=device, generator=g) * 0.02).bfloat16(),
             lora_up=(torch.randn(n, rank, device=device, generator=g) * 0.02).bfloat16())
    bias = torch.randn(n, device=device, generator=g)
    sh = act_shift_vector(GELU_SHIFT if shift is None else shift, lam)
    fold = (bias.double() - dequantize_int4(qw, sw, 64).double() @ sh.double()).float()

    def draw(m: int) -> torch.Tensor:
        return torch.nn.functional.gelu(torch.randn(m, k, device=device, generator=g) * 2).bfloat16()
    return p, bias, sh, fold, draw


def _providers(m: int, n: int, k: int, dev, impls=IMPLS):
    """name → (fn, make_input_set() → args, bytes_per_set)."""
    from ..formats.int4 import pack_int4, quantize_weight_int4
    from ..formats.int4_twolevel import pack_weight_2l
    from ..kernels.act_quant import act_quant
    from ..kernels.w4a4_gemm import w4a4_gemm, w4a4_linear

    def x_bf16():
        return torch.randn(m, k, device=dev, dtype=torch.bfloat16)

    def bf16_set():
        p = _layer_weights(n, k, dev)
        return (x_bf16(), p["w"], p["a"].t().contiguous(), p["b"].t().contiguous())

    def fp8_set():
        x, w = x_bf16().float(), torch.randn(n, k, device=dev) * 0.02
        sx = x.abs().amax(1, keepdim=True).clamp_min(1e-12) / 448.0
        sw = w.abs().amax(1, keepdim=True).clamp_min(1e-12) / 448.0
        return ((x / sx).to(torch.float8_e4m3fn), (w / sw).to(torch.float8_e4m3fn).t(), sx, sw.t().contiguous())

    def int8_set():
        return (torch.randint(-127, 128, (m, k), device=dev, dtype=torch.int8),
                torch.randint(-127, 128, (n, k), device=dev, dtype=torch.int8).t())

    def layer_set(fmt):
        def make():
            p = _layer_weights(n, k, dev)
            ws = p["w"].float() * p["smooth"].float()
            if fmt == "int4_g64":
                qw, sw = quantize_weight_int4(ws, 64)
                wq, wsc, wmul = pack_int4(qw), sw, None
            else:
                wq, wmul, wsc = pack_weight_2l(ws, 64)
            return (x_bf16(), wq, wsc, p["smooth"], p["a"], p["b"], wmul)
        return make

    def gemm_set(fmt):
        def make():
            x, wq, wsc, smooth, a, b, wmul = layer_set(fmt)()
            xq, xsc, s = act_quant(x, smooth, a, 64, fmt)
            return (xq, xsc, wq, wsc, s, b, wmul)
        return make

    def a8_gemm_set():
        from ..kernels.act_e4m3 import act_quant_e4m3
        from ..kernels.w4a4_gemm import _a8_act_out
        x, wq, wsc, smooth, a, b, wmul = layer_set("int4_g64")()
        # the operands the layer hands its GEMM (at decode sizes the decode kernel's fp16 or e4m3 ones)
        x8, t, s = act_quant_e4m3(x, smooth, a, out=_a8_act_out("auto", m, n, 64, x.device))
        return (x8, t, wq, wsc, s, b, None)

    def run_layer(fmt, impl):
        if impl == "a8":      # per-token e4m3 activations on the routed (auto) kernel
            return lambda x, wq, wsc, smooth, a, b, wmul: w4a4_linear(x, wq, wsc, smooth, a, b, None, 64, fmt,
                                                                      "auto", act_bits=8)
        return lambda x, wq, wsc, smooth, a, b, wmul: w4a4_linear(x, wq, wsc, smooth, a, b, None, 64, fmt, impl,
                                                                  wmul=wmul)

    def run_gemm(fmt, impl):
        return lambda xq, xsc, wq, wsc, s, b, wmul: w4a4_gemm(xq, xsc, wq, wsc, s, b, w_mul=wmul, fmt=fmt,
                                                              impl="auto" if impl == "a8" else impl)

    bf16_bytes = 2 * (m * k + n * k + m * n)
    out = {
        "cublas_bf16": (lambda x, w, at, bt: torch.nn.functional.linear(x, w), bf16_set, bf16_bytes),
        "bf16_unfused_lowrank": (lambda x, w, at, bt: torch.addmm(torch.nn.functional.linear(x, w), x @ at, bt),
                                 bf16_set, bf16_bytes),
        "fp8_scaled_mm": (lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16),
                          fp8_set, m * k + n * k + 2 * m * n),
        "int8_int_mm": (lambda a, b: torch._int_mm(a, b), int8_set, m * k + n * k + 4 * m * n),
    }
    for impl in impls:
        tag = "" if impl == "v1" else f":{impl}"
        for fmt in FORMATS:
            if impl == "decode" and m > 64:
                continue   # the decode kernel: M ≤ 64 only
            if impl == "gemv" and (m > 4 or fmt != "int4_g64"):
                continue   # the GEMV: int4_g64, a few tokens
            if impl == "skinny" and (m > 64 or fmt != "int4_g64"):
                continue   # the skinny GEMM: int4_g64, decode sizes
            if impl == "a8" and fmt != "int4_g64":
                continue   # W4A8: the standard weights, e4m3 activations
            wbytes = n * k // 2 + (k // 64) * n * (2 if fmt == "int4_g64" else 1)
            out[f"w4a4_layer:{fmt}{tag}"] = (run_layer(fmt, impl), layer_set(fmt), 2 * m * k + wbytes + 2 * m * n)
            out[f"w4a4_gemm:{fmt}{tag}"] = (run_gemm(fmt, impl), a8_gemm_set if impl == "a8" else gemm_set(fmt),
                                            (2 if impl == "a8" else 1) * m * k + wbytes + 2 * m * n)
    return out


def run(quick: bool, outdir: Path | None, impls: tuple[str, ...] = IMPLS, only: str | None = None) -> Path:
    if not torch.cuda.is_available():
        raise SystemExit("the w4a4 bench needs a CUDA GPU")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    meta = device_meta(measure_copy_tbps())
    meta.update(suite="w4a4", rank=RANK, group_size=64, quick=quick, only=only)
    rows = []
    for suite, m, n, k in shapes(quick, only):
        for impl, (fn, make, nbytes) in _providers(m, n, k, dev, impls).items():
            row = {"suite": suite, "impl": impl, "M": m, "N": n, "K": k,
                   "r": RANK if ("lowrank" in impl or impl.startswith("w4a4")) else 0,
                   "dtype": impl.split(":")[1] if ":" in impl else impl.split("_")[0]}
            try:
                sets = [make() for _ in range(min(4, rotation_count(nbytes)))]
                row.update(time_impl(fn, sets))
                del sets
            except Exception as exc:  # e.g. _int_mm's M > 16 rule: reported, not hidden
                row.update(median_us=None, graph_us=None, error=f"{type(exc).__name__}: {exc}"[:200])
            t = row.get("graph_us") or row.get("median_us")
            row["tops"] = round(2 * m * n * k / (t * 1e-6) / 1e12, 1) if t else None
            rows.append(row)
            print(f"{suite:7s} M={m:5d} N={n:6d} K={k:6d} {impl:24s} eager {row.get('median_us')} µs  "
                  f"graph {row.get('graph_us')} µs  {row['tops']} TOPS {row.get('error', '')}", flush=True)
            torch.cuda.empty_cache()
    _add_ratios(rows)
    name = "w4a4" if not only else f"w4a4_{only}"   # a one-suite run never overwrites the full table
    return write_results(name, meta, rows, outdir, md=_markdown(meta, rows), plot=_plot)


def _t(row):
    return row.get("graph_us") or row.get("median_us")


def _add_ratios(rows):
    base = {}
    for r in rows:
        if r["impl"] in ("cublas_bf16", "fp8_scaled_mm") and _t(r):
            base[(r["M"], r["N"], r["K"], r["impl"])] = _t(r)
    for r in rows:
        for ref, key in (("cublas_bf16", "x_vs_bf16"), ("fp8_scaled_mm", "x_vs_fp8")):
            b = base.get((r["M"], r["N"], r["K"], ref))
            r[key] = round(b / _t(r), 3) if b and _t(r) else None  # > 1: faster than the baseline


def _markdown(meta, rows) -> str:
    body = [[r["suite"], r["M"], r["N"], r["K"], r["impl"], r.get("graph_us"), r.get("median_us"), r.get("tops"),
             r.get("x_vs_bf16"), r.get("x_vs_fp8")] for r in rows]
    return ("# w4a4: W4A4 + rank-32 branch vs bf16 / fp8 / int8 cuBLAS\n\n" + meta_header(meta) +
            "Times in µs (CUDA-graph replay; eager beside). ×bf16 / ×fp8: speed-up over cublas_bf16 / "
            "fp8_scaled_mm (> 1 is faster). Targets: FLUX w4a4_layer:int4_g64 ×fp8 ≥ 1; decode w4a4_layer ×bf16 ≥ 3.\n\n"
            + markdown_table(["suite", "M", "N", "K", "impl", "graph µs", "eager µs", "TOPS", "×bf16", "×fp8"], body))


def _plot(data, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = data["rows"]
    keys = sorted({(r["M"], r["N"], r["K"]) for r in rows}, key=lambda s: (s[0] < 4608, s))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(keys)), 5))
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        vals = [next((_t(r) or 0 for r in rows if r["impl"] == impl and (r["M"], r["N"], r["K"]) == key), 0)
                for key in keys]
        ax.bar([j + i * width for j in range(len(keys))], vals, width, label=impl)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))])
    ax.set_xticklabels([f"M={m}\nN={n}\nK={k}" for m, n, k in keys], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("µs (CUDA graph, log)")
    ax.set_title(f"w4a4 r={RANK} — {data['meta'].get('device')}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 shapes (≤ 2 min)")
    ap.add_argument("--out", type=Path, default=None, help="default benchmarks/results/<gpu> (bench.common.results_dir)")
    ap.add_argument("--impls", default=",".join(IMPLS), help="kernel generations to time: v1, v2, decode (M ≤ 64), gemv (M ≤ 4), skinny (M ≤ 64), auto, a8 (W4A8: e4m3 activations); comma-separated")
    ap.add_argument("--only", choices=("flux", "decode"), default=None,
                    help="one suite's shapes, written to w4a4_<suite>.{json,md,png}")
    args = ap.parse_args(argv)
    print(run(args.quick, args.out, tuple(i for i in args.impls.split(",") if i), args.only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
