#!/usr/bin/env bash
# Session 61, call 2 (≤ 250 s) → $OUT/s61b/.
#  On an H200: the canonical `bench lora` on issue 2's grid (cuBLAS, unfused torch, auto), not run on an H200
#  since session 30.
#  Elsewhere: the GPU tests of the 32-token swap tiles at a ragged rank (20×5000×3000 r40, new), then
#  scripts/probe_decode_rows.py at M = 24 / 32 with `auto` rows at r32 (never timed) and r64 (the rule widened to
#  r ≤ 64 from s60b's rows: auto now the swap tile).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s61b.sh
source "$(dirname "$0")/_device_prelude.sh" s61b
t0=$SECONDS
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
if [[ $gpu == *H200* ]]; then
    bench_lora 230
    exit 0
fi
gpu_tests 80 8 tests/test_lora_gemm_gpu.py -k "swap_ab_bf16 and 20x5000"
gzip -f "$L/tests.log"
decode_rows 32 70
left=$(( 215 - (SECONDS - t0) ))
(( left >= 30 )) && decode_rows 64 "$left"
exit 0
