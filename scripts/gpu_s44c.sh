#!/usr/bin/env bash
# Session 44, device call 2 cut to the device time left (≤ 250 s): gpu_s44b.sh's tests narrowed to the W4A8 file and
# the decode kernel's xab-table tests, then the canonical `bench w4a4 --only decode`.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s44c.sh → $OUT/s44c/
source "$(dirname "$0")/_device_prelude.sh" s44c
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 90 8 tests/test_w4a8.py tests/test_w4a4_decode.py -k "xab or a8 or w4a8 or gemm_vs or layer_and or graph"
gzip -f "$L/tests.log"
timeout 150 python3 -m lowrank_gemm bench w4a4 --only decode --out "$L/results" > "$L/bench_decode.log" 2>&1
say "bench w4a4 --only decode rc=$?"
grep -E "a8|auto|cublas" "$L/bench_decode.log" | grep -E "layer|cublas" | head -30 >> "$L/summary.txt"
gzip -f "$L/bench_decode.log"
