#!/usr/bin/env bash
# Session 24, calls 3 and 4 (4: one fence per slot pair, the expander loop fenced before its MMA wait): the fenced
# slot release (the no-expander in-flight race fix) and fp32 w_scale rows by default —
# every W4A4 v2 GPU test (the new fp32-output repeat test included), the canonical `bench w4a4` and `bench ab`, and
# the no-expander probe (fc1, fc2; M sweep 256-1024 for the fenced expander route against session 23's numbers).
#   bash scripts/gpu_s24_call3.sh → $OUT/{session.log,gpu_tests.log,results.tar.gz,probe.tar.gz}
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TEST_TIMEOUT=150 BENCH_TIMEOUT=120 bash scripts/gpu_session.sh --tests "tests/test_gluon_gpu.py tests/test_w4a4_gpu.py" \
    --suites "w4a4 ab"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
timeout 150 python3 scripts/probe_w4a4_w8.py --out "$OUT/probe" --shapes fc1,fc2 --msweep 256,512,1024 \
    > "$OUT/probe.log" 2>&1
echo "probe rc=$?" >> "$OUT/session.log"
(cd "$OUT" && tar czf probe.tar.gz probe probe.log && rm -rf probe probe.log)
