#!/usr/bin/env bash
# Session 35, device call 4: the two-term fp8 x with the residual's own accumulator on the swapped decode tiles
# (LoRA and multi-LoRA). Tests, then `bench lora --fp8` at decode (error and time of auto_w8a8x2 beside one term and
# cuBLAS), then the multi-LoRA probe's decode cells.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s35_loacc.sh → $OUT/s35_loacc/…
source "$(dirname "$0")/_device_prelude.sh" s35_loacc
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 150 12 tests/test_lora_fp8_weight.py tests/test_multilora_fp8.py tests/test_row_quant.py
timeout 100 python3 -m lowrank_gemm bench lora --fp8 --kn 4096x28672,4096x4096 --ranks 16 --ms 1,16,64 \
    --only cublas_base,auto_w8a8,auto_w8a8x2 --name lora_fp8_decode --out "$L/results" > "$L/bench.log" 2>&1
say "bench rc=$?"
grep -E "auto_w8a8|cublas" "$L/bench.log" | grep graph | head -20 >> "$L/summary.txt"
timeout 80 python3 scripts/probe_multilora_fp8.py --out "$L/results" \
    --cases 1x28672x4096x4,16x28672x4096x16,64x28672x4096x16 > "$L/probe_ml.log" 2>&1
say "multilora fp8 probe rc=$?"
grep -E "^ROW|^SKIP" "$L/probe_ml.log" | grep -E "w8a8|cublas" | cut -c1-200 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" tests.log bench.log probe_ml.log && rm -f "$L/tests.log" "$L/bench.log" "$L/probe_ml.log"
