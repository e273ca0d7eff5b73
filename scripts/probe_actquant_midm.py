"""GPU probe (≈ 1.5 min): act_quant (int4_g64, packed output, rank 32) for tens of tokens, where its default plan
(``v1``, the multi-launch path) is most of the skinny W4A4 layer (NOTES.md session 9: K = 14336, M = 17, layer 71 µs
with a ~36 µs GEMM; the fused variant was slower at M = 17–32).

    PYTHONPATH=src python scripts/probe_actquant_midm.py --out $OUT [--ms 17,24,32,48,64] [--ks 4096,14336]
        [--variants default,v3,…] [--aq-only] [--fmt int4_2l] [--rank 0] [--f8]

Also the FLUX sizes (session 11, ``scripts/gpu_actquant_large.sh``): ``--ms 4608 --ks 3072,12288`` with the v3 tile
variants, rank 0 (what S costs) and ``--f8`` (the e4m3 operands the int4_g64 v2 layer asks for), and the v3 S feeds
(``act_quant(s_feed=...)``: ``v3:one`` sums the three A' pieces in one accumulator, 4–5 CTAs per SM instead of 3;
``v3:one_tma`` also loads X by TMA in the int4_2l stats pass; ``v3:one:splitN`` re-sizes the K split for that
occupancy — the pre-session-12 split 8 / 16 gave 576 / 1152 programs at M = 4608, K = 3072 / 12288 —, ``v3:split5`` /
``v3:split7`` are controls, and ``v3:feed_split`` is the pre-session-12 default; "default" is now "one" with the
one-wave split, session 12).

Per (M, K), in one process with cuBLAS bf16 at N = 4096 as the yardstick: act_quant alone with the default plan, v1
at K splits 4 / 8 / 16 / 32 / 64, fused with the ticketed and the rank-split S, v3; the skinny GEMM alone (default
config, N = 4096) and the layer (``w4a4_linear``, impl auto). Every variant is first checked against the default
plan's output: x_q and x_scale bit-identical, S within 1e-5 (a variant that differs is reported, not timed). CUDA-
graph replay medians (``bench.common.time_impl``), two rotated activation sets. Writes probe_actquant_midm.json /
.md to --out.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))
N = 4096
RANK = 32
VARIANTS = {"default": {}, **{f"v1:split{s}": dict(variant="v1", split=s) for s in (4, 8, 16, 32, 64)},
            "fused:ticket": dict(variant="fused", s_ranks=0), "fused:rank": dict(variant="fused", s_ranks=1),
            "v3": dict(variant="v3"), "v2": dict(variant="v2"),
            # large-M tiles (FLUX: M = 4608; the v3 default is 64 rows × one group per step, 4 warps, 4 waves)
            **{f"v3:bm{b}": dict(variant="v3", block_m=b) for b in (16, 32, 128)},
            **{f"v3:w{w}": dict(variant="v3", num_warps=w) for w in (2, 8)},
            **{f"v3:split{s}": dict(variant="v3", split=s) for s in (2, 4, 16, 32)}}
# the v3 S feeds (act_quant.S_FEEDS; same q / scales, S to fp32 rounding) and the default feed's controls: split 7 (the
# same split) and 5 (its 3 CTAs per SM in one wave at M = 4608): named in --variants, not run by default
FEEDS = {**{f"v3:{f}": dict(variant="v3", s_feed=f) for f in ("one", "one_tma")},
         **{f"v3:one:split{s}": dict(variant="v3", s_feed="one", split=s) for s in (7, 9, 14, 18)},
         **{f"v3:split{s}": dict(variant="v3", split=s) for s in (5, 7)},
         "v3:feed_split": dict(variant="v3", s_feed="split")}      # session 12: the pre-"one" default


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".")
    ap.add_argument("--ms", default="17,24,32,48,64")
    ap.add_argument("--ks", default="4096,14336")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names from VARIANTS / FEEDS")
    ap.add_argument("--aq-only", action="store_true", help="time act_quant only (no cuBLAS, GEMM or layer rows)")
    ap.add_argument("--fmt", default="int4_g64", choices=("int4_g64", "int4_2l"),
                    help="activation format (int4_2l: act_quant rows only, as --aq-only)")
    ap.add_argument("--rank", type=int, default=RANK, help="low-rank branch rank (0: no S; act_quant rows only)")
    ap.add_argument("--f8", action="store_true", help="int4_g64: the e4m3 operands (out='f8', what the layer asks "
                    "of act_quant for the decode / v2 kernels); act_quant rows only")
    args = ap.parse_args()
    import torch
    from _decode_probe import Probe
    from lowrank_gemm.bench.common import time_impl
    from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
    from lowrank_gemm.kernels.act_quant import act_quant
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    from lowrank_gemm.kernels.w4a4_gemm import w4a4_linear
    from lowrank_gemm.kernels.w4a4_skinny import launch_w4a4_skinny

    probe = Probe(args.out, "probe_actquant_midm")
    for k in (int(v) for v in args.ks.split(",")):
        smooth = (torch.rand(k, device="cuda") + 0.5).to(torch.bfloat16)
        down = (torch.randn(args.rank, k, device="cuda") * 0.02).to(torch.bfloat16)
        for m in (int(v) for v in args.ms.split(",")):
            base = dict(M=m, N=N, K=k, r=args.rank)
            xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
            wb = [torch.randn(N, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
            aq_only = args.aq_only or args.fmt != "int4_g64" or args.rank != RANK or args.f8
            out = dict(out="f8") if args.f8 else {}
            if not aq_only:
                probe.emit(**base, impl="cublas_bf16", **time_impl(lambda a, b: a @ b.T, list(zip(xs, wb))))
            del wb
            fmt = args.fmt
            want = act_quant(xs[0], smooth, down, 64, fmt, **out)
            for name in (v for v in args.variants.split(",") if v):
                kw = {**{**VARIANTS, **FEEDS}[name], **out}
                try:
                    got = act_quant(xs[0], smooth, down, 64, fmt, **kw)
                    same = torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
                    s_err = (float((got[2] - want[2]).abs().max() / want[2].abs().max().clamp_min(1e-30))
                             if args.rank else 0.0)
                    ok = same and s_err < 1e-5
                    tag = f"act_quant:{fmt}{':f8' if args.f8 else ''}:{name}"
                    probe.emit(**base, impl=tag, err=s_err, same=same, ok=ok,
                               **(time_impl(lambda a, kw=kw: act_quant(a, smooth, down, 64, fmt, **kw),
                                            [(a, ) for a in xs]) if ok else {}))
                except Exception as exc:
                    traceback.print_exc()
                    probe.emit(**base, impl=f"act_quant:{fmt}:{name}", error=f"{type(exc).__name__}: {exc}"[:300])
            if aq_only:
                continue
            sets = [w4.make_operands_v2("int4_g64", m, N, k, RANK, 64, device="cuda", bias=True, seed=s)
                    for s in range(2)]
            probe.emit(**base, impl="skinny_gemm", **time_impl(lambda o: launch_w4a4_skinny(**o),
                                                               [(o, ) for o in sets]))
            del sets
            qw, sw = quantize_weight_int4(torch.randn(N, k, device="cuda") * 0.02, 64)
            pw = pack_int4(qw)
            up = (torch.randn(N, RANK, device="cuda") * 0.02).to(torch.bfloat16)
            probe.emit(**base, impl="layer:auto", **time_impl(
                lambda a: w4a4_linear(a, pw, sw, smooth, down, up, impl="auto"), [(a, ) for a in xs]))
            torch.cuda.empty_cache()
    probe.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
