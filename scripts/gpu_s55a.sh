#!/usr/bin/env bash
# Session 55's queue (≤ 450 s, any GPU): the flat GPU tests (8 shapes, 256×28672 r64 among them) and the graph-routing
# test, then probe_flat_trace.py on the 256-token pair, 1024×4096² r64 and 1024×8192² r64 (ps_st4 there: the other
# 128×256 r64 persistent_static entry at 3 stages; 4096×28672 left out: its unpaired rows drift within a call) →
# $OUT/s55a/
#   LOWRANK_GEMM_COMMIT=<hash> [CELLS=MxNxKxR,…] bash scripts/gpu_s55a.sh
source "$(dirname "$0")/_device_prelude.sh" s55a
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 180 2 tests/test_lora_gemm_gpu.py -k "flat_strategy or routes_flat"
probe_run trace 260 scripts/probe_flat_trace.py --cells "${CELLS:-256x28672x4096x16,256x28672x4096x64,1024x4096x4096x64,1024x8192x8192x64}"
