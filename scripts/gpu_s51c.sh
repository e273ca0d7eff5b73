#!/usr/bin/env bash
# Session 51, device call 2 (≤ 580 s): the flat GPU tests, s51b's routing replication (two processes), then on an
# H200 the canonical `bench lora` and `bench multilora` tables (flat has never run on an H200) → $OUT/s51c/
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s51c.sh
here=$(dirname "$0")
source "$here/_device_prelude.sh" s51c
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
gpu_tests 80 4 tests/test_lora_gemm_gpu.py -k "flat or auto_planned"
gzip -f "$L/tests.log"
OUT=$OUT bash "$here/gpu_s51b.sh"
if [[ $gpu == *H200* ]]; then
    bench_lora 170
    bench_multilora 180
fi
