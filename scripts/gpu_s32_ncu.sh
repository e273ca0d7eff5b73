#!/usr/bin/env bash
# For the next session (written in session 31, not yet run): ncu over the 8192² M = 1 decode plan, `auto` (words)
# against the same tile with rank 0, clocks free, full set, SASS stall sampling of `auto`.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s32_ncu.sh → $OUT/ncu_lora/{summary.txt,auto.txt,bare.txt,sass.csv.gz}
source "$(dirname "$0")/_device_prelude.sh" ncu_lora
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
for what in auto bare; do
  timeout 200 ncu --clock-control none --set full --import-source yes -k regex:lora_main_kernel --launch-skip 1 \
      --launch-count 1 -f -o /tmp/lora_$what python3 scripts/_ncu_lora.py $what > "$L/ncu_$what.log" 2>&1
  say "ncu $what rc=$? $(head -1 "$L/ncu_$what.log")"
  ncu --import /tmp/lora_$what.ncu-rep --page details > "$L/$what.txt" 2>&1
  say "--- $what"
  grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Memory Throughput|DRAM Throughput|L2 Hit|Warp Cycles Per Issued|Dynamic Shared" \
      "$L/$what.txt" | tee -a "$L/summary.txt"
done
ncu --import /tmp/lora_auto.ncu-rep --page source --print-source sass --csv 2> "$L/sass.err" | gzip > "$L/sass.csv.gz"
