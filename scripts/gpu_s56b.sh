#!/usr/bin/env bash
# Session 56's second call (≤ 560 s) → $OUT/s56b/: on an H200 the canonical `bench lora` first (the H200 LoRA table is
# still session 30's); then the whole GPU suite (`pytest -m gpu tests`, 4 workers) in the time left.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s56b.sh
source "$(dirname "$0")/_device_prelude.sh" s56b
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
t=540
if [[ $gpu == *H200* ]]; then bench_lora 220; t=300; fi
gpu_tests $t 4 tests
gzip -f "$L/tests.log"
exit 0
