#!/usr/bin/env bash
# Session 54, device call 2 (≤ 500 s): op flat's per-program stamps against pre, bare and the tuned persistent_static
# (probe_flat_trace.py), then compute-sanitizer memcheck / racecheck / synccheck on the op's in-grid-S kernels (flat,
# persistent_static: scripts/_sanitize_flat.py) → $OUT/s54b/
#   LOWRANK_GEMM_COMMIT=<hash> [TOOLS="memcheck racecheck synccheck" (empty: none)] bash scripts/gpu_s54b.sh
source "$(dirname "$0")/_device_prelude.sh" s54b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
probe_run trace 260 scripts/probe_flat_trace.py
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
for tool in ${TOOLS-memcheck racecheck synccheck}; do
    extra=""; [ "$tool" = racecheck ] && extra="--racecheck-report all"
    timeout 110 "$SAN" --tool "$tool" $extra python3 scripts/_sanitize_flat.py > "$L/san_$tool.log" 2>&1
    say "$tool rc=$? :: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|ok$|WRONG' "$L/san_$tool.log" | tr '\n' ' ')"
    gzip -f "$L/san_$tool.log"
done
