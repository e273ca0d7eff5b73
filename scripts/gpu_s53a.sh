#!/usr/bin/env bash
# Session 53, device call 1 (≤ 560 s) → $OUT/s52b/ and, on an H200, $OUT/s51d/: first op `flat` with Y by TMA in
# quarters against op `flat` (gpu_s52b.sh, ≤ 110 s, any GPU); then, only on an H200, the flat GPU tests and the
# canonical `bench lora` / `bench multilora` tables (gpu_s51d.sh, ≤ 420 s)
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s53a.sh
here=$(dirname "$0")
bash "$here/gpu_s52b.sh"
if [[ $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) == *H200* ]]; then
    bash "$here/gpu_s51d.sh"
fi
