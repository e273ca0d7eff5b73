#!/usr/bin/env bash
# Session 39's fifth device call (≤ 180 s): the GEMM op's packed-operand route back on v2 at 49–64 tokens
# (F16_PACKED_MAX_M = 48) — the decode_f16 / W4A4 gemm / gpu suites, then `bench w4a4 --only decode` at HEAD.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s39e.sh → $OUT/s39e/…
source "$(dirname "$0")/_device_prelude.sh" s39e
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 90 14 tests/test_w4a4_decode_f16.py tests/test_w4a4_gpu.py tests/test_w4a4_gemm.py
timeout 80 python3 -m lowrank_gemm bench w4a4 --only decode --out "$L/results" > "$L/bench_decode.log" 2>&1
say "bench w4a4 --only decode rc=$?"
grep -E "layer" "$L/bench_decode.log" | head -40 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" tests.log bench_decode.log && rm -f "$L/tests.log" "$L/bench_decode.log"
