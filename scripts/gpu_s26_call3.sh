#!/usr/bin/env bash
# Session 26, call 3: call 1's fault (raw_stages=16 at M = 64, N = 28672, under CUDA-graph replay) did not reproduce at
# N = 2048 (call 2). Repeat the full-size case: 300 eager launches per case against the routed plan's bits, then the
# probe's graph replays of the decode variants once more; memcheck on a failing case.
#   bash scripts/gpu_s26_call3.sh → $OUT/s26c3/summary.txt
source "$(dirname "$0")/_device_prelude.sh" s26c3
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
first_bad=""
for c in default_r4=64,28672,4096,32,64 raw16=64,28672,4096,32,64,raw:16 raw12=64,28672,4096,32,64,raw:12 \
         bn64=64,28672,4096,32,64,bn:64 odd7_raw4=64,28672,4096,32,64,raw:4,main:7; do
  REPS=300 timeout 120 python3 scripts/_v2_stage_check.py "$c" > "$L/case.log" 2>&1; rc=$?
  say "rc=$rc $(grep -E "repeat|Error" "$L/case.log" | head -2 | cut -c1-200)  [$c]"
  [ $rc = 0 ] || [ -n "$first_bad" ] || first_bad=$c
done
timeout 200 python3 scripts/probe_w4a4_w8.py --out "$L" --shapes dec64 \
    --variants v2_raw16,v2_raw8,v2_bn64,v2_bn64_raw12,v2_ex1 > "$L/probe.log" 2>&1
say "probe rc=$?"; grep -E "Error" "$L/probe.log" | head -3 | tee -a "$L/summary.txt"
cat "$L/probe_w4a4_w8.md" >> "$L/summary.txt" 2>/dev/null
if [ -n "$first_bad" ]; then
  REPS=20 timeout 200 compute-sanitizer --tool memcheck --print-limit 10 python3 scripts/_v2_stage_check.py "$first_bad" \
      > "$L/memcheck.log" 2>&1
  say "memcheck rc=$? on $first_bad"; grep -E "Invalid|ERROR SUMMARY|Address|by thread" "$L/memcheck.log" | head -12 | tee -a "$L/summary.txt"
fi
