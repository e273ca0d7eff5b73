#!/usr/bin/env bash
# Session 45, device call 3 (≤ 450 s): the A8 (W4A8 prefill) trans route up to K = 12288 with four groups per body
# above K = 4096 — its GPU tests, then the canonical full `bench w4a4` (FLUX + decode, one process).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s45.sh → $OUT/s45/
source "$(dirname "$0")/_device_prelude.sh" s45
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
gpu_tests 120 8 tests/test_w4a8.py
gzip -f "$L/tests.log"
timeout 320 python3 -m lowrank_gemm bench w4a4 --out "$L/results" > "$L/bench.log" 2>&1
say "bench w4a4 rc=$?"
grep -E "flux" "$L/bench.log" | grep -E "layer:int4_g64 |layer:int4_g64:a8|fp8_scaled|cublas_bf16 " | head -30 >> "$L/summary.txt"
gzip -f "$L/bench.log"
