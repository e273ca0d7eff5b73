#!/usr/bin/env bash
# Session 43, device call 1 (≤ 440 s): the W4A4 and W4A8 GPU tests (session 41's act_quant host refactor; session 42's
# trans route at four groups per body, the NaN-poisoned v2 launch, int4_2l SVDQLinear layers from quantize_; session
# 43's W4A8 decode route on the e4m3 path, "xab"), the A8 GEMM per in-flight depth and orientation (trans at 2 / 4 / 6
# groups per body, spill-free since session 42) beside fp8 and the W4A4 GEMM at the FLUX shapes, and the W4A8 decode
# layer on the e4m3 path against its fp16 path.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s43.sh → $OUT/s43/
source "$(dirname "$0")/_device_prelude.sh" s43
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 170 8 tests/test_w4a8.py tests/test_w4a4_gpu.py
gzip -f "$L/tests.log"
probe_run a8_decode_xab 90 scripts/probe_a8_decode_xab.py
probe_run a8_depth 170 scripts/probe_a8_depth.py
