#!/usr/bin/env bash
# Session 26, call 5: the odd-ring hypothesis (skeleton docstring, "Strided roles"). Forced odd MAIN rings under the
# paired two-expander kernel (main:N bypasses the planner) should fault / hang / differ within 300 launches; the
# planner's even rings (the fix) and an even MAIN beside 16 RAW slots should not. M = 64, N = 28672, K = 4096.
#   bash scripts/gpu_s26_call5.sh → $OUT/s26c5/summary.txt
source "$(dirname "$0")/_device_prelude.sh" s26c5
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
for c in odd7_raw8=64,28672,4096,32,64,raw:8,main:7 g128_odd5=64,28672,4096,16,128,main:5 \
         r128_odd3=64,28672,4096,128,64,main:3 g128_fixed=64,28672,4096,16,128 r128_fixed=64,28672,4096,128,64 \
         even6_raw16=64,28672,4096,32,64,raw:16,main:6 raw16_fixed=64,28672,4096,32,64,raw:16 \
         odd7_raw4=64,28672,4096,32,64,raw:4,main:7; do
  RAW_GUARD_OFF=1 REPS=${REPS:-300} timeout 45 python3 scripts/_v2_stage_check.py "$c" > "$L/case.log" 2>&1; rc=$?
  say "rc=$rc $(grep -E "repeat|Error|error" "$L/case.log" | head -1 | cut -c1-160)  [$c]"
done
