#!/usr/bin/env bash
# Session 46, device call 6 (≤ 200 s): mode="auto" above 256 rows (segment there, unmeasured until now): segment
# (the sort included) against gather at M = 512 / 1024 with 4 to 64 adapters, the shipped plans.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s46f.sh → $OUT/s46f/
source "$(dirname "$0")/_device_prelude.sh" s46f
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
timeout 170 python3 scripts/probe_multilora_parts.py --out "$L/ml" --mode segment \
    --cases 1024x4096x16x4,1024x28672x16x4,1024x4096x16x64,1024x28672x16x64,512x4096x16x4,512x28672x16x4,1024x28672x64x16 \
    > "$L/ml.log" 2>&1
say "probe_multilora_parts --mode segment rc=$?"
grep -E "µs|WRONG" "$L/ml.log" >> "$L/summary.txt"
gzip -f "$L/ml.log"
