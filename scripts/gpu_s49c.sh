#!/usr/bin/env bash
# Session 49, device call 3 (≤ 330 s), any GPU: the flat strategy's GPU tests, then probe_lora_flat.py (the TMA-branch
# flattened kernel, the op's `flat`, the unflattened kernel and the bare flattened GEMM against cuBLAS and `auto`, one
# process) → $OUT/s49c/
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s49c.sh
source "$(dirname "$0")/_device_prelude.sh" s49c
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 90 4 tests/test_lora_gemm_gpu.py -k flat
gzip -f "$L/tests.log"
probe_run probe_lora_flat 220 scripts/probe_lora_flat.py
