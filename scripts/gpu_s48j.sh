#!/usr/bin/env bash
# Session 48, device call 10 (≤ 420 s), any GPU: the issue grids after the session's changes — `bench lora` (cuBLAS,
# unfused torch, auto; the persistent kernel's late readers count) and `bench multilora` (the H200 segment pins) →
# $OUT/s48j/{lora,multilora}/; the multi-LoRA targets to the summary.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s48j.sh → $OUT/s48j/
source "$(dirname "$0")/_device_prelude.sh" s48j
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
bench_lora 180
bench_multilora 220
