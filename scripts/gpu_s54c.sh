#!/usr/bin/env bash
# Session 54 (≤ 540 s): on an H200 the canonical `bench lora` (gpu_s51d.sh without multi-LoRA: no multi-LoRA kernel
# changed since session 48's table) and then op flat's per-program stamps (probe_flat_trace.py) and compute-sanitizer
# memcheck on the in-grid-S kernels; on any other GPU gpu_s54b.sh (the stamps, then memcheck / racecheck / synccheck)
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s54c.sh
here=$(dirname "$0")
if [[ $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) == *H200* ]]; then
    MULTILORA=0 bash "$here/gpu_s51d.sh"
    TOOLS=memcheck exec bash "$here/gpu_s54b.sh"
fi
exec bash "$here/gpu_s54b.sh"
