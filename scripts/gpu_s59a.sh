#!/usr/bin/env bash
# Session 59, call 1 (≤ 590 s, any GPU) → $OUT/s59a/:
#  1. gemm_n2's GPU tests and the wide-tile probe (session 58's gpu_s58j, never run);
#  2. the tuner's and the unfused strategy's GPU tests (b2e1868's host mends have not run on a GPU);
#  3. `tune lora` on the decode-M tile rule's changed plans (N = 5632 / 5120, M = 32 / 64, r 8 / 16 / 64): each
#     reports today's plan (the new rule) beside every candidate, the old rule's 64×32×256 among them.
#   LOWRANK_GEMM_COMMIT=<hash> [TOTAL=<s, default 570>] bash scripts/gpu_s59a.sh
source "$(dirname "$0")/_device_prelude.sh" s59a
t0=$SECONDS
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 150 4 tests/test_gemm_n2.py
mv "$L/tests.log" "$L/tests_n2.log"
probe_run wide 140 scripts/probe_wide_tiles.py
grep -E "^M=" <(zcat "$L/wide.log.gz") | tee -a "$L/summary.txt"
gpu_tests 120 4 tests/test_lora_gemm_gpu.py -k "unfused or tune"
mv "$L/tests.log" "$L/tests_tune.log"
tune_lora $((${TOTAL:-570} - (SECONDS - t0) - 40)) \
    32x2048x5632x16,64x2048x5632x64,32x5120x5120x16,64x5120x5120x16,64x5120x5120x64,32x2048x5632x8,64x2048x5632x8,32x5120x5120x64,64x5120x5120x8,32x2048x5632x64,32x5120x5120x8
gzip -f "$L"/*.log
exit 0
