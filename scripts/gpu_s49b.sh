#!/usr/bin/env bash
# Session 49, device calls 2–3 (≤ 400 s), any GPU: the flattened persistent LoRA kernel (candidate `lora_flat_kernel`)
# against cuBLAS and `auto` at issue 2's M = 1024 / 4096 cells; on an H200 also `bench lora` (the canonical table after
# session 48's barrier-free reset).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s49b.sh → $OUT/s49b/
source "$(dirname "$0")/_device_prelude.sh" s49b
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
probe_run probe_lora_flat 230 scripts/probe_lora_flat.py
if [[ $gpu == *H200* ]]; then
    bench_lora 170
fi
