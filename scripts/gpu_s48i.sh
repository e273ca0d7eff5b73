#!/usr/bin/env bash
# Session 48, device call 9 (≤ 300 s), any GPU: the persistent LoRA kernel's count of the tiles past their S wait as
# one lane's atomic read after the tile's store (READERS_LATE) — the persistent / ticket-region GPU tests, then
# `probe_lora_sync.py --readers` (shipped vs session 47's form, cuBLAS paired, one process) on issue 2's persistent
# cells from M = 256 to 4096.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s48i.sh → $OUT/s48i/
source "$(dirname "$0")/_device_prelude.sh" s48i
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 120 8 tests/test_lora_gemm_gpu.py -k "ticket_region or persistent"
gzip -f "$L/tests.log"
probe_run probe_lora_sync 200 scripts/probe_lora_sync.py --readers \
    --cells 4096x28672x4096x16,4096x28672x4096x8,4096x8192x8192x64,4096x8192x8192x8,1024x28672x4096x16,1024x8192x8192x16,1024x4096x4096x16,256x4096x4096x16
