#!/usr/bin/env bash
# Session 52, device call 2 (≤ 110 s), any GPU → $OUT/s52b/: op `flat` with Y by TMA in quarters (op_flat_y4: the
# planner's config, 4 stages at r16) against op `flat` with pointer stores, timed in alternation with each other
# (x_pair) and with cuBLAS, on the cells `auto` routes to flat; the bare flattened GEMM with and without it
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s52b.sh
source "$(dirname "$0")/_device_prelude.sh" s52b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
probe_run probe_lora_flat_y4 100 scripts/probe_lora_flat.py --variants flat4_bare,flat4_bare_y4 --no-auto \
    --y-tma --y-tma-from 2 --pair-with op_flat --stem probe_lora_flat_y4 \
    --cells 4096x4096x4096x16,4096x4096x4096x64,1024x4096x4096x64,2048x4096x4096x16
