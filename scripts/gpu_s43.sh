#!/usr/bin/env bash
# Session 43's one device call (≤ 590 s): session 42's queue in one call — the A8 GEMM per in-flight depth and
# orientation (trans at 2 / 4 / 6 groups per body, spill-free since session 42) beside fp8 and the W4A4 GEMM at the
# FLUX shapes, then the whole GPU suite (last complete run: session 35, 1040 passed; sessions 36–42 ran only the suites
# they changed; it holds session 41's act_quant host refactor, session 42's trans "1x4" case, the NaN-poisoned v2
# launch and the int4_2l SVDQLinear layers from quantize_).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s43.sh → $OUT/s43/
source "$(dirname "$0")/_device_prelude.sh" s43
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
probe_run a8_depth 170 scripts/probe_a8_depth.py
gpu_tests 400 14 tests
gzip -f "$L/tests.log"
