#!/usr/bin/env bash
# Session 45, device call 6 (≤ 330 s, an H100): the LoRA and multi-LoRA issue grids on an H100 (the shipped plans are
# tuned on the H200), cuBLAS in the same process: `bench lora --only cublas_base,torch_unfused,auto`, then
# `bench multilora`, whatever finishes.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s45d.sh → $OUT/s45d/
source "$(dirname "$0")/_device_prelude.sh" s45d
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
bench_lora 110
bench_multilora 200
