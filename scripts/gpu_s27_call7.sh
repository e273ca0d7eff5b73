#!/usr/bin/env bash
# Session 27, call 7: the shrink by row on the single-adapter tile (64×128×128, split 1) at N = 4096 M = 256 — the
# one cell behind shrink + expand, where call 6's row shrink alone tied it on the old 128×128 tile.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s27_call7.sh → $OUT/s27c7/{summary.txt,probe/…}
source "$(dirname "$0")/_device_prelude.sh" s27c7
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 150 python3 scripts/probe_multilora_parts.py --out "$L/probe" --mains 64x128x128x4x1 --shrink-rows 2,4 \
    --cases ${CASES:-256x4096x16x64,256x4096x64x64,256x4096x16x16} > "$L/probe.log" 2>&1
say "probe rc=$?"; grep -E "WRONG|Error" "$L/probe.log" | head -5 | tee -a "$L/summary.txt"
