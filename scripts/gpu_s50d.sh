#!/usr/bin/env bash
# Session 50, device call 5 (≤ 60 s), any GPU: the flat GPU tests after the rule narrowed to r > 16 (auto routing it
# at 1024×28672×4096 r64, in a CUDA graph) → $OUT/s50d/
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s50d.sh
source "$(dirname "$0")/_device_prelude.sh" s50d
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 50 4 tests/test_lora_gemm_gpu.py -k "flat or auto_planned"
gzip -f "$L/tests.log"
