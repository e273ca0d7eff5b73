#!/usr/bin/env bash
# Session 58, call 4 (≤ 590 s) → $OUT/s58d/. On an H200 first the canonical `bench lora` (issue 2's grid: cuBLAS,
# unfused torch, auto). Then, on any GPU, `tune lora` on issue 2's cells from M = 256 that miss their target on an
# H100 (results/h100/lora.md), the user table under $OUT/s58d/table: does any candidate beat the shipped plan by
# the 2 % margin? (session 5's probe swept these cells on an H200; the tuner's candidates add the rules' plan per
# strategy, flat, the integer one-launch splits and stream-K)
#   LOWRANK_GEMM_COMMIT=<hash> [SHAPES=MxKxNxR,…] [TOTAL=<s, default 580>] bash scripts/gpu_s58d.sh
source "$(dirname "$0")/_device_prelude.sh" s58d
t0=$SECONDS
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
[[ $gpu == *H200* ]] && bench_lora 220
SHAPES=${SHAPES:-256x4096x4096x16,256x4096x4096x64,256x4096x28672x16,256x4096x28672x64,256x8192x8192x64,256x4096x4096x8,256x8192x8192x16,256x4096x28672x8,1024x4096x4096x16}
tune_lora $((${TOTAL:-580} - (SECONDS - t0) - 40)) "$SHAPES"
gzip -f "$L"/*.log
exit 0
