#!/usr/bin/env bash
# Session 61, call 3 (≤ 250 s) → $OUT/s61c/: the canonical `bench lora` on issue 2's grid (cuBLAS, unfused torch,
# auto) on whichever GPU comes — on an H200 the first since session 30; on an H100 the first since session 56
# (sessions 57–61 moved the 16 < M ≤ 64 rules: the grid's M = 64 row).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s61c.sh
source "$(dirname "$0")/_device_prelude.sh" s61c
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
bench_lora 235
exit 0
