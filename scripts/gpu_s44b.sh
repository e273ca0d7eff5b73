#!/usr/bin/env bash
# Session 44, device call 2 (≤ 360 s): the decode kernel's xab table rounded up to a power of two (K = 3072 / 12288
# aborted the process in Triton's compiler), the W4A8 e4m3-path decode route on by default: the decode / W4A8 / W4A4
# GPU tests, then the canonical `bench w4a4 --only decode`.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s44b.sh → $OUT/s44b/
source "$(dirname "$0")/_device_prelude.sh" s44b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 170 8 tests/test_w4a8.py tests/test_w4a4_decode.py tests/test_w4a4_decode_f16.py tests/test_w4a4_gpu.py
gzip -f "$L/tests.log"
timeout 180 python3 -m lowrank_gemm bench w4a4 --only decode --out "$L/results" > "$L/bench_decode.log" 2>&1
say "bench w4a4 --only decode rc=$?"
grep -E "a8|auto|cublas" "$L/bench_decode.log" | grep -E "layer|cublas" | head -30 >> "$L/summary.txt"
gzip -f "$L/bench_decode.log"
