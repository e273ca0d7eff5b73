#!/usr/bin/env bash
# Session 47, device call 5 (≤ 420 s), any GPU: the LoRA persistent strategies' sync words from the shared ticket
# region (no memset node per call) — the LoRA GPU tests, then `probe_lora_sync.py` (shared region vs a zeroed buffer
# per call, cuBLAS beside, paired ratios, one process) on issue 2's persistent cells, then the split-K multi-LoRA
# probe again.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s47d.sh → $OUT/s47d/
source "$(dirname "$0")/_device_prelude.sh" s47d
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 200 8 tests/test_lora_gemm_gpu.py tests/test_lora_midm_gpu.py
gzip -f "$L/tests.log"
probe_run probe_lora_sync 180 scripts/probe_lora_sync.py
