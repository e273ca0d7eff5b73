#!/usr/bin/env bash
# Session 41's canonical call (≤ 420 s, an H200): the W4A8 GPU tests, then the full `bench w4a4` (every kernel
# generation, W4A8 rows included) → the canonical w4a4.{json,md,png}.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s41i.sh → $OUT/s41i/
source "$(dirname "$0")/_device_prelude.sh" s41i
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 200 4 tests/test_w4a8.py
timeout 360 python3 -m lowrank_gemm bench w4a4 --out "$L/results" > "$L/bench.log" 2>&1
say "bench w4a4 rc=$?"
grep -E "auto|a8|cublas_bf16|fp8_scaled" "$L/bench.log" | grep -E "layer|cublas|fp8" | head -60 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" bench.log && rm -f "$L/bench.log"
