#!/usr/bin/env bash
# Session 51, device call 1 (≤ 590 s): the flat GPU tests (S tasks on the programs with slack, spare programs past the
# tiles), probe_lora_flat.py on the six 4096² / 1024×4096² cells where S was K-sliced over every program (and
# 256×28672: 1.7 waves), then on an H200 the canonical `bench lora` and `bench multilora` tables (flat has never run
# on an H200); on any other GPU the LoRA GPU tests instead → $OUT/s51a/
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s51a.sh
source "$(dirname "$0")/_device_prelude.sh" s51a
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
gpu_tests 80 4 tests/test_lora_gemm_gpu.py -k "flat or auto_planned"
gzip -f "$L/tests.log"; mv "$L/tests.log.gz" "$L/tests_flat.log.gz"
probe_run probe_lora_flat 120 scripts/probe_lora_flat.py --tuned-row \
    --cells 4096x4096x4096x8,4096x4096x4096x16,4096x4096x4096x64,1024x4096x4096x8,1024x4096x4096x16,1024x4096x4096x64,256x28672x4096x16,256x28672x4096x64
if [[ $gpu == *H200* ]]; then
    bench_lora 170
    bench_multilora 175
else
    gpu_tests 170 8 tests/test_lora_gemm_gpu.py
    gzip -f "$L/tests.log"
fi
