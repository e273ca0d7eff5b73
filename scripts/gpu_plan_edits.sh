#!/usr/bin/env bash
# One device call: single-field edits of multi-LoRA cells' tuned plans, timed beside cuBLAS and shrink + expand
# (scripts/probe_multilora_parts.py --edits; each edit checked against float64 first).
#   CASES=MxNxRxA,… EDITS="NAME:field=v,…;…" LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_plan_edits.sh NAME
#   → $OUT/NAME/{summary.txt,probe.log,probe/probe_multilora_parts.{json,md}}
source "$(dirname "$0")/_device_prelude.sh" "${1:?a name for the log directory}"
: "${CASES:?CASES=MxNxRxA,…}" "${EDITS:?EDITS=NAME:field=v,…;…}"
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout ${PROBE_TIMEOUT:-400} python3 scripts/probe_multilora_parts.py --out "$L/probe" --cases "$CASES" \
    --edits "$EDITS" > "$L/probe.log" 2>&1
say "probe rc=$?"
grep -E "WRONG|Error|error|rejects" "$L/probe.log" | head -8 | tee -a "$L/summary.txt"
cat "$L/probe/probe_multilora_parts.md" >> "$L/summary.txt" 2>/dev/null
cat "$L/summary.txt"
