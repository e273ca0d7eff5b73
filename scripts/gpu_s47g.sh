#!/usr/bin/env bash
# Session 47, device call 8 (≤ 200 s), any GPU: the LoRA GPU tests on stream-K's tickets from the shared region.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s47g.sh → $OUT/s47g/
source "$(dirname "$0")/_device_prelude.sh" s47g
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 180 8 tests/test_lora_gemm_gpu.py tests/test_lora_midm_gpu.py
gzip -f "$L/tests.log"
