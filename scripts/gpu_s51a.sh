#!/usr/bin/env bash
# Session 51, device call 1 (≤ 450 s): the flat GPU tests (auto routing flat at 1024×28672×4096 r64 in a CUDA graph),
# then on an H200 the canonical `bench lora` and `bench multilora` tables (flat has never run on an H200); on any other
# GPU the LoRA GPU tests instead → $OUT/s51a/
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s51a.sh
source "$(dirname "$0")/_device_prelude.sh" s51a
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
gpu_tests 60 4 tests/test_lora_gemm_gpu.py -k "flat or auto_planned"
gzip -f "$L/tests.log"; mv "$L/tests.log.gz" "$L/tests_flat.log.gz"
if [[ $gpu == *H200* ]]; then
    bench_lora 170
    bench_multilora 200
else
    gpu_tests 170 8 tests/test_lora_gemm_gpu.py
    gzip -f "$L/tests.log"
fi
