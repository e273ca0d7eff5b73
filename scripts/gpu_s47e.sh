#!/usr/bin/env bash
# Session 47, device call 6 (≤ 240 s), any GPU: the full `bench multilora` with the split-K tickets from the shared
# region (and the H100 table's third segment entry, pinned after session 46's grid) → $OUT/s47e/multilora/.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s47e.sh → $OUT/s47e/
source "$(dirname "$0")/_device_prelude.sh" s47e
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
bench_multilora 220
