#!/usr/bin/env bash
# Session 48, device call 4 (≤ 200 s), any GPU: `bench lora` (cuBLAS, unfused torch, auto) on the issue-2 grid after
# session 47's persistent-strategy change (the H100 table, bdd47fd, predates it) → $OUT/s48d/lora/.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s48d.sh → $OUT/s48d/
source "$(dirname "$0")/_device_prelude.sh" s48d
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
bench_lora 180
