#!/usr/bin/env bash
# Session 22, device call 3: `bench multilora`, full (canonical), with the paired ratios at the target's cells.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s22_call3.sh → $OUT/{session.log,results.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BENCH_TIMEOUT=${BENCH_TIMEOUT:-400} bash scripts/gpu_session.sh --no-tests --suites multilora
