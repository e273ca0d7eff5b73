#!/usr/bin/env bash
# Next session's first call (written in session 15, whose device time ran short of a full LoRA bench):
#   1. the LoRA GPU tests (kcat, the packed layout, the x-concat kernel's exactness and repeatability);
#   2. `bench lora` (full) with the fixed concat kernel: the auto_packed / kcat rows at M ≥ 256 next to auto.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s16_first.sh → $OUT/{session.log,gpu_tests.log,results.tar.gz}
cd "$(dirname "$0")/.."
TEST_TIMEOUT=170 BENCH_TIMEOUT=420 bash scripts/gpu_session.sh --tests "tests/test_lora_gemm_gpu.py" --suites lora
