#!/usr/bin/env bash
# Session 41's second device call (≤ 300 s): what the W4A8 layer pays beside its GEMM (scripts/probe_a8_parts.py), and
# ncu of the A8 kernel at FLUX fc1 (stall reasons, issue and tensor-pipe use) against the routed int4 kernel's
# session-25 profile.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s41b.sh → $OUT/s41b/
source "$(dirname "$0")/_device_prelude.sh" s41b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
probe_run parts 120 scripts/probe_a8_parts.py
timeout 200 ncu --clock-control none --set full --import-source no -k regex:w4a4_ws -s 1 -c 1 \
    -o "$L/a8_fc1" python3 scripts/_a8_ncu_case.py > "$L/ncu.log" 2>&1
say "ncu rc=$?"
ncu --import "$L/a8_fc1.ncu-rep" --page details --print-units base > "$L/a8_fc1_details.txt" 2>&1
grep -E "Duration|Issue Slots Busy|Executed Ipc A|Eligible Warps|No Eligible|Tensor|Registers Per|Warp Cycles Per Issued" \
    "$L/a8_fc1_details.txt" | head -20 >> "$L/summary.txt"
ncu --import "$L/a8_fc1.ncu-rep" --page raw --print-units base --csv 2>/dev/null \
    | python3 -c "
import csv, sys
rows = list(csv.reader(sys.stdin))
h, v = rows[0], rows[-1]
for name, val in zip(h, v):
    if name.startswith('smsp__average_warp_latency_issue_stalled') or name.startswith('smsp__pcsamp_warps_issue_stalled'):
        print(name, val)
" | sort -t' ' -k2 -g -r | head -24 > "$L/stalls.txt"
cat "$L/stalls.txt" >> "$L/summary.txt"
gzip -f "$L/a8_fc1_details.txt"
