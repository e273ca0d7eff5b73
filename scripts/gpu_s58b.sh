#!/usr/bin/env bash
# Session 58 (≤ 590 s, any GPU) → $OUT/s58b/: the GPU tests of the `unfused` strategy and of `tune lora` end to end,
# then `python -m lowrank_gemm tune lora` on six layer shapes no shipped table holds (Llama-2-7B MLP, Qwen2.5-14B
# gate/up, Phi-3-mini gate/up and down), the user table under $OUT/s58b/table, its report under $OUT/s58b/tune.
#   LOWRANK_GEMM_COMMIT=<hash> [SHAPES=MxKxNxR,…] [TOTAL=<s, default 580>] bash scripts/gpu_s58b.sh
source "$(dirname "$0")/_device_prelude.sh" s58b
t0=$SECONDS
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 200 4 tests/test_lora_gemm_gpu.py -k "unfused or tune"
mv "$L/tests.log" "$L/tune_tests.log"
SHAPES=${SHAPES:-256x4096x11008x16,256x11008x4096x16,1024x5120x13824x16,64x5120x13824x16,256x3072x16384x64,1024x8192x3072x16}
tune_lora $((${TOTAL:-580} - (SECONDS - t0) - 40)) "$SHAPES"
gzip -f "$L"/*.log
exit 0
