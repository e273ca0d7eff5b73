#!/usr/bin/env bash
# Session 14, last call: `bench multilora` (full) on the final tuned table. (The budget left no room for the tests:
# the newly pinned plans were checked against the float64 reference in probes/s14/mlconfigs2 before timing, and the
# bench checks every fused row against shrink + expand.)
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s14_final.sh → $OUT/{session.log,results.tar.gz}
cd "$(dirname "$0")/.."
BENCH_TIMEOUT=280 bash scripts/gpu_session.sh --no-tests --suites multilora
