#!/usr/bin/env bash
# Session 34, device call 6: fp8_activations=2 (x in two e4m3 terms) through the op — the fp8-weight LoRA and row
# quantizer GPU tests, then `bench lora --fp8` with the auto_w8a8x2 row beside cuBLAS bf16 / fp8 and the other fp8 rows.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s34_x2.sh → $OUT/s34_x2/…
source "$(dirname "$0")/_device_prelude.sh" s34_x2
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 100 8 tests/test_lora_fp8_weight.py tests/test_row_quant.py
timeout 120 python3 -m lowrank_gemm bench lora --fp8 --kn 4096x28672,4096x4096 --ranks 16 --ms 1,16,64,256,1024 \
    --only cublas_base,auto,auto_fp8w,auto_w8a8,auto_w8a8x2,fp8_scaled_mm --out "$L/results" > "$L/bench.log" 2>&1
say "bench rc=$?"
grep -E "auto_fp8w|auto_w8a8|cublas_base|fp8_scaled" "$L/bench.log" | head -40 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" tests.log bench.log && rm -f "$L/tests.log" "$L/bench.log"
