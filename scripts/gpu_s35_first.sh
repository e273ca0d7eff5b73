#!/usr/bin/env bash
# Session 35, device call 1: the full GPU suite at HEAD (last complete run: session 32; sessions 33–34 ran only the
# changed suites), then session 34's unrun call — `bench lora --fp8` with the two-term fp8 x row (auto_w8a8x2) and the
# fp8-weight narrow plan's N ≥ 8192 rule.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s35_first.sh → $OUT/s35_first/…
source "$(dirname "$0")/_device_prelude.sh" s35_first
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 330 14 tests
timeout 150 python3 -m lowrank_gemm bench lora --fp8 --kn 4096x28672,4096x4096 --ranks 16 --ms 1,16,64,256,1024 \
    --only cublas_base,auto,auto_fp8w,auto_w8a8,auto_w8a8x2,fp8_scaled_mm --out "$L/results" > "$L/bench.log" 2>&1
say "bench rc=$?"
grep -E "auto_fp8w|auto_w8a8|cublas_base|fp8_scaled" "$L/bench.log" | head -60 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" tests.log bench.log && rm -f "$L/tests.log" "$L/bench.log"
