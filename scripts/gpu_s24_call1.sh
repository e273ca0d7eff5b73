#!/usr/bin/env bash
# Session 24, call 1: where the no-expander W4A4 v2 route leaves v1 (scripts/diag_w4a4_route.py: every route variant
# on the FLUX layer's act_quant outputs against v1 and the float64 spec, with the tiles that differ), then the W4A4
# v2 GPU tests.   bash scripts/gpu_s24_call1.sh → $OUT/{diag.log,diag_w4a4_route.json,session.log,gpu_tests.log,…}
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
timeout 300 python3 scripts/diag_w4a4_route.py --out "$OUT" > "$OUT/diag.log" 2>&1
echo "diag rc=$?" >> "$OUT/diag.log"
TEST_TIMEOUT=150 bash scripts/gpu_session.sh --tests "tests/test_gluon_gpu.py tests/test_w4a4_gpu.py"
