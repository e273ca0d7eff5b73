#!/usr/bin/env bash
# Session 27, call 4: the shrink's K slices under the best main-loop configs of call 2 (ncu, call 3: at M = 256, 64
# adapters the shrink alone takes 13.9 µs over 2 slices and sits on the critical path).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s27_call4.sh → $OUT/s27c4/{summary.txt,m256/…,m64/…}
source "$(dirname "$0")/_device_prelude.sh" s27c4
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 200 python3 scripts/probe_multilora_parts.py --out "$L/m256" \
    --cases 256x4096x16x64,256x4096x16x16,256x4096x16x4,256x4096x64x64,256x4096x64x16,256x4096x64x4 \
    --mains 64x128x128x4x1 --shrink-splits 4,8 > "$L/m256.log" 2>&1
say "m256 rc=$?"; grep -E "WRONG|Error" "$L/m256.log" | head -5 | tee -a "$L/summary.txt"
timeout 150 python3 scripts/probe_multilora_parts.py --out "$L/m64" --cases 64x4096x16x64,64x4096x16x16,64x4096x64x64 \
    --mains 64x64x128x4x2,64x32x128x5x1 --shrink-splits 8,16 > "$L/m64.log" 2>&1
say "m64 rc=$?"; grep -E "WRONG|Error" "$L/m64.log" | head -5 | tee -a "$L/summary.txt"
