#!/usr/bin/env bash
# Session 23, device call 5: every W4A4 v2 GPU test with the new routing (no expander from W8_MIN_M tokens), the
# canonical `bench w4a4` and `bench ab`, then racecheck + synccheck of the no-expander kernel.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s23_call5.sh → $OUT/{session.log,gpu_tests.log,results.tar.gz,
#   sanitize_summary.txt,sanitize.tar.gz}
cd "$(dirname "$0")/.."
TEST_TIMEOUT=170 BENCH_TIMEOUT=140 bash scripts/gpu_session.sh --tests "tests/test_gluon_gpu.py tests/test_w4a4_gpu.py" \
    --suites "w4a4 ab"
SANITIZE_TOOLS="racecheck synccheck" SANITIZE_TIMEOUT=70 bash scripts/gpu_s23_sanitize.sh
