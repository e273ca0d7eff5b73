#!/usr/bin/env bash
# Session 58, call 5 (≤ 590 s) → $OUT/s58e/. Only on an H200 (elsewhere it says so and stops): the canonical
# `bench lora` (issue 2's grid: cuBLAS, unfused torch, auto), then `tune lora` on session 58's eight new layers.
#   LOWRANK_GEMM_COMMIT=<hash> [TOTAL=<s, default 580>] bash scripts/gpu_s58e.sh
source "$(dirname "$0")/_device_prelude.sh" s58e
t0=$SECONDS
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
[[ $gpu == *H200* ]] || { say "not an H200: nothing run"; exit 0; }
bench_lora 220
tune_lora $((${TOTAL:-580} - (SECONDS - t0) - 40)) \
    256x4096x11008x16,1024x8192x3072x16,512x4096x11008x16,256x5120x13824x16,256x11008x4096x16,1024x5120x13824x16,64x5120x13824x16,256x3072x16384x64
gzip -f "$L"/*.log
exit 0
