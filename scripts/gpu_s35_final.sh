#!/usr/bin/env bash
# Session 35, device call 3: the GPU suites this session touched (multi-LoRA incl. its fp8 base, fp8 LoRA, the row
# quantizer, tensor-parallel shards), then the multi-LoRA fp8 probe with fp8_plan's 128-wide K step for the widened W
# beside the tuned K step (ml_w8a16_tuned_bk).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s35_final.sh → $OUT/s35_final/…
source "$(dirname "$0")/_device_prelude.sh" s35_final
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 260 14 tests/test_multilora_gpu.py tests/test_multilora_fp8.py tests/test_lora_fp8_weight.py \
    tests/test_row_quant.py tests/test_parallel.py tests/test_multilora_bank.py tests/test_multilora_stack.py
timeout 170 python3 scripts/probe_multilora_fp8.py --out "$L/results" > "$L/probe_ml.log" 2>&1
say "multilora fp8 probe rc=$?"
grep -E "^ROW|^SKIP" "$L/probe_ml.log" | cut -c1-200 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" tests.log probe_ml.log && rm -f "$L/tests.log" "$L/probe_ml.log"
