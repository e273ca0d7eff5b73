#!/usr/bin/env bash
# Session 43, device call 2 (≤ 420 s): the whole GPU suite (last complete run: session 35, 1040 passed; sessions 36–42
# ran only the suites they changed).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s43_full.sh → $OUT/s43_full/
source "$(dirname "$0")/_device_prelude.sh" s43_full
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 400 14 tests
gzip -f "$L/tests.log"
