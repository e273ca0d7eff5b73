"""GPU probe (≤ ~3 min): the W4A4 skinny GEMM (kernels/w4a4_skinny.py, mma.sync from registers) at decode sizes —
correctness first (float64 reference, NaN-poisoned output, bit-identical repeat), then, in ONE process, CUDA-graph
medians next to cuBLAS bf16, fp8 ``_scaled_mm``, today's decode GEMM (e4m3 path, operands pre-expanded as the layer
feeds it) and the GEMV, two rotated operand sets; ``--layer`` also times the layer op (act_quant + GEMM) per impl.

    PYTHONPATH=src python scripts/probe_skinny.py --out $OUT [--cfgs "1,4,4;1,8,2/8"] [--ms 1,4,16,64] [--layer]

A config is "rw,ks,kb[,rt][/block_t][+l16]" (+l16: the 16-byte-load K loop). Writes probe_skinny.json / .md to --out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))
SHAPES = [(28672, 4096), (4096, 4096)]      # (N, K): Llama-3-8B gate_up, o/qkv
CFGS = "1,4,2;4,1,4;4,1,2,2;2,1,4,2;4,1,2,4;8,1,2,2;2,2,2,2;1,4,2,2;4,1,4/8"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".")
    ap.add_argument("--cfgs", default=CFGS)
    ap.add_argument("--ms", default="1,2,3,4,8,16,32,64")
    ap.add_argument("--small-ms", default="4,16", help="M values for the shapes after the first")
    ap.add_argument("--layer", action="store_true", help="also time the layer op (act_quant + GEMM) per impl")
    ap.add_argument("--layer-impls", default="auto,decode,skinny", help="impls of the --layer rows (+ gemv at M ≤ 4)")
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES), help="NxK,NxK,…")
    args = ap.parse_args()
    import torch
    from _decode_probe import Probe
    from lowrank_gemm.bench.common import time_impl
    from lowrank_gemm.kernels import w4a4_gemv as gv
    from lowrank_gemm.kernels import w4a4_skinny as sk

    cfgs = []
    for c in args.cfgs.split(";"):
        if c:
            c, l16 = (c[:-4], True) if c.endswith("+l16") else (c, False)
            cfg, _, bt = c.partition("/")
            cfgs.append((int(bt) if bt else None, sk.SkinnyConfig(*(int(v) for v in cfg.split(","))), l16))
    probe = Probe(args.out, "probe_skinny")
    shapes = [tuple(int(v) for v in sh.split("x")) for sh in args.shapes.split(",")]

    def layers(base):
        def run(x, wb):
            from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
            from lowrank_gemm.kernels.w4a4_gemm import w4a4_linear
            m, n, k = base["M"], base["N"], base["K"]
            qw, sw = quantize_weight_int4(wb[0].float() * 0.02, 64)
            lw = (pack_int4(qw), sw, (torch.rand(k, device="cuda") + 0.5).to(torch.bfloat16),
                  (torch.randn(32, k, device="cuda") * 0.02).to(torch.bfloat16),
                  (torch.randn(n, 32, device="cuda") * 0.02).to(torch.bfloat16))
            for impl in tuple(args.layer_impls.split(",")) + (("gemv", ) if m <= 4 else ()):
                probe.emit(**base, impl=f"layer:{impl}", **time_impl(
                    lambda a, i=impl: w4a4_linear(a, *lw, impl=i), [(a, ) for a in x]))
        return run if args.layer else None

    for n, k in shapes:
        for m in (int(v) for v in args.ms.split(",")):
            if (n, k) != shapes[0] and str(m) not in args.small_ms.split(","):
                continue
            sets, ref, base = probe.operands(m, n, k)
            probe.baselines(base, sets, ref, layers(base))
            if m <= 4:
                probe.emit(**base, impl="gemv", **time_impl(lambda p: gv.launch_w4a4_gemv(**p),
                                                            [(s, ) for s in sets]))
            for bt, cfg, l16 in cfgs:
                if bt is None or bt > 16 or m <= bt:     # /8 and /16 below their token count; /32, /64 anywhere
                    name = "skinny:" + ",".join(map(str, cfg)) + (f"/{bt}" if bt else "") + ("+l16" if l16 else "")
                    probe.checked(base, name, lambda c=cfg, b=bt, f=l16, **o: sk.launch_w4a4_skinny(
                        **o, config=c, block_t=b, load16=f), sets, ref)
            del sets
            torch.cuda.empty_cache()
    probe.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
