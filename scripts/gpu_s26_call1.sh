#!/usr/bin/env bash
# Session 26, call 1: the int4_g64 v2 kernel at decode M (two expanders, paired; the routed kernel at 3 ≤ M < 512
# for N = 28672) — RAW slots (bytes in flight), 64-wide tiles, one expander — GEMM alone, same process
# (probe_w4a4_w8.py); then ncu (full set, SASS stall sampling) of the routed kernel at M = 64.
#   bash scripts/gpu_s26_call1.sh → $OUT/s26c1/{summary.txt,probe_w4a4_w8.{json,md},details.txt,sass.csv.gz}
source "$(dirname "$0")/_device_prelude.sh" s26c1
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout ${PROBE_TIMEOUT:-240} python3 scripts/probe_w4a4_w8.py --out "$L" --shapes ${SHAPES:-dec64,dec16,dec256} \
    --variants ${VARIANTS:-v2_raw8,v2_raw12,v2_raw16,v2_bn64,v2_bn64_raw12,v2_ex1} > "$L/probe.log" 2>&1
say "probe rc=$?"; grep -E "Error|rejected" "$L/probe.log" | head -10 | tee -a "$L/summary.txt"
cat "$L/probe_w4a4_w8.md" >> "$L/summary.txt" 2>/dev/null
[ "${NCU:-1}" = 1 ] || exit 0
timeout 200 ncu --clock-control none --set full --import-source yes -k regex:w4a4_ws_kernel --launch-skip 1 \
    --launch-count 1 -f -o /tmp/dec python3 scripts/_ncu_decode.py v2dec 64 > "$L/ncu_run.log" 2>&1
say "ncu rc=$?"
ncu --import /tmp/dec.ncu-rep --page details > "$L/details.txt" 2>&1
ncu --import /tmp/dec.ncu-rep --page source --print-source sass --csv 2> "$L/sass.err" | gzip > "$L/sass.csv.gz"
grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Eligible Warps|No Eligible|Executed Ipc A|Compute \(SM\) Th|Memory Throughput|DRAM Throughput|L2 Hit|Warp Cycles Per Issued|Grid Size" "$L/details.txt" | tee -a "$L/summary.txt"
