#!/usr/bin/env bash
# Session 51, device call 2 (≤ 480 s): s51b's routing replication (two processes), then on an H200 the canonical
# `bench lora` and `bench multilora` tables (flat has never run on an H200) → $OUT/s51c/
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s51c.sh
here=$(dirname "$0")
OUT=${OUT:-/tmp/out} bash "$here/gpu_s51b.sh"
source "$here/_device_prelude.sh" s51c
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
if [[ $gpu == *H200* ]]; then
    bench_lora 170
    bench_multilora 180
fi
