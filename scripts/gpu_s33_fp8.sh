#!/usr/bin/env bash
# Session 33's unrun GPU work, one device call (~6 min): the fp8-base-weight LoRA path's GPU tests (every
# weight-scale strategy at real sizes, bit-identical repeats, CUDA graphs), the one-launch fp8 row quantizer's tests
# and probe (session 34) and the Nunchaku import's GPU case, then `bench lora --fp8` on two issue shapes (cuBLAS bf16, torch unfused, auto, auto_fp8w, auto_w8a8 and
# cuBLAS's fp8 GEMM in one process).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s33_fp8.sh → $OUT/s33_fp8/…
source "$(dirname "$0")/_device_prelude.sh" s33_fp8
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 240 8 tests/test_lora_fp8_weight.py tests/test_row_quant.py tests/test_nunchaku.py
timeout 90 python3 scripts/probe_row_quant.py --out "$L" > "$L/probe.log" 2>&1
say "row_quant probe rc=$?"
grep "^ROW" "$L/probe.log" | cut -c5- >> "$L/summary.txt"
timeout 300 python3 -m lowrank_gemm bench lora --fp8 --kn 4096x28672,4096x4096 --ranks 16 --ms 1,16,64,256,1024 \
    --only cublas_base,torch_unfused,auto,auto_fp8w,auto_w8a8,fp8_scaled_mm --out "$L/results" > "$L/bench.log" 2>&1
say "bench rc=$?"
grep -E "auto_fp8w|auto_w8a8|fp8_scaled_mm|cublas_base" "$L/bench.log" | head -40 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" tests.log probe.log bench.log && rm -f "$L/tests.log" "$L/probe.log" "$L/bench.log"
