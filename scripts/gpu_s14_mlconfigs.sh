#!/usr/bin/env bash
# Session 14: multi-LoRA two-CTA main-loop configs — the parts probe with --configs.
#   LOWRANK_GEMM_COMMIT=<hash> [CASES=...] bash scripts/gpu_s14_mlconfigs.sh → $OUT/mlconfigs
source "$(dirname "$0")/_device_prelude.sh" mlconfigs
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
CASES=${CASES:-16x28672x16x1,16x28672x16x4,16x28672x16x16,16x28672x64x1,16x28672x64x4,16x28672x64x16,\
64x28672x16x1,64x28672x16x4,64x28672x16x16,64x28672x64x1,64x28672x64x4,64x28672x64x16}
timeout 480 python3 scripts/probe_multilora_parts.py --configs --out "$L" --cases $CASES > "$L/parts.log" 2>&1
say "parts rc=$?"; grep "^|" "$L/parts.log" | tee -a "$L/summary.txt"; grep -E "WRONG|Error" "$L/parts.log" | head
