#!/usr/bin/env bash
# Session 25: where the routed int4_g64 v2 kernel (no expander, coop, in flight, fp32 w_scale rows) spends its
# cycles at FLUX fc1 — ncu full set with source-level (SASS) stall sampling of its second launch, clocks free.
#   bash scripts/gpu_s25_ncu.sh → $OUT/ncu/{summary.txt,details.txt,sass.csv.gz}
source "$(dirname "$0")/_device_prelude.sh" ncu
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 400 ncu --clock-control none --set full --import-source yes -k regex:w4a4_ws_kernel --launch-skip 1 \
    --launch-count 1 -f -o /tmp/coop python3 scripts/_ncu_decode.py v2coop > "$L/ncu_run.log" 2>&1
say "ncu rc=$?"
ncu --import /tmp/coop.ncu-rep --page details > "$L/details.txt" 2>&1
ncu --import /tmp/coop.ncu-rep --page source --print-source sass --csv 2> "$L/sass.err" | gzip > "$L/sass.csv.gz"
grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Eligible Warps|No Eligible|Executed Ipc A|Compute \(SM\) Th|Memory Throughput|L2 Hit|Warp Cycles Per Issued" "$L/details.txt" | tee -a "$L/summary.txt"
ls -la "$L"
