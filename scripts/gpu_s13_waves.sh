#!/usr/bin/env bash
# Session 13: does the GEMV's wave quantization cost time? At K = 4096 the default config (16 rows per program,
# 18 programs per SM) runs N/2112 programs per SM: 13.58 at N = 28672 (76 SMs with 14, 56 with 13). The layer at
# N = 12.5–14.5 programs per SM, twice; if the busiest SM sets the end, 28672 costs what 29568 (14.0) does rather
# than the linear interpolation between 27456 (13.0) and 29568.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s13_waves.sh → $OUT/waves
source "$(dirname "$0")/_device_prelude.sh" waves
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
S=26400:4096,27456:4096,28512:4096,28672:4096,29568:4096,30624:4096
for fmt in int4_g64 int4_2l; do
  for rep in 1 2; do
    timeout 200 python3 scripts/probe_gemv.py --layer --fmt $fmt --shapes $S --variants shipped \
        --out "$L/${fmt}_$rep" > "$L/${fmt}_$rep.log" 2>&1
    say "$fmt rep $rep rc=$?"
    grep "^|" "$L/${fmt}_$rep/probe_gemv.md" | tee -a "$L/summary.txt"
  done
done
