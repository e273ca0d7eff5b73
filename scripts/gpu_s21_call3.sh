#!/usr/bin/env bash
# Session 21, device call 3: bank mode with the wrong-hint path after the store (1457eb5).
#   1. the multi-LoRA GPU tests (bank mode at real sizes, wrong hints, graph replay);
#   2. scripts/probe_ml_bank.py: bank / the multi plan / the single-adapter op / a wrong hint, one process, at the
#      issue-5 one-adapter cells;
#   3. `bench multilora`, full (canonical multilora.{json,md,png}) → results.tar.gz.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s21_call3.sh → $OUT/{session.log,gpu_tests.log,probe.tar.gz,results.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TEST_TIMEOUT=200 bash scripts/gpu_session.sh --tests "tests/test_multilora_gpu.py"
rm -f "$OUT/results.tar.gz"
timeout 150 python3 scripts/probe_ml_bank.py --out "$OUT/probe" > "$OUT/probe.log" 2>&1
echo "probe rc=$?" >> "$OUT/session.log"
tar czf "$OUT/probe.tar.gz" -C "$OUT" probe probe.log && rm -rf "$OUT/probe" "$OUT/probe.log"
BENCH_TIMEOUT=${BENCH_TIMEOUT:-300} bash scripts/gpu_session.sh --no-tests --suites multilora
