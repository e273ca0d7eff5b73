#!/usr/bin/env bash
# Session 27, call 3: each kernel of the fused multi-LoRA call on its own (ncu, clocks not locked) where the rows
# expand lost or barely won: the shrink, main with the branch (appended / rows), main without it.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s27_call3.sh → $OUT/s27c3/{summary.txt,ncu_*.csv}
source "$(dirname "$0")/_device_prelude.sh" s27c3
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
run() {   # case variant tag
  timeout 120 ncu --clock-control none --csv --page raw --metrics \
gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum \
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
run 256x4096x16x64 main:64x128x128x4x1 app_lora
run 256x4096x16x64 main:64x128x128x4x1,expand:rows,rc:16 rows_lora
run 256x4096x16x64 expand:rows,rc:16 rows_tuned
run 256x4096x16x64 "" tuned
run 64x28672x16x16 "" t64
run 64x28672x16x16 expand:rows,rc:16 rows64
