#!/usr/bin/env bash
# Session 47, device call 9 (≤ 150 s), any GPU: the two ticket probes after their refactor onto _ticket_probe.py, one
# cell each (they ran in full as calls 4–5 before it).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s47h.sh → $OUT/s47h/
source "$(dirname "$0")/_device_prelude.sh" s47h
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
probe_run probe_ml_tickets 60 scripts/probe_ml_tickets.py --cases 64x4096x16x16
probe_run probe_lora_sync 60 scripts/probe_lora_sync.py --cells 256x4096x4096x16
