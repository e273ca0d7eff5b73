#!/usr/bin/env bash
# Session 54 (≤ 460 s): on an H200 the canonical `bench lora` (no multi-LoRA: no multi-LoRA kernel changed since
# session 48's table; no GPU tests: the whole suite passed on an H100 at da6ce5c) → $OUT/s54c/lora, then op flat's
# per-program stamps (probe_flat_trace.py); on any other GPU gpu_s54b.sh (the stamps, then compute-sanitizer
# memcheck and synccheck: TOOLS)
#   LOWRANK_GEMM_COMMIT=<hash> [TOOLS="memcheck synccheck" (empty: none)] [BENCH=0: no bench] bash scripts/gpu_s54c.sh
here=$(dirname "$0")
if [[ $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) != *H200* ]]; then
    TOOLS=${TOOLS-memcheck synccheck} exec bash "$here/gpu_s54b.sh"
fi
source "$here/_device_prelude.sh" s54c
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
[ "${BENCH:-1}" = 1 ] && bench_lora 200
probe_run trace 260 scripts/probe_flat_trace.py
