#!/usr/bin/env bash
# Session 28, call 13: the heuristic's rows-expand plans on 64-wide tiles (c. call 12) as shipped — the two untuned
# M = 64 cells with shrink + expand beside (probe_multilora_parts.py: `fused` is the heuristic there), then the
# multi-LoRA GPU tests.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s28_call13.sh → $OUT/s28c13/{summary.txt,probe/…,multilora.log}
source "$(dirname "$0")/_device_prelude.sh" s28c13
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 150 python3 scripts/probe_multilora_parts.py --out "$L/probe" --cases "${CASES:-64x6144x16x64,64x14336x16x64}" \
    --edits "stages4:main.num_stages=4" > "$L/probe.log" 2>&1
say "probe rc=$?"
cat "$L/probe/probe_multilora_parts.md" >> "$L/summary.txt" 2>/dev/null
timeout 150 python3 -m pytest -q -m gpu tests/test_multilora_gpu.py -n 8 -p no:cacheprovider -rf > "$L/multilora.log" 2>&1
say "multilora tests rc=$? $(tail -1 "$L/multilora.log")"
cat "$L/summary.txt"
