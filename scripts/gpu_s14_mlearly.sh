#!/usr/bin/env bash
# Session 14: multi-LoRA EPI_EARLY — its GPU tests, then the parts probe with the early candidates.
#   LOWRANK_GEMM_COMMIT=<hash> [CASES=...] bash scripts/gpu_s14_mlearly.sh → $OUT/mlearly
source "$(dirname "$0")/_device_prelude.sh" mlearly
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 200 python3 -m pytest -m gpu -q -n 8 --timeout=150 -p no:cacheprovider -W ignore -rf tests/test_multilora_gpu.py \
    > "$L/gpu_tests.log" 2>&1
say "pytest rc=$?: $(tail -1 "$L/gpu_tests.log")"; grep -E "^FAILED|^ERROR" "$L/gpu_tests.log" | head | tee -a "$L/summary.txt"
timeout 330 python3 scripts/probe_multilora_parts.py --early --out "$L" ${CASES:+--cases $CASES} > "$L/parts.log" 2>&1
say "parts rc=$?"; grep "^|" "$L/parts.log" | tee -a "$L/summary.txt"; grep -E "WRONG|Error" "$L/parts.log" | head
