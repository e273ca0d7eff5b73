#!/usr/bin/env bash
# Session 14: the two-CTA main-loop configs on the cells that still lose to shrink + expand (64 adapters) and on the
# N = 4096 target cells, and three untuned N = 14336 cells (the heuristic plan vs its BK = 64 variants).   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s14_mlconfigs2.sh → $OUT/mlconfigs2
source "$(dirname "$0")/_device_prelude.sh" mlconfigs2
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
CASES=${CASES:-64x28672x16x64,64x4096x16x64,256x4096x16x64,64x14336x16x1,64x14336x16x4,16x14336x16x4,16x4096x16x1,16x4096x16x4,16x4096x16x16,\
16x4096x64x1,16x4096x64x4,16x4096x64x16,64x4096x16x1,64x4096x16x4,64x4096x16x16,64x4096x64x1,64x4096x64x4,64x4096x64x16}
timeout 500 python3 scripts/probe_multilora_parts.py --configs --out "$L" --cases $CASES > "$L/parts.log" 2>&1
say "parts rc=$?"; grep "^|" "$L/parts.log" | grep -v -- "---" | tee -a "$L/summary.txt"; grep -E "WRONG|Error" "$L/parts.log" | head
