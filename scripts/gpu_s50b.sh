#!/usr/bin/env bash
# Session 50, device call 2 (≤ 330 s), any GPU: `auto` now routes flat where it measured ahead (planner.flat_plan) —
# the LoRA GPU tests of flat and auto, then `bench lora` (cuBLAS, unfused torch, auto) → $OUT/s50b/ (lora/ is that
# GPU's issue 2 table)
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s50b.sh
source "$(dirname "$0")/_device_prelude.sh" s50b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 100 4 tests/test_lora_gemm_gpu.py -k "flat or auto"
gzip -f "$L/tests.log"
bench_lora 210
