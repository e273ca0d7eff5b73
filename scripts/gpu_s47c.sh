#!/usr/bin/env bash
# Session 47, device call 4 (≤ 300 s), any GPU: the multi-LoRA split-K tickets from the shared per-stream region
# (no memset node per call) — the multi-LoRA GPU tests, then `probe_ml_tickets.py` (shared region vs a zeroed buffer
# per call, cuBLAS beside, one process) on the tuned split-K cells.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s47c.sh → $OUT/s47c/
source "$(dirname "$0")/_device_prelude.sh" s47c
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 170 8 tests/test_multilora_gpu.py tests/test_nn_multilora.py tests/test_multilora_stack.py
gzip -f "$L/tests.log"
probe_run probe_ml_tickets 100 scripts/probe_ml_tickets.py
