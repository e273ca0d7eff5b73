#!/usr/bin/env bash
# Session 35, device call 2: x in two e4m3 terms on ONE row scale into one accumulator (call 1 found the two-
# accumulator K loop 7–18× slower than one term at M ≥ 64: it spilled). The fp8 LoRA and row quantizer GPU tests, then
# `bench lora --fp8` as in call 1 plus M = 4096, as results/lora_fp8.* (the canonical fp8 table); then the new
# multi-LoRA fp8 base (its GPU tests above, scripts/probe_multilora_fp8.py beside cuBLAS bf16 / fp8).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s35_x2.sh → $OUT/s35_x2/…
source "$(dirname "$0")/_device_prelude.sh" s35_x2
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 200 8 tests/test_lora_fp8_weight.py tests/test_row_quant.py tests/test_multilora_fp8.py
timeout 200 python3 -m lowrank_gemm bench lora --fp8 --kn 4096x28672,4096x4096 --ranks 16 --ms 1,16,64,256,1024,4096 \
    --only cublas_base,auto,auto_fp8w,auto_w8a8,auto_w8a8x2,fp8_scaled_mm --name lora_fp8 --out "$L/results" > "$L/bench.log" 2>&1
say "bench rc=$?"
grep -E "auto_w8a8|fp8_scaled" "$L/bench.log" | head -40 >> "$L/summary.txt"
timeout 150 python3 scripts/probe_multilora_fp8.py --out "$L/results" > "$L/probe_ml.log" 2>&1
say "multilora fp8 probe rc=$?"
grep -E "^ROW|^SKIP" "$L/probe_ml.log" | cut -c1-200 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" tests.log bench.log probe_ml.log && rm -f "$L/tests.log" "$L/bench.log" "$L/probe_ml.log"
