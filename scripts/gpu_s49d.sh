#!/usr/bin/env bash
# Session 49, device call 4 (≤ 330 s), any GPU: the flat strategy's GPU tests (S tasks in the grid), then
# probe_lora_flat.py on issue 2's 18 cells from M = 1024 (the op's `flat` and the bare flattened GEMM against cuBLAS and
# `auto`, one process) → $OUT/s49d/
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s49d.sh
source "$(dirname "$0")/_device_prelude.sh" s49d
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 90 4 tests/test_lora_gemm_gpu.py -k flat
gzip -f "$L/tests.log"
probe_run probe_lora_flat 220 scripts/probe_lora_flat.py
