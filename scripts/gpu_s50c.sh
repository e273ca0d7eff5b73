#!/usr/bin/env bash
# Session 50, device call 4 (≤ 150 s), any GPU: flat against the tuned table's entry (pinned) and cuBLAS, side by
# side in one process, on the six cells flat_plan routed in s50b → $OUT/s50c/
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s50c.sh
source "$(dirname "$0")/_device_prelude.sh" s50c
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
probe_run probe_lora_flat 140 scripts/probe_lora_flat.py --variants "" --no-auto --tuned-row \
    --cells 4096x28672x4096x16,4096x28672x4096x64,4096x8192x8192x16,4096x8192x8192x64,1024x28672x4096x16,1024x28672x4096x64
