#!/usr/bin/env bash
# Session 60, call 2 (never ran; the next session's first call; ≤ 230 s, any GPU) → $OUT/s60b/: the 17–32-token
# swap-AB rule (on main at r ≤ 16, SWAP_32_MAX_R) on the GPU:
#  1. scripts/probe_decode_rows.py at M = 24 / 32 with an `auto` row at rank 64 (s60a timed r16 only);
#  2. its GPU tests (32-token swap tiles at real sizes: NaN-poisoned, bit-identical, graph replay) and the tuned-plan
#     and bench-grid feasibility tests it could touch;
#  3. with the time left, the probe at rank 16 (the auto row there).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s60b.sh
source "$(dirname "$0")/_device_prelude.sh" s60b
t0=$SECONDS
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
decode_rows 64 60
gpu_tests 120 8 tests/test_lora_gemm_gpu.py -k "swap_ab_bf16 or every_tuned_plan or bench_grid_is_feasible"
gzip -f "$L/tests.log"
left=$(( 215 - (SECONDS - t0) ))
(( left >= 30 )) && decode_rows 16 "$left"
exit 0
