#!/usr/bin/env bash
# Session 61, call 5 (≤ 250 s) → $OUT/s61e/. On an H200: the canonical `bench lora` (issue 2's grid). Elsewhere:
# the LoRA GPU tests other than the swap tiles and the tuner (run in s60b / s61b) under the widened swap rule.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s61e.sh
source "$(dirname "$0")/_device_prelude.sh" s61e
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
if [[ $gpu == *H200* ]]; then bench_lora 235; exit 0; fi
gpu_tests 230 12 tests/test_lora_gemm_gpu.py tests/test_nn_lora.py -k "not swap_ab_bf16 and not tune_lora"
gzip -f "$L/tests.log"
exit 0
