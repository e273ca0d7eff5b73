#!/usr/bin/env bash
# Session 48, device call 2 (≤ 300 s), any GPU: where the multi-LoRA branch's time goes on the N = 4096 decode cells
# (ncu, each kernel on its own, clocks not locked): the shrink, the main kernel with the branch, the main kernel
# without it, on today's tuned plans.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s48b.sh → $OUT/s48b/{summary.txt,ncu_*.csv}
source "$(dirname "$0")/_device_prelude.sh" s48b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
run() {   # case variant tag
  timeout 90 ncu --clock-control none --csv --page raw --metrics \
gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
      python3 scripts/_ncu_multilora.py $1 $2 > "$L/ncu_$3.csv" 2> "$L/ncu_$3.err"
  say "== $3 ($1 $2) rc=$?"
  python3 - "$L/ncu_$3.csv" <<'PY' | tee -a "$L/summary.txt"
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
hdr = rows[0]; data = rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
per_round = len(data) // 4
for r in data[-per_round:]:
    print(r[ix["Kernel Name"]][:28], *(f"{h.split('__')[1][:18]}={r[ix[h]]}" for h in hdr if "__" in h))
PY
}
run 64x4096x16x16 "" a16r16
run 64x4096x64x16 "" a16r64
run 64x4096x16x4 "" a4r16
run 16x4096x16x16 "" m16a16r16
run 16x4096x64x16 "" m16a16r64
run 64x4096x16x16 expand:epilogue a16r16_epi
