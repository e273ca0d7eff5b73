#!/usr/bin/env bash
# Session 40's first device call (≤ 560 s, an H200): the canonical W4A4 tables with the fp16 decode route at 17–64
# tokens — `bench w4a4 --only decode` first (the decode target's table), then the full `bench w4a4`.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s40.sh → $OUT/s40/results/w4a4{,_decode}.{json,md,png}
source "$(dirname "$0")/_device_prelude.sh" s40
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
timeout 120 python3 -m lowrank_gemm bench w4a4 --only decode --out "$L/results" > "$L/bench_decode.log" 2>&1
say "bench w4a4 --only decode rc=$?"
grep -E "layer" "$L/bench_decode.log" | head -40 >> "$L/summary.txt"
timeout 420 python3 -m lowrank_gemm bench w4a4 --out "$L/results" > "$L/bench.log" 2>&1
say "bench w4a4 rc=$?"
grep -E "auto|cublas_bf16|fp8_scaled" "$L/bench.log" | grep -E "layer|cublas|fp8" | head -60 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" bench.log bench_decode.log && rm -f "$L/bench.log" "$L/bench_decode.log"
