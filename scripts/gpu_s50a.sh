#!/usr/bin/env bash
# Session 50, device call 1 (≤ 360 s), any GPU: the flat strategy's GPU tests (S tasks in K slices on the programs
# with one tile fewer), then probe_lora_flat.py on issue 2's 18 cells from M = 1024 (the op's `flat`, the bare
# flattened GEMM, and the branch alone with S precomputed, against cuBLAS and `auto`, one process) → $OUT/s50a/
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s50a.sh
source "$(dirname "$0")/_device_prelude.sh" s50a
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 90 4 tests/test_lora_gemm_gpu.py -k flat
gzip -f "$L/tests.log"
probe_run probe_lora_flat 260 scripts/probe_lora_flat.py
