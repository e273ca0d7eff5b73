"""GPU A/B (≤ ~100 s): multi-LoRA split-K fixup — this file's inline copy vs kernels/splitk.py (shared with LoRA),
one process, on the tuned split-K cases (LOWRANK_GEMM_ML_SPLITK toggled between timings; error vs shrink+expand
checked by bench_case for both).

    PYTHONPATH=src python scripts/probe_ml_splitk.py --out $OUT
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

CASES = [(64, 4096, 16, 4), (64, 4096, 16, 16), (64, 4096, 16, 64), (64, 4096, 64, 16), (16, 4096, 16, 16),
         (256, 4096, 16, 16)]   # (M, N, r, adapters): all pinned to split_k 2–4 in plan/tuned/multilora_h200.json


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    from lowrank_gemm.bench.common import device_meta
    from lowrank_gemm.bench.multilora import bench_case
    rows = []
    for M, N, r, a in CASES:
        for mode in ("inline", "shared"):
            os.environ["LOWRANK_GEMM_ML_SPLITK"] = mode
            for row in bench_case(M, N, r, a, None, only={"fused", "cublas_base"}):
                row["splitk"] = mode
                rows.append(row)
                print(f"M={M:3d} N={N} r={r:2d} a={a:2d} {mode:6s} {row['impl']:12s} graph {row.get('graph_us')} "
                      f"vs base {row.get('vs_base_graph')} err {row.get('rel_err_vs_shrink_expand')}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe_ml_splitk.json").write_text(json.dumps({"meta": device_meta(None), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
