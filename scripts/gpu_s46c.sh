#!/usr/bin/env bash
# Session 46, device call 3 (≤ 420 s): segment mode's row sort, second version (16 rows per program, one cross-lane sum), and mode="auto" by M and adapters (`multilora_gemm.sort_rows`) — its timing
# against torch.sort per M, the multi-LoRA GPU tests (segment mode runs through it), then the full `bench multilora`
# (fused_segment includes the sort; session 45's H100 table is the before).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s46c.sh → $OUT/s46c/
source "$(dirname "$0")/_device_prelude.sh" s46c
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
probe_run sort 60 scripts/probe_sort_rows.py
multilora_grid
