#!/usr/bin/env bash
# Session 44, device call 1 (≤ 460 s): session 43's queue (gpu_s43.sh) reordered so a call cut short still returns
# what decides a default: the W4A8 e4m3-path decode route's GPU test and its probe first, then the rest of the W4A4 /
# W4A8 GPU tests, then the A8 trans depths.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s44.sh → $OUT/s44/
source "$(dirname "$0")/_device_prelude.sh" s44
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 80 4 tests/test_w4a8.py -k xab
mv "$L/tests.log" "$L/tests_xab.log"; gzip -f "$L/tests_xab.log"
probe_run a8_decode_xab 90 scripts/probe_a8_decode_xab.py
gpu_tests 150 8 tests/test_w4a8.py tests/test_w4a4_gpu.py -k "not xab"
gzip -f "$L/tests.log"
probe_run a8_depth 170 scripts/probe_a8_depth.py
