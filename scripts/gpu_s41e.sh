#!/usr/bin/env bash
# Session 41's fifth device call (≤ 400 s): the one-read fp16-operand row kernel (W4A8 decode) under the W4A8 GPU
# tests and `bench w4a4 --only decode`, then the A8 GEMM per in-flight depth / coop at the FLUX shapes.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s41e.sh → $OUT/s41e/
source "$(dirname "$0")/_device_prelude.sh" s41e
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
gpu_tests 240 4 tests/test_w4a8.py
timeout 150 python3 -m lowrank_gemm bench w4a4 --only decode --impls auto,a8 --out "$L/results" > "$L/bench_decode.log" 2>&1
say "bench w4a4 --only decode rc=$?"
grep -E "a8|auto" "$L/bench_decode.log" | head -40 >> "$L/summary.txt"
probe_run depth 200 scripts/probe_a8_depth.py
tar czf "$L/logs.tar.gz" -C "$L" bench_decode.log && rm -f "$L/bench_decode.log"
