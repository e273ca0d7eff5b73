#!/usr/bin/env bash
# Session 32, device call 1: the GPU suite at HEAD (session 31's host changes and the merged concurrent-stream test
# never ran there), the decode split/stream tests five more times (the one-off failure of s31 call 2), then ncu of
# the 8192² M = 1 LoRA plan (auto vs rank 0) and of the int4_g64 decode GEMM at M = 16.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s32_first.sh → $OUT/s32_first/…
source "$(dirname "$0")/_device_prelude.sh" s32_first
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
timeout 300 python3 -m pytest -m gpu tests -q -n 14 --timeout=150 -p no:cacheprovider -rf > "$L/tests.log" 2>&1
say "suite rc=$? $(tail -1 "$L/tests.log")"
grep -E "^FAILED|^ERROR" "$L/tests.log" | head -20 | tee -a "$L/summary.txt"
for i in 1 2 3 4 5; do
  timeout 120 python3 -m pytest -m gpu tests/test_w4a4_decode.py -k "split_stream or stream" -q -n 8 -p no:cacheprovider \
      > "$L/stream_$i.log" 2>&1
  say "stream round $i rc=$? $(tail -1 "$L/stream_$i.log")"
done
for what in auto bare; do
  timeout 150 ncu --clock-control none --set full --import-source yes -k regex:lora_main_kernel --launch-skip 1 \
      --launch-count 1 -f -o /tmp/lora_$what python3 scripts/_ncu_lora.py $what > "$L/ncu_$what.log" 2>&1
  say "ncu lora $what rc=$?"
  ncu --import /tmp/lora_$what.ncu-rep --page details > "$L/lora_$what.txt" 2>&1
done
timeout 150 ncu --clock-control none --set full --import-source yes -k regex:w4a4_decode_kernel --launch-skip 1 \
    --launch-count 1 -f -o /tmp/dec16 python3 scripts/_ncu_w4a4_decode.py > "$L/ncu_dec16.log" 2>&1
say "ncu decode M16 rc=$?"
ncu --import /tmp/dec16.ncu-rep --page details > "$L/dec16.txt" 2>&1
for f in lora_auto lora_bare dec16; do
  say "--- $f"
  grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Memory Throughput|DRAM Throughput|L2 Hit|Warp Cycles Per Issued|Dynamic Shared|Grid Size|Block Size" \
      "$L/$f.txt" | tee -a "$L/summary.txt"
done
ncu --import /tmp/dec16.ncu-rep --page source --print-source sass --csv 2>/dev/null | gzip > "$L/dec16_sass.csv.gz"
ncu --import /tmp/lora_auto.ncu-rep --page source --print-source sass --csv 2>/dev/null | gzip > "$L/lora_auto_sass.csv.gz"
tar czf "$OUT/s32_first_logs.tar.gz" -C "$L" tests.log $(cd "$L" && ls stream_*.log ncu_*.log)
rm -f "$L"/stream_*.log "$L"/ncu_*.log
