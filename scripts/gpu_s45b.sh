#!/usr/bin/env bash
# Session 45, device call 4 (≤ 300 s): the two-pass quantizers' reversed second pass — its GPU tests (act_quant,
# W4A8), then scripts/probe_reverse.py.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s45b.sh → $OUT/s45b/
source "$(dirname "$0")/_device_prelude.sh" s45b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
probe_run reverse 200 scripts/probe_reverse.py
LOWRANK_GEMM_ACT_QUANT_REVERSE=1 gpu_tests 100 8 tests/test_act_quant.py tests/test_w4a8.py
gzip -f "$L/tests.log"
