"""GPU probe (≤ ~2 min): the W4A4 GEMV (kernels/w4a4_gemv.py) at decode sizes — correctness first, then, in ONE
process, CUDA-graph medians next to cuBLAS bf16, fp8 ``_scaled_mm`` and today's decode GEMM (e4m3 path, operands
pre-expanded as the layer feeds it), two rotated operand sets.

    PYTHONPATH=src python scripts/probe_gemv.py --out $OUT [--cfgs 32,64,4,1;16,64,2,1] [--ms 1,2,4]

Writes probe_gemv.json / .md to --out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))
SHAPES = [(28672, 4096), (4096, 4096), (14336, 4096), (4096, 14336)]      # (N, K): Llama-3-8B gate_up, o/qkv, …
CFGS = ("t:16,64,2,1;g:16,64,2,1;g:32,64,4,1;g:16,128,4,1;g:32,128,4,1;g:64,64,8,1;g:16,32,1,1;g:32,32,2,1;"
        "g:64,128,4,1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".")
    ap.add_argument("--cfgs", default=CFGS)
    ap.add_argument("--ms", default="1,2,4")
    args = ap.parse_args()
    import torch
    from _decode_probe import Probe
    from lowrank_gemm.kernels import w4a4_gemv as gv

    kernels = {"g": "gluon", "t": "triton"}
    cfgs = [(kernels[c.split(":")[0]], gv.GemvConfig(*(int(v) for v in c.split(":")[1].split(","))))
            for c in args.cfgs.split(";") if c]
    probe = Probe(args.out, "probe_gemv")
    for n, k in SHAPES:
        for m in (int(v) for v in args.ms.split(",")):
            if n != 28672 and m != 1:
                continue
            sets, ref, base = probe.operands(m, n, k)
            probe.baselines(base, sets, ref)
            for kern, cfg in cfgs:
                probe.checked(base, f"gemv:{kern}:" + ",".join(map(str, cfg)),
                              lambda c=cfg, kk=kern, **o: gv.launch_w4a4_gemv(**o, config=c, kernel=kk), sets, ref)
            del sets
            torch.cuda.empty_cache()
    probe.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
