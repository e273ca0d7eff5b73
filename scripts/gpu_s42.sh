#!/usr/bin/env bash
# Session 42's first call for the next device session (≤ 400 s): the W4A4 and W4A8 GPU tests (session 41's act_quant
# host refactor, CPU-checked only; session 42's trans route at four groups per body, the NaN-poisoned launch, and
# int4_2l SVDQLinear layers from quantize_ on the two-level kernels),
# then the A8 GEMM per in-flight depth and orientation — trans at 2 / 4 / 6 groups per body, spill-free since
# session 42 — beside fp8 and the W4A4 GEMM at the FLUX shapes (K = 12288 included: trans lost there in pairs).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s42.sh → $OUT/s42/
source "$(dirname "$0")/_device_prelude.sh" s42
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
gpu_tests 160 4 tests/test_w4a8.py tests/test_w4a4_gpu.py
probe_run a8_depth 220 scripts/probe_a8_depth.py
