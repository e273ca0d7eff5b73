#!/usr/bin/env bash
# Session 61, call 2 (≤ 250 s) → $OUT/s61b/. Only on an H200 (elsewhere it says so and stops): the canonical
# `bench lora` on issue 2's grid (cuBLAS, unfused torch, auto), not run on an H200 since session 30.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s61b.sh
source "$(dirname "$0")/_device_prelude.sh" s61b
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
[[ $gpu == *H200* ]] || { say "not an H200: nothing run"; exit 0; }
bench_lora 230
sed -n '/## Targets/,$p' "$L/lora/lora.md" >> "$L/summary.txt" 2>/dev/null
exit 0
