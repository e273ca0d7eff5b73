"""One small, checked launch of each v2 kernel: the target of scripts/sanitize_gluon.sh.

    python -m lowrank_gemm.kernels.gluon.smoke [--fmt int4_2l|int4_g64|int4_g64_w8|decode|all]

``int4_g64_w8``: the no-expander kernel (pre-expanded weights, coop, two partials in flight) that ``auto`` runs from
``W8_MIN_M`` tokens, pinned at a small shape (M, N % 8 == 0 for its TMA'd scale rows).

``decode``: the W4A4 decode kernel (gluon/w4a4_decode.py) on each of its default paths, at ragged small shapes, its
operands from act_quant as the layer makes them — int4_g64 on e4m3 tokens (M ≤ 16: the shared-memory a/b table and
the row box; also at K = 3072, whose table is padded to a power of two), int4_g64 on fp16 tokens (17–64), int4_2l;
and the W4A8 layer at M ≤ 16 (act_quant_e4m3's xab rows into the e4m3 path).

Exits non-zero (with shapes and the error) if the output differs from the float64 reference.
"""

import argparse
import sys

import torch

from .w4a4_ws import launch_w4a4_v2, make_operands_v2, reference_v2, two_level_enabled


def normalized_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got = got.detach().cpu().double()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def run_one(fmt, M, N, K, rank, group=64, grid=None, out_dtype=torch.bfloat16, launch_kw=None, **kw):
    ops = make_operands_v2(fmt, M, N, K, rank, group, device="cuda", out_dtype=out_dtype, **kw)
    out = launch_w4a4_v2(**ops, grid=grid, **(launch_kw or {}))
    torch.cuda.synchronize()
    ref = reference_v2(ops)
    return normalized_error(out, ref)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--fmt", default="all", choices=["all", "int4_2l", "int4_g64", "int4_g64_w8", "decode"])
    args = ap.parse_args(argv)
    if args.fmt == "decode":
        return decode_paths()
    fmts = ([f for f in ("int4_2l", "int4_g64", "int4_g64_w8") if f != "int4_2l" or two_level_enabled()]
            if args.fmt == "all" else [args.fmt])
    bad = 0
    for fmt in fmts:
        # 3 programs over several tiles each, ragged edges, K loop longer than the ring
        if fmt == "int4_g64_w8":
            M, N, lkw = 248, 296, dict(f8=True, expanders=0, coop=True, inflight=True)
        else:
            M, N, lkw = 250, 300, None
        err = run_one(fmt.replace("_w8", ""), M, N, 1024, 16, grid=3, launch_kw=lkw)
        ok = err < 2e-2
        bad += not ok
        print(f"{fmt}: M={M} N={N} K=1024 r=16 grid=3 normalized max error {err:.3e} {'OK' if ok else 'FAIL'}",
              flush=True)
    return 1 if bad else 0


def decode_paths() -> int:
    """The decode kernel's default paths, each checked against the float64 GEMM on act_quant's packed codes, then the
    W4A8 layer at M ≤ 16 against its spec."""
    from ...reference import w4a4_gemm_ref
    from ..act_quant import act_quant
    from ..w4a4_gemm import w4a4_gemm
    g = torch.Generator(device="cuda").manual_seed(0)
    N, r = 400, 16              # N: a multiple of 16 (the scale rows by TMA), not of the 128-row tile
    bad = 0
    # K = 3072: the e4m3 path's xab table needs 96 rows and gets 128 (a power of two; xab_table_rows)
    for fmt, M, K, out in (("int4_g64", 5, 1024, "f8"), ("int4_g64", 3, 3072, "f8"), ("int4_g64", 24, 1024, "f16"),
                           ("int4_2l", 40, 1024, "packed")):
        wq, wmul, ws, smooth, down, up, bias = _random_layer(g, fmt, N, K, r)
        x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
        xq, xs, s = act_quant(x, smooth, down, 64, fmt, torch.bfloat16, out=out)
        y = w4a4_gemm(xq, xs, wq, ws, s, up, bias, w_mul=wmul, fmt=fmt, impl="decode")
        torch.cuda.synchronize()
        pq, psc, _ = act_quant(x, smooth, down, 64, fmt, torch.bfloat16)
        err = normalized_error(y, w4a4_gemm_ref(pq, psc, wq, ws, s, up, bias, w_mul=wmul, fmt=fmt).cpu())
        ok = err < 2e-2
        bad += not ok
        print(f"decode {fmt} ({out} tokens): M={M} N={N} K={K} r={r} normalized max error {err:.3e} "
              f"{'OK' if ok else 'FAIL'}", flush=True)
    bad += _decode_w4a8_layer(g)
    return 1 if bad else 0


def _random_layer(g, fmt: str, N: int, K: int, r: int):
    """A random SVDQuant layer on the GPU, group 64: (packed weights, their 2l multipliers or None, scales, λ, lora_down,
    lora_up, bias)."""
    from ...formats.int4 import pack_int4, quantize_weight_int4
    from ...formats.int4_twolevel import pack_weight_2l
    w = torch.randn(N, K, device="cuda", generator=g) * 0.02
    if fmt == "int4_2l":
        wq, wmul, ws = pack_weight_2l(w, 64)
    else:
        q, ws = quantize_weight_int4(w, 64)
        wq, wmul, ws = pack_int4(q), None, ws.bfloat16()
    smooth = (torch.rand(K, device="cuda", generator=g) + 0.5).bfloat16()
    down = (torch.randn(r, K, device="cuda", generator=g) * 0.05).bfloat16()
    up = (torch.randn(N, r, device="cuda", generator=g) * 0.05).bfloat16()
    return wq, wmul, ws, smooth, down, up, torch.randn(N, device="cuda", generator=g).bfloat16()


def _decode_w4a8_layer(g) -> int:
    """The W4A8 layer at M ≤ 16 (act_quant_e4m3's xab rows into the decode kernel's e4m3 path) against the float64
    spec, at K = 3072 (the padded xab table)."""
    from ...reference import svdq_linear_ref
    from ..w4a4_gemm import w4a4_linear
    M, N, K, r = 4, 400, 3072, 16
    wq, _, ws, smooth, down, up, bias = _random_layer(g, "int4_g64", N, K, r)
    p = dict(qweight=wq, wscales=ws, smooth=smooth, lora_down=down, lora_up=up, bias=bias)
    x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    y = w4a4_linear(x, act_bits=8, out_dtype=torch.float32, **p)
    torch.cuda.synchronize()
    err = normalized_error(y, svdq_linear_ref(x, act_bits=8, **p).cpu())
    ok = err < 2e-2
    print(f"decode W4A8 layer (xab rows): M={M} N={N} K={K} r={r} normalized max error {err:.3e} "
          f"{'OK' if ok else 'FAIL'}", flush=True)
    return int(not ok)


if __name__ == "__main__":
    sys.exit(main())
