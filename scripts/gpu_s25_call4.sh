#!/usr/bin/env bash
# Session 25 call 4: the bank-conflict-free ws_perm against the unpermuted rows (probe, GEMM alone), then the canonical
# `bench w4a4` and `bench ab` on the new default (four groups per in-flight body).
#   bash scripts/gpu_s25_call4.sh → $OUT/depth/*, $OUT/session.log, $OUT/results.tar.gz
cd "$(dirname "$0")/.."
TEST_FILES=none VARIANTS=w8_coop_inflight2_ws32,w8_coop_inflight2_ws32_perm,w8_coop_inflight4_ws32,w8_coop_inflight4_ws32_perm \
    PROBE_TIMEOUT=200 bash scripts/gpu_s25_depth.sh
BENCH_TIMEOUT=200 bash scripts/gpu_session.sh --no-tests --suites "w4a4 ab"
