#!/usr/bin/env bash
# Session 31, call 2: the reduce-overhead tests alone (fast answer), then the whole GPU suite on the same tree.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s31_tests.sh → $OUT/s31_tests/{summary.txt,ro.log} + gpu_session.sh's files
source "$(dirname "$0")/_device_prelude.sh" s31_tests
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 200 python3 -m pytest -q -m gpu tests -k "reduce_overhead or outside_graph_pools" -n 8 -p no:cacheprovider -rf \
    > "$L/ro.log" 2>&1
say "reduce-overhead tests rc=$? $(tail -1 "$L/ro.log")"
grep -E "^FAILED|^E   .*Error" "$L/ro.log" | head -12 | tee -a "$L/summary.txt"
TEST_TIMEOUT=${TEST_TIMEOUT:-330} bash scripts/gpu_session.sh
