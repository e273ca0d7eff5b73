#!/usr/bin/env bash
# Session 58 (≤ 590 s) → $OUT/s58a/. On an H200: the canonical `bench lora` (issue 2's grid: cuBLAS, unfused torch,
# auto; the H200's table is still session 30's), then the GPU tests of what changed host-side since the GPU last ran
# the tree (75f2509: read_table, pre_shrink, _stores_by_tma, the W4A4 table's reader) in the time left. On any other
# GPU: the whole GPU suite (8 workers).
#   LOWRANK_GEMM_COMMIT=<hash> [TOTAL=<s, default 580>] bash scripts/gpu_s58a.sh
source "$(dirname "$0")/_device_prelude.sh" s58a
t0=$SECONDS
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
if [[ $gpu == *H200* ]]; then
    bench_lora 220
    left=$((${TOTAL:-580} - (SECONDS - t0)))
    say "changed-path GPU tests with ${left} s left"
    [ $left -gt 60 ] && gpu_tests $left 8 tests/test_lora_gemm_gpu.py tests/test_gluon_lora_gpu.py tests/test_w4a4_gpu.py
else
    gpu_tests $((${TOTAL:-580} - (SECONDS - t0))) 8 tests
fi
gzip -f "$L"/*.log
exit 0
