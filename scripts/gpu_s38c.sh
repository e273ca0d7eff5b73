#!/usr/bin/env bash
# Session 38's third device call (≤ 200 s): the fp16 decode path as int4_g64's default at 33–64 tokens — the GPU
# suites that route through it (layer and GEMM ops, decode kernel).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s38c.sh → $OUT/s38c/…
source "$(dirname "$0")/_device_prelude.sh" s38c
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 180 14 tests/test_w4a4_decode_f16.py tests/test_w4a4_gpu.py tests/test_w4a4_gemm.py tests/test_w4a4_decode.py
tar czf "$L/logs.tar.gz" -C "$L" tests.log && rm -f "$L/tests.log"
