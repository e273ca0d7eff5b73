#!/usr/bin/env bash
# Session 51, device call 4 (≤ 120 s), any GPU: flat_plan's narrow-layer rule on shapes it routes that no call has
# measured (M = 2048 / 8192, K = 14336), op `flat` against the tuned entry and cuBLAS, one process → $OUT/s51e/
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s51e.sh
source "$(dirname "$0")/_device_prelude.sh" s51e
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
probe_run probe_lora_flat 110 scripts/probe_lora_flat.py --variants "" --no-auto --tuned-row \
    --cells 2048x4096x4096x16,2048x4096x4096x64,8192x4096x4096x16,4096x4096x14336x64,1024x4096x14336x16
