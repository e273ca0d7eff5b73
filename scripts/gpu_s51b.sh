#!/usr/bin/env bash
# Session 51, device call 2 (≤ 190 s), any GPU: the routing question after s51a — op `flat` (S blocks two per program
# with slack) against `auto` and the tuned entry, cuBLAS beside them, on 4096² (3.9 waves, tuned `split`) and on the
# r16 cells where flat_plan defers to the tuned `persistent_static`, and 1024×4096² r16 / r64 (the S tasks on their own
# deeper pipeline, `flat_s_stages`); two processes → $OUT/s51b/
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s51b.sh
source "$(dirname "$0")/_device_prelude.sh" s51b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
for run in 1 2; do
    mkdir -p "$L/run$run"
    timeout 90 python3 scripts/probe_lora_flat.py --out "$L/run$run" --variants "" --tuned-row \
        --cells 4096x4096x4096x8,4096x4096x4096x16,4096x4096x4096x64,4096x28672x4096x16,4096x8192x8192x16,1024x4096x4096x16,1024x4096x4096x64 \
        > "$L/run$run/probe.log" 2>&1
    say "run$run rc=$?"
    grep -E "^\| [0-9]" "$L/run$run/probe_lora_flat.md" | cut -d'|' -f2-6,9,10 >> "$L/summary.txt"
done
