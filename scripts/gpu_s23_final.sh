#!/usr/bin/env bash
# Session 23, the last device call: every W4A4 v2 GPU test with the new routing (no expander from W8_MIN_M tokens),
# the canonical `bench w4a4` and `bench ab`, the fp32 w_scale probe (ws_f32, fc1 / fc2), racecheck of the
# no-expander kernel.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s23_final.sh
#   → $OUT/{session.log,gpu_tests.log,results.tar.gz,probe.tar.gz,sanitize_summary.txt,sanitize.tar.gz}
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TEST_TIMEOUT=150 BENCH_TIMEOUT=120 bash scripts/gpu_session.sh --tests "tests/test_gluon_gpu.py tests/test_w4a4_gpu.py" \
    --suites "w4a4 ab"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
timeout 70 python3 scripts/probe_w4a4_w8.py --out "$OUT/probe" --shapes fc1,fc2 > "$OUT/probe.log" 2>&1
echo "probe rc=$?" >> "$OUT/session.log"
(cd "$OUT" && tar czf probe.tar.gz probe probe.log && rm -rf probe probe.log)
SANITIZE_TOOLS="racecheck" SANITIZE_TIMEOUT=60 bash scripts/gpu_s23_sanitize.sh
