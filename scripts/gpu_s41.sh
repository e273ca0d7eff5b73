#!/usr/bin/env bash
# Session 41's first device call (≤ 400 s): W4A8 (int4_g64 weights, per-token e4m3 activations, the v2 kernel's A8
# route) — its GPU tests, then `bench w4a4` on the FLUX and decode shapes with the routed W4A4 rows (auto) and the
# W4A8 rows (a8) beside cuBLAS bf16 / fp8 / int8 in one process.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s41.sh → $OUT/s41/{summary.txt,tests.log,results/}
source "$(dirname "$0")/_device_prelude.sh" s41
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 240 4 tests/test_w4a8.py
timeout 200 python3 -m lowrank_gemm bench w4a4 --only flux --impls auto,a8 --out "$L/results" > "$L/bench_flux.log" 2>&1
say "bench w4a4 --only flux rc=$?"
grep -E "layer|gemm|cublas|fp8" "$L/bench_flux.log" | head -60 >> "$L/summary.txt"
timeout 100 python3 -m lowrank_gemm bench w4a4 --only decode --impls auto,a8 --out "$L/results" > "$L/bench_decode.log" 2>&1
say "bench w4a4 --only decode rc=$?"
grep -E "layer|gemm|cublas|fp8" "$L/bench_decode.log" | head -40 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" bench_flux.log bench_decode.log && rm -f "$L/bench_flux.log" "$L/bench_decode.log"
