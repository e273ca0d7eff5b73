#!/usr/bin/env bash
# Session 60, call 2 (≤ 300 s, any GPU) → $OUT/s60b/: the 17–32-token swap-AB rule now on main, on the GPU:
#  1. its GPU tests (32-token swap tiles at real sizes: NaN-poisoned, bit-identical, graph replay) and the tuned-plan
#     and bench-grid feasibility tests it could touch;
#  2. scripts/probe_decode_rows.py at M = 24 / 32 with an `auto` row, at rank 16 and rank 64 (s60a timed r16 only).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s60b.sh
source "$(dirname "$0")/_device_prelude.sh" s60b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 150 4 tests/test_lora_gemm_gpu.py -k "swap_ab_bf16 or every_tuned_plan or bench_grid_is_feasible"
gzip -f "$L/tests.log"
for r in 16 64; do
    mkdir -p "$L/r$r"
    timeout 100 python3 scripts/probe_decode_rows.py --out "$L/r$r" --ms 24,32 --r "$r" > "$L/r$r.log" 2>&1
    say "rows r$r rc=$?"
    grep -E "^ROW|FAIL|Error" "$L/r$r.log" | sed 's/^ROW //' >> "$L/summary.txt"
    gzip -f "$L/r$r.log"                              # 6 files in all: a call brings back ≤ 8
done
exit 0
