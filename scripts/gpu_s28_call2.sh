#!/usr/bin/env bash
# Session 28, call 2: why the four-consumer kernel is slower — ncu (full set, SASS stall sampling) of its second
# launch at fc1, clocks free; then two probe knobs (gluon/w4a4_quad._probe_options: late release, staggered row
# halves) beside the routed kernel at fc1 and 3072².
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s28_call2.sh → $OUT/s28c2/{summary.txt,details.txt,sass.csv.gz,probe_w4a4_w8.*}
source "$(dirname "$0")/_device_prelude.sh" s28c2
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 240 python3 scripts/probe_w4a4_w8.py --out "$L" --shapes ${SHAPES:-fc1,sq} \
    --variants ${VARIANTS:-w8_quad,w8_quad_late,w8_quad_stagger,w8_quad_late_stagger} > "$L/probe.log" 2>&1
say "probe rc=$?"
cat "$L/probe_w4a4_w8.md" >> "$L/summary.txt" 2>/dev/null
timeout 200 ncu --clock-control none --set full --import-source yes -k regex:w4a4_quad_kernel --launch-skip 1 \
    --launch-count 1 -f -o /tmp/quad python3 scripts/_ncu_decode.py quad > "$L/ncu_run.log" 2>&1
say "ncu rc=$?"
ncu --import /tmp/quad.ncu-rep --page details > "$L/details.txt" 2>&1
ncu --import /tmp/quad.ncu-rep --page source --print-source sass --csv 2> "$L/sass.err" | gzip > "$L/sass.csv.gz"
grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Eligible Warps|No Eligible|Executed Ipc A|Compute \(SM\) Th|Memory Throughput|L2 Hit|Warp Cycles Per Issued|Shared Memory|Bank" "$L/details.txt" | tee -a "$L/summary.txt"
cat "$L/probe_w4a4_w8.md"
