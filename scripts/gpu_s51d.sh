#!/usr/bin/env bash
# Session 51, device call 3 (≤ 420 s): the flat GPU tests (auto routing flat on a narrow layer with spare programs,
# in a CUDA graph), then `bench lora` (cuBLAS, unfused torch, auto) after flat_plan took the narrow layers; on an
# H200 also `bench multilora` (the canonical tables) → $OUT/s51d/
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s51d.sh
source "$(dirname "$0")/_device_prelude.sh" s51d
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
gpu_tests 80 4 tests/test_lora_gemm_gpu.py -k "flat or auto_planned"
gzip -f "$L/tests.log"
bench_lora 200
if [[ $gpu == *H200* && ${MULTILORA:-1} == 1 ]]; then     # MULTILORA=0 where the device budget is short
    bench_multilora 175
fi
