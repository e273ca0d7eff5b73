#!/usr/bin/env bash
# Session 41's review check (≤ 150 s): the act_quant host refactor (_fed_plan, _launch_row_stats) under the W4A4 and
# W4A8 GPU tests.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s41l.sh → $OUT/s41l/
source "$(dirname "$0")/_device_prelude.sh" s41l
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
gpu_tests 130 4 tests/test_w4a8.py tests/test_w4a4_gpu.py
