#!/usr/bin/env bash
# Session 43, device call 2: the full GPU suite at HEAD (last complete run: session 35, 1040 passed; sessions 36–42
# ran only the suites they changed).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s43_full.sh → $OUT/s43_full/…
source "$(dirname "$0")/_device_prelude.sh" s43_full
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 480 14 tests
grep -E "passed|failed" "$L/tests.log" | tail -3 >> "$L/summary.txt"
gzip -f "$L/tests.log"
