#!/usr/bin/env bash
# Session 41's fourth device call (≤ 300 s): W4A8 at decode sizes through the decode kernel's fp16 path — the W4A8
# GPU tests, then `bench w4a4 --only decode` with the W4A4 (auto) and W4A8 (a8) rows beside cuBLAS, one process.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s41d.sh → $OUT/s41d/
source "$(dirname "$0")/_device_prelude.sh" s41d
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
gpu_tests 240 4 tests/test_w4a8.py
timeout 150 python3 -m lowrank_gemm bench w4a4 --only decode --impls auto,a8 --out "$L/results" > "$L/bench_decode.log" 2>&1
say "bench w4a4 --only decode rc=$?"
grep -E "layer|gemm|cublas|fp8" "$L/bench_decode.log" | head -40 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" bench_decode.log && rm -f "$L/bench_decode.log"
