#!/usr/bin/env bash
# Session 22, device call 2: stacked bank mode (2–4 adapters of rank 16/32 at M ≤ 64 on the single-adapter kernels).
#   1. the multi-LoRA GPU tests (the stacked-mode ones included);
#   2. `bench multilora`, full (canonical): `fused` takes the stacked route where it applies, `fused_multi` times the
#      multi-LoRA plan it replaces in the same process → results.tar.gz.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s22_call2.sh → $OUT/{session.log,gpu_tests.log,results.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TEST_TIMEOUT=170 bash scripts/gpu_session.sh --tests "tests/test_multilora_gpu.py"
rm -f "$OUT/results.tar.gz"
BENCH_TIMEOUT=${BENCH_TIMEOUT:-240} bash scripts/gpu_session.sh --no-tests --suites multilora
