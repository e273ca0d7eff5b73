#!/usr/bin/env bash
# Session 58, call 3 (≤ 590 s, any GPU) → $OUT/s58c/: the GPU tests of `unfused` and `tune lora` (now with the
# one-launch splits and stream-K that even out a partial wave), then `tune lora` on eight layer shapes no shipped
# table holds, the user table under $OUT/s58c/table, the report under $OUT/s58c/tune.
#   LOWRANK_GEMM_COMMIT=<hash> [SHAPES=MxKxNxR,…] [TOTAL=<s, default 580>] bash scripts/gpu_s58c.sh
source "$(dirname "$0")/_device_prelude.sh" s58c
t0=$SECONDS
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 200 4 tests/test_lora_gemm_gpu.py -k "unfused or tune"
mv "$L/tests.log" "$L/tune_tests.log"
SHAPES=${SHAPES:-256x4096x11008x16,1024x8192x3072x16,512x4096x11008x16,256x5120x13824x16,256x11008x4096x16,1024x5120x13824x16,64x5120x13824x16,256x3072x16384x64}
tune_lora $((${TOTAL:-580} - (SECONDS - t0) - 40)) "$SHAPES"
gzip -f "$L"/*.log
exit 0
