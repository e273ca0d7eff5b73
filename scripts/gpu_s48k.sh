#!/usr/bin/env bash
# Session 48, device call 11 (≤ 200 s): on an H200, `bench lora` (cuBLAS, unfused torch, auto) after the barrier-free
# persistent reset → $OUT/s48k/lora/ (the canonical H200 table); on any other GPU, the LoRA GPU tests instead.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s48k.sh → $OUT/s48k/
source "$(dirname "$0")/_device_prelude.sh" s48k
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
if [[ $gpu == *H200* ]]; then
    bench_lora 170
else
    gpu_tests 170 8 tests/test_lora_gemm_gpu.py
    gzip -f "$L/tests.log"
fi
