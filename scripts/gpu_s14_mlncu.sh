#!/usr/bin/env bash
# Session 14: each kernel of the fused multi-LoRA call on its own (ncu, clocks not locked): shrink, main with the
# branch, main without it, and the single-adapter LoRA kernels beside them.   bash scripts/gpu_s14_mlncu.sh → $OUT/mlncu
source "$(dirname "$0")/_device_prelude.sh" mlncu
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
for c in ${CASES:-16x28672x16x4 16x28672x16x1 64x28672x16x4 64x28672x16x1}; do
  timeout 150 ncu --clock-control none --csv --page raw --metrics \
gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread,launch__occupancy_limit_shared_mem,dram__throughput.avg.pct_of_peak_sustained_elapsed \
      python3 scripts/_ncu_multilora.py $c > "$L/ncu_$c.csv" 2> "$L/ncu_$c.err"
  say "== $c rc=$?"; grep "^plan" "$L/ncu_$c.csv" | cut -c1-400 | tee -a "$L/summary.txt"
  python3 - "$L/ncu_$c.csv" <<'PY' | tee -a "$L/summary.txt"
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
hdr = rows[0]; data = rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
n = len(data)
for r in data[n * 3 // 4 - 0:] if n >= 4 else data:
    print(r[ix["Kernel Name"]][:40], *(f"{h.split('__')[1][:22]}={r[ix[h]]}" for h in hdr if "__" in h))
PY
done
