#!/usr/bin/env bash
# Session 34, device call 5: the fp8-weight LoRA GPU tests at the narrow decode plan (FP8_WEIGHT_NARROW_MAX_M) and the
# two-term fp8 x (row_quant terms=2, X_TERMS=2), `probe_lora_fp8w --no-sweep` (baselines, auto, hi/lo unfused and
# fused), then `bench lora --fp8` on the issue shapes (cuBLAS bf16, auto, auto_fp8w, auto_w8a8, cuBLAS fp8).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s34_fp8plan.sh → $OUT/s34_fp8plan/…
source "$(dirname "$0")/_device_prelude.sh" s34_fp8plan
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 120 8 tests/test_lora_fp8_weight.py tests/test_row_quant.py
timeout 100 python3 scripts/probe_lora_fp8w.py --out "$L" --no-sweep \
    --cases 1x28672x4096,16x28672x4096,64x28672x4096,1x4096x4096,64x4096x4096,1024x28672x4096 > "$L/probe.log" 2>&1
say "fp8w probe rc=$?"
grep -E "^ROW" "$L/probe.log" | cut -c5-160 >> "$L/summary.txt"
timeout 150 python3 -m lowrank_gemm bench lora --fp8 --kn 4096x28672,4096x4096 --ranks 16 --ms 1,16,64,256,1024 \
    --only cublas_base,auto,auto_fp8w,auto_w8a8,fp8_scaled_mm --out "$L/results" > "$L/bench.log" 2>&1
say "bench rc=$?"
grep -E "auto_fp8w|auto_w8a8" "$L/bench.log" | head -20 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" tests.log probe.log bench.log && rm -f "$L/tests.log" "$L/probe.log" "$L/bench.log"
