#!/usr/bin/env bash
# Session 53, device call 2 (≤ 480 s): on an H200 the canonical tables (gpu_s51d.sh: the flat GPU tests, `bench lora`,
# `bench multilora` → $OUT/s51d/); on any other GPU the whole GPU test suite at this commit (last run whole in
# session 47, before the flat strategy) → $OUT/s53b/
#   LOWRANK_GEMM_COMMIT=<hash> [MULTILORA=0] [SUITE_T=<s>] [SUITE_FILES=<files>] bash scripts/gpu_s53b.sh   (short budget: the LoRA table
#   only on an H200, a shorter suite watchdog elsewhere)
here=$(dirname "$0")
if [[ $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) == *H200* ]]; then
    exec bash "$here/gpu_s51d.sh"
fi
source "$here/_device_prelude.sh" s53b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
timeout "${SUITE_T:-460}" python3 -m pytest -m gpu ${SUITE_FILES:-tests} -q -n 8 --timeout=90 -p no:cacheprovider -rf > "$L/tests.log" 2>&1
say "tests rc=$? $(tail -1 "$L/tests.log")"
grep -E "^FAILED|^ERROR" "$L/tests.log" | head -30 | tee -a "$L/summary.txt"
gzip -f "$L/tests.log"
