#!/usr/bin/env bash
# Session 27, call 2: main-loop configs under the appended and the rows expand at N = 4096 (the column where the
# multi-LoRA kernel's base product is 4–10 µs behind cuBLAS: fused_base in call 1), shrink + expand beside them.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s27_call2.sh → $OUT/s27c2/{summary.txt,m64/…,m256/…}
source "$(dirname "$0")/_device_prelude.sh" s27c2
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 200 python3 scripts/probe_multilora_parts.py --out "$L/m64" --cases 64x4096x16x64,64x4096x16x16,64x4096x64x64,64x4096x64x16 \
    --mains 64x32x256x4x1,64x32x128x5x1,64x64x128x4x1,64x64x128x4x2 > "$L/m64.log" 2>&1
say "m64 rc=$?"; grep -E "WRONG|Error" "$L/m64.log" | head -5 | tee -a "$L/summary.txt"
timeout 260 python3 scripts/probe_multilora_parts.py --out "$L/m256" \
    --cases 256x4096x16x64,256x4096x16x16,256x4096x16x4,256x4096x64x64,256x4096x64x16,256x4096x64x4 \
    --mains 64x128x128x4x1,64x128x128x4x2,64x64x128x4x1 > "$L/m256.log" 2>&1
say "m256 rc=$?"; grep -E "WRONG|Error" "$L/m256.log" | head -5 | tee -a "$L/summary.txt"
