#!/usr/bin/env bash
# Session 48, device call 2 (≤ 300 s), any GPU: where the multi-LoRA branch's time goes on the N = 4096 decode cells
# (ncu, each kernel on its own, clocks not locked): the shrink, the main kernel with the branch, the main kernel
# without it, on today's tuned plans.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s48b.sh → $OUT/s48b/{summary.txt,ncu_*.csv.gz}
source "$(dirname "$0")/_device_prelude.sh" s48b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
M48=gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread,\
dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active
run() { ncu_multilora 90 "$M48" "$1" "$2" "$3"; }    # case, plan edits, tag
run 64x4096x16x16 "" a16r16
run 64x4096x64x16 "" a16r64
run 64x4096x16x4 "" a4r16
run 16x4096x16x16 "" m16a16r16
run 16x4096x64x16 "" m16a16r64
run 64x4096x16x16 expand:epilogue a16r16_epi
