#!/usr/bin/env bash
# Session 27, call 3: each kernel of the fused multi-LoRA call on its own (ncu, clocks not locked) where the rows
# expand lost or barely won: the shrink, main with the branch (appended / rows), main without it.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s27_call3.sh → $OUT/s27c3/{summary.txt,ncu_*.csv}
source "$(dirname "$0")/_device_prelude.sh" s27c3
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
M27=gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread,\
dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum
run() { ncu_multilora 120 "$M27" "$1" "$2" "$3"; }    # case, plan edits, tag
run 256x4096x16x64 main:64x128x128x4x1 app_lora
run 256x4096x16x64 main:64x128x128x4x1,expand:rows,rc:16 rows_lora
run 256x4096x16x64 expand:rows,rc:16 rows_tuned
run 256x4096x16x64 "" tuned
run 64x28672x16x16 "" t64
run 64x28672x16x16 expand:rows,rc:16 rows64
