#!/usr/bin/env bash
# Session 34, device call 4: the canonical W4A4 tables at the new decode defaults — the full `bench w4a4` (FLUX and
# decode suites, every kernel generation beside cuBLAS bf16 / fp8 / int8 in one process), then `--only decode`.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s34_bench.sh → $OUT/s34_bench/results/w4a4{,_decode}.{json,md,png}
source "$(dirname "$0")/_device_prelude.sh" s34_bench
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
timeout 400 python3 -m lowrank_gemm bench w4a4 --out "$L/results" > "$L/bench.log" 2>&1
say "bench w4a4 rc=$?"
timeout 130 python3 -m lowrank_gemm bench w4a4 --only decode --out "$L/results" > "$L/bench_decode.log" 2>&1
say "bench w4a4 --only decode rc=$?"
grep -E "auto|cublas_bf16|fp8_scaled" "$L/bench.log" | grep -E "layer|cublas|fp8" | head -60 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" bench.log bench_decode.log && rm -f "$L/bench.log" "$L/bench_decode.log"
