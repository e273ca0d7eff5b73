#!/usr/bin/env bash
# Session 59, call 2 (≤ 590 s, any GPU) → $OUT/s59b/:
#  1. scripts/probe_decode_rows.py: one 64-row tile at M = 24…64 (why 32 tokens ran slower than 64 in s59a), and
#     swap-AB split tiles on the next power of two ≥ M tokens, on s59a's two shapes and issue 2's three;
#  2. the tuner's GPU test on its own (s59a's 120 s cut it off; it took 167 s with the others in s58f);
#  3. on an H200 only, with the time left: the canonical `bench lora` (issue 2's grid; last on an H200 in session 30).
#   LOWRANK_GEMM_COMMIT=<hash> [TOTAL=<s, default 570>] bash scripts/gpu_s59b.sh
source "$(dirname "$0")/_device_prelude.sh" s59b
t0=$SECONDS
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
probe_run rows 240 scripts/probe_decode_rows.py
left=$(( ${TOTAL:-570} - (SECONDS - t0) ))
(( left >= 200 )) && gpu_tests $(( left < 230 ? left - 10 : 230 )) 2 tests/test_lora_gemm_gpu.py -k "tune"
if [[ $gpu == *H200* ]] && (( SECONDS - t0 < 330 )); then
    bench_lora $((570 - (SECONDS - t0)))
    tar czf "$L/lora.tgz" -C "$L" lora && rm -rf "$L/lora"    # a call brings back at most 8 files
fi
gzip -f "$L"/*.log 2>/dev/null
exit 0
