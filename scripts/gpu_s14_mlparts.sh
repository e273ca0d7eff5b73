#!/usr/bin/env bash
# Session 14: where the fused multi-LoRA GEMM's time goes on the cells just above 1.10× cuBLAS (base product alone,
# the single-adapter LoRA kernel on the same bytes).   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s14_mlparts.sh
source "$(dirname "$0")/_device_prelude.sh" mlparts
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 280 python3 scripts/probe_multilora_parts.py --out "$L" ${CASES:+--cases $CASES} > "$L/parts.log" 2>&1
say "parts rc=$?"; grep "^|" "$L/parts.log" | tee -a "$L/summary.txt"; tail -3 "$L/parts.log"
