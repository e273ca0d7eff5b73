#!/usr/bin/env bash
# Session 48, device call 10 (≤ 420 s), any GPU: the issue grids after the session's changes — `bench lora` (cuBLAS,
# unfused torch, auto; the persistent kernel's late readers count) and `bench multilora` (the H200 segment pins) →
# $OUT/s48j/{lora,multilora}/; the multi-LoRA targets to the summary.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s48j.sh → $OUT/s48j/
source "$(dirname "$0")/_device_prelude.sh" s48j
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
timeout 180 python3 -m lowrank_gemm bench lora --only cublas_base,torch_unfused,auto --out "$L/lora" > "$L/lora.log" 2>&1
say "bench lora rc=$?"
gzip -f "$L/lora.log"
timeout 220 python3 -m lowrank_gemm bench multilora --out "$L/multilora" > "$L/multilora.log" 2>&1
say "bench multilora rc=$?"
sed -n '/## Targets/,$p' "$L/multilora/multilora.md" >> "$L/summary.txt"
gzip -f "$L/multilora.log"
