#!/usr/bin/env bash
# Session 41's third device call (≤ 400 s): the two-pass e4m3 quantizer (act_quant's 2l stats pass + an e4m3 pass)
# — the W4A8 GPU tests, its parts against act_quant, and `bench w4a4` (FLUX + decode) with the W4A4 (auto) and W4A8
# (a8) rows beside cuBLAS in one process.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s41c.sh → $OUT/s41c/
source "$(dirname "$0")/_device_prelude.sh" s41c
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
gpu_tests 240 4 tests/test_w4a8.py
probe_run parts 120 scripts/probe_a8_parts.py
timeout 200 python3 -m lowrank_gemm bench w4a4 --only flux --impls auto,a8 --out "$L/results" > "$L/bench_flux.log" 2>&1
say "bench w4a4 --only flux rc=$?"
grep -E "layer|gemm|cublas|fp8" "$L/bench_flux.log" | head -60 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" bench_flux.log && rm -f "$L/bench_flux.log"
