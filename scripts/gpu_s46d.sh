#!/usr/bin/env bash
# Session 46, device call 4 (≤ 330 s): segment-mode plan candidates at M = 256 (the gather-tuned plans run there
# today) — `probe_multilora_parts.py --mode segment`, the sort included, gather beside it; winners are pinned on the
# CPU into the H100 table as the cases' `_seg` entries.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s46d.sh → $OUT/s46d/
source "$(dirname "$0")/_device_prelude.sh" s46d
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
segment_plans 280 256x4096x16x64,256x4096x64x64,256x28672x64x64,256x4096x16x16,256x28672x16x64
