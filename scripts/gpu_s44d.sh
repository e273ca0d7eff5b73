#!/usr/bin/env bash
# Session 44, device call 2 cut again (≤ 170 s; 314 s of device time left): the W4A8 file's and the decode kernel's
# xab-table GPU tests, then `bench w4a4 --only decode --impls auto,a8` (a probe, not the canonical table).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s44d.sh → $OUT/s44d/
source "$(dirname "$0")/_device_prelude.sh" s44d
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 80 8 tests/test_w4a8.py tests/test_w4a4_decode.py -k "xab or a8 or w4a8 or gemm_vs or layer_and or graph"
gzip -f "$L/tests.log"
timeout 85 python3 -m lowrank_gemm bench w4a4 --only decode --impls auto,a8 --out "$L/results" > "$L/bench_decode.log" 2>&1
say "bench w4a4 --only decode --impls auto,a8 rc=$?"
grep -E "layer|cublas" "$L/bench_decode.log" | head -30 >> "$L/summary.txt"
gzip -f "$L/bench_decode.log"
