#!/usr/bin/env bash
# Session 61, call 4 (≤ 250 s) → $OUT/s61d/. On an H200: the canonical `bench lora` (issue 2's grid), the first
# there since session 30. Elsewhere: the full `bench multilora` (issue 5's grid; on an H100 last at acd7128).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s61d.sh
source "$(dirname "$0")/_device_prelude.sh" s61d
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
if [[ $gpu == *H200* ]]; then bench_lora 235; else bench_multilora 235; fi
exit 0
