#!/usr/bin/env bash
# Session 27, call 1: the rows expand (multilora_gemm.rows_expand, expand="rows") — its GPU tests, then
# probe_multilora_parts.py --rows on every multi-plan cell of issue 5 with ≥ 4 adapters (the cells where the
# appended expand's per-adapter chain is the tail), shrink + expand timed beside it.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s27_call1.sh → $OUT/s27c1/{summary.txt,tests.log,probe/…}
source "$(dirname "$0")/_device_prelude.sh" s27c1
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 240 python3 -m pytest -q -m gpu tests/test_multilora_gpu.py -k "rows_expand or appended_expand or pdl_and" \
    -p no:cacheprovider > "$L/tests.log" 2>&1
say "tests rc=$? $(tail -1 "$L/tests.log")"
CASES=${CASES:-64x4096x16x64,256x4096x16x64,64x4096x16x16,256x4096x16x16,256x4096x16x4,64x4096x64x64,64x4096x64x16,256x4096x64x16,256x4096x64x64,256x4096x64x4,16x4096x16x16,16x4096x64x16,64x28672x16x64,64x28672x16x16,256x28672x16x16,256x28672x16x64,64x28672x64x16,64x28672x64x64,256x28672x64x16,16x28672x16x16}
timeout ${PROBE_TIMEOUT:-420} python3 scripts/probe_multilora_parts.py --rows --out "$L/probe" --cases "$CASES" \
    > "$L/probe.log" 2>&1
say "probe rc=$?"
grep -E "WRONG|Error|error" "$L/probe.log" | head -5 | tee -a "$L/summary.txt"
cat "$L/probe/probe_multilora_parts.md" >> "$L/summary.txt" 2>/dev/null
