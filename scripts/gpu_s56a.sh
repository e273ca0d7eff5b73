#!/usr/bin/env bash
# Session 56's first call (≤ 520 s), whichever GPU comes. On an H200: the canonical `bench lora` (→ $OUT/s56a/lora;
# the H200 LoRA table is still session 30's), then the flat GPU tests and the trace probe at 256×28672 r64 and
# 1024×8192² r64 (ps_st4: does a 4th stage win on this GPU too?). On any other GPU: gpu_s55a.sh (session 55's queue).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s56a.sh
here=$(dirname "$0")
if [[ $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) != *H200* ]]; then
    exec bash "$here/gpu_s55a.sh"
fi
source "$here/_device_prelude.sh" s56a
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
bench_lora 200
gpu_tests 150 2 tests/test_lora_gemm_gpu.py -k "flat_strategy or routes_flat"
probe_run trace 150 scripts/probe_flat_trace.py --cells 256x28672x4096x64,1024x8192x8192x64
