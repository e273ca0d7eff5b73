#!/usr/bin/env bash
# Session 21, device call 5: bank mode with B_CLEAN loads and the batch-wide wrong-hint flag.
#   1. the multi-LoRA GPU tests; 2. probe_ml_bank.py at M = 16 / 64 / 256 on the issue-5 shapes;
#   3. `bench multilora`, full (canonical) → results.tar.gz.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s21_call5.sh → $OUT/{session.log,gpu_tests.log,probe.tar.gz,results.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TEST_TIMEOUT=150 bash scripts/gpu_session.sh --tests "tests/test_multilora_gpu.py"
rm -f "$OUT/results.tar.gz"
timeout 150 python3 scripts/probe_ml_bank.py --out "$OUT/probe" --ms 16,64,256 > "$OUT/probe.log" 2>&1
echo "probe rc=$?" >> "$OUT/session.log"
tar czf "$OUT/probe.tar.gz" -C "$OUT" probe probe.log && rm -rf "$OUT/probe" "$OUT/probe.log"
BENCH_TIMEOUT=${BENCH_TIMEOUT:-200} bash scripts/gpu_session.sh --no-tests --suites multilora
