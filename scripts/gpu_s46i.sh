#!/usr/bin/env bash
# Session 46, device call 9 (≤ 250 s): segment-mode plan candidates on five more M = 256 cells where mode="auto"
# runs segment (`probe_multilora_parts.py --mode segment`, as gpu_s46d.sh); winners ≥ 3 % are pinned on the CPU into
# the H100 table as `_seg` entries.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s46i.sh → $OUT/s46i/
source "$(dirname "$0")/_device_prelude.sh" s46i
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
segment_plans 200 256x28672x16x16,256x28672x64x16,256x4096x64x16,256x4096x16x4,256x4096x64x4
