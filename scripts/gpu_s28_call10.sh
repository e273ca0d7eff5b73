#!/usr/bin/env bash
# Session 28, call 10: the multi-LoRA heuristic on the six untuned Llama-3-8B cells it loses to shrink + expand
# (r16, 16–64 adapters), with this session's and the last's winners as one-knob variants (shrink by row on 8 warps,
# four adapters per appended step, the rows expand at M ≤ 64): scripts/probe_multilora_unseen.py.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s28_call10.sh → $OUT/s28c10/{summary.txt,probe_multilora_unseen.*}
source "$(dirname "$0")/_device_prelude.sh" s28c10
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
C="4096,6144,16,256,64;14336,4096,16,256,64;4096,14336,16,256,64;4096,6144,16,64,64;4096,14336,16,64,64;14336,4096,16,256,16"
timeout ${PROBE_TIMEOUT:-280} python3 scripts/probe_multilora_unseen.py --out "$L" --budget-s ${BUDGET_S:-180} \
    --cases "${CASES:-$C}" > "$L/probe.log" 2>&1
say "probe rc=$?"
grep -E "Error|error" "$L/probe.log" | head -5 | tee -a "$L/summary.txt"
cat "$L/probe_multilora_unseen.md" >> "$L/summary.txt" 2>/dev/null
cat "$L/summary.txt"
