#!/usr/bin/env bash
# Session 50, device call 3 (≤ 240 s), any GPU: `auto` now routes flat where it measured ahead (planner.flat_plan) —
# the GPU tests of flat (incl. auto routing it, in a CUDA graph); flat on 128×128 tiles where the 128×256 plan slices
# its S tasks or runs ~2 waves (on 128×128 every S block fits the slack), against the planner's flat and auto; then
# `bench lora` at M = 1024 / 4096 (cuBLAS, unfused torch, auto: every cell the rule routes) → $OUT/s50b/
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s50b.sh
source "$(dirname "$0")/_device_prelude.sh" s50b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 60 4 tests/test_lora_gemm_gpu.py -k flat
gzip -f "$L/tests.log"
probe_run probe_lora_flat 90 scripts/probe_lora_flat.py --variants "" --op-tiles 128x128x64x4x4,128x128x64x8x4 \
    --cells 4096x4096x4096x16,4096x4096x4096x64,1024x4096x4096x16,1024x8192x8192x16
timeout 110 python3 -m lowrank_gemm bench lora --only cublas_base,torch_unfused,auto --ms 1024,4096 \
    --name lora_m1024_4096 --out "$L/lora" > "$L/lora.log" 2>&1
say "bench lora rc=$?"
gzip -f "$L/lora.log"
