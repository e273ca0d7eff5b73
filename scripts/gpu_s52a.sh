#!/usr/bin/env bash
# Session 52, device call 1 (≤ 590 s), any GPU: on an H200 first the flat GPU tests, `bench lora` and `bench
# multilora` (the canonical tables, session 51's s51d), then flat_plan's narrow-layer rule on the untimed shapes
# (s51e) and op `flat` at the 256-token cells (1.7 waves of 128×256 tiles at N = 28672; never timed since S_STAGES)
# with the bare flattened GEMM and the branch's epilogue alone, against the tuned entry → $OUT/s52a/
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s52a.sh
source "$(dirname "$0")/_device_prelude.sh" s52a
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
if [[ $gpu == *H200* ]]; then
    gpu_tests 70 4 tests/test_lora_gemm_gpu.py -k "flat or auto_planned"
    gzip -f "$L/tests.log"
    bench_lora 170
    bench_multilora 175
fi
probe_run probe_lora_flat 80 scripts/probe_lora_flat.py --variants "" --no-auto --tuned-row \
    --cells 2048x4096x4096x16,2048x4096x4096x64,8192x4096x4096x16,4096x4096x14336x64,1024x4096x14336x16
probe_run probe_lora_flat_256 80 scripts/probe_lora_flat.py --variants flat4_bare,flat4_pre --no-auto --tuned-row \
    --cells 256x28672x4096x16,256x28672x4096x64,256x4096x4096x16,256x8192x8192x64
