#!/usr/bin/env bash
# Session 14: the multi-LoRA GPU tests on the new tuned plans, then `bench multilora` (full) and the W4A4 decode
# suite (int4_g64 at M = 1 now takes the early trigger + EPI_EARLY pair).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s14_bench.sh → $OUT/{session.log,gpu_tests.log,results.tar.gz}
cd "$(dirname "$0")/.."
BENCH_TIMEOUT=${BENCH_TIMEOUT:-330} bash scripts/gpu_session.sh --tests "tests/test_multilora_gpu.py" --suites "${SUITES:-multilora}"
