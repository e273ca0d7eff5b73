#!/usr/bin/env bash
# Queued in session 48 for the next device call (≤ 300 s), any GPU: the persistent kernel's early S-flag read
# (`LOWRANK_GEMM_S_POLL_EARLY=1`, off until measured) — the persistent / ticket-region GPU tests with it on, then
# `probe_lora_sync.py --s-poll` (shipped vs early read, cuBLAS paired, one process) on issue 2's persistent cells.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s49a.sh → $OUT/s49a/
source "$(dirname "$0")/_device_prelude.sh" s49a
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
LOWRANK_GEMM_S_POLL_EARLY=1 gpu_tests 120 8 tests/test_lora_gemm_gpu.py -k "ticket_region or persistent"
gzip -f "$L/tests.log"
probe_run probe_lora_sync 200 scripts/probe_lora_sync.py --s-poll \
    --cells 4096x28672x4096x16,4096x28672x4096x8,4096x8192x8192x64,4096x8192x8192x8,1024x28672x4096x16,1024x8192x8192x16,1024x4096x4096x16,256x4096x4096x16
# Ran in session 49 at c07c0e8 (H100, results/h100/probes/s49/s49a): no gain; the flag, its env and `--s-poll` were
# removed after it, so this script no longer runs as written.
