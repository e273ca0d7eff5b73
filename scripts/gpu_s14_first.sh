#!/usr/bin/env bash
# Session 14, first call: the GPU tests of the session-13 review commit (launch / GEMV / skinny / W4A4 / LoRA /
# multi-LoRA), then int4_g64 at M = 1 with act_quant's early trigger + the GEMV's EPI_EARLY, twice (one process each).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s14_first.sh → $OUT/first
source "$(dirname "$0")/_device_prelude.sh" first
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout ${TEST_LIMIT:-330} python3 -m pytest -m gpu -q -n 8 --timeout=200 -p no:cacheprovider -W ignore -rf \
    tests/test_launch.py tests/test_multilora_gpu.py tests/test_w4a4_gpu.py tests/test_w4a4_gemv.py \
    tests/test_lora_gemm_gpu.py > "$L/gpu_tests.log" 2>&1
say "pytest rc=$?: $(tail -1 "$L/gpu_tests.log")"; grep -E "^FAILED|^ERROR" "$L/gpu_tests.log" | head -20 | tee -a "$L/summary.txt"
for rep in 1 2; do
  timeout 150 python3 scripts/probe_gemv.py --layer --fmt int4_g64 --shapes 28672:4096,14336:4096 \
      --variants "shipped;epi_early;early_deps;epi_early_deps" --out "$L/g64_$rep" > "$L/g64_$rep.log" 2>&1
  say "g64 rep $rep rc=$?"; grep "^|" "$L/g64_$rep.log" | tee -a "$L/summary.txt"
done
