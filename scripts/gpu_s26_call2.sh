#!/usr/bin/env bash
# Session 26, call 2: raw_stages=16 faulted the paired two-expander int4_g64 kernel in call 1 (its ledger then chose 7
# MAIN stages). Which factor — an odd MAIN ring once the K loop wraps it, or the RAW depth — and do routed plans hit
# it (group 128: 5 MAIN stages; rank 128: 3)? One process per case (scripts/_v2_stage_check.py), then memcheck on the
# first failing case.   bash scripts/gpu_s26_call2.sh → $OUT/s26c2/summary.txt
source "$(dirname "$0")/_device_prelude.sh" s26c2
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
CASES=${CASES:-"odd7_raw4=64,2048,4096,32,64,raw:4,main:7 even6_raw16=64,2048,4096,32,64,raw:16,main:6 \
g128_default=64,2048,4096,16,128 r128_default=64,2048,4096,128,64 raw16_default=64,2048,4096,32,64,raw:16 \
g128_one_expander=64,2048,4096,16,128,expanders:1 odd7_unpaired=64,2048,4096,32,64,main:7,paired:0 \
odd5_raw4=64,2048,4096,32,64,raw:4,main:5 even4_raw4=64,2048,4096,32,64,raw:4,main:4 \
g128_m256=256,4096,4096,32,128 r96_m16=16,4096,4096,96,64"}
first_bad=""
for c in $CASES; do
  timeout 120 python3 scripts/_v2_stage_check.py "$c" > "$L/case.log" 2>&1; rc=$?
  say "rc=$rc $(grep -E " ok | MISMATCH " "$L/case.log" || tail -1 "$L/case.log" | cut -c1-160)  [$c]"
  [ $rc = 0 ] || [ -n "$first_bad" ] || first_bad=$c
done
if [ -n "$first_bad" ]; then
  timeout 240 compute-sanitizer --tool memcheck --print-limit 20 python3 scripts/_v2_stage_check.py "$first_bad" \
      > "$L/memcheck.log" 2>&1
  say "memcheck rc=$? on $first_bad"; grep -E "Invalid|ERROR SUMMARY|Address|at 0x|by thread" "$L/memcheck.log" | head -12 | tee -a "$L/summary.txt"
fi
