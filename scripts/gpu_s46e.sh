#!/usr/bin/env bash
# Session 46, device call 5 (≤ 330 s): the multi-LoRA GPU tests (mode="auto" by M, N and adapters; the segment
# entries) and the full `bench multilora` on the H100 table (two segment-mode entries from s46d; fused_segment
# includes the one-launch sort).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s46e.sh → $OUT/s46e/
source "$(dirname "$0")/_device_prelude.sh" s46e
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
multilora_grid
