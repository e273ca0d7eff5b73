#!/usr/bin/env bash
# Session 14, last call: the GEMV / act_quant route tests and the multi-LoRA GPU tests on the final tables, then
# `bench multilora` (full).   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s14_final.sh → $OUT/{session.log,...}
cd "$(dirname "$0")/.."
TEST_TIMEOUT=150 BENCH_TIMEOUT=330 bash scripts/gpu_session.sh \
    --tests "tests/test_w4a4_gemv.py tests/test_multilora_gpu.py tests/test_act_quant.py" --suites multilora
