#!/usr/bin/env bash
# Session 24, call 2: the in-flight loop's diagnostic modes (scripts/diag_w4a4_route.py --modes): which change makes
# the no-expander in-flight kernel deterministic and equal to the expander route (call 1: it is neither, fp32 out).
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader > "$OUT/diag_modes.log"
timeout 400 python3 scripts/diag_w4a4_route.py --modes --out "$OUT" >> "$OUT/diag_modes.log" 2>&1
echo "diag rc=$?" >> "$OUT/diag_modes.log"
