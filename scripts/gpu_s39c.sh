#!/usr/bin/env bash
# Session 39's third device call (≤ 330 s): the fp16 decode route from 17 tokens (F16_MIN_M 33 → 17), most important
# first:
#   1. GPU suites: the fp16 decode path + act_quant(out="f16"), the W4A4 layer / GEMM suites through the new range;
#   2. scripts/probe_act_quant_f16.py at M = 16 / 17 / 24 / 32 (layer: new default vs LOWRANK_GEMM_DECODE_F16=0);
#   3. `bench lora --fp8` on the canonical lora_fp8 grid (4096 × 28672 / 4096, r = 16; the fp8 rows + cuBLAS).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s39c.sh → $OUT/s39c/…
source "$(dirname "$0")/_device_prelude.sh" s39c
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 150 14 tests/test_w4a4_decode_f16.py tests/test_w4a4_gpu.py tests/test_w4a4_gemm.py
timeout 90 python3 scripts/probe_act_quant_f16.py --out "$L" \
    --cases 16x4096x28672,17x4096x28672,24x4096x28672,32x4096x28672 > "$L/probe.log" 2>&1
say "probe_act_quant_f16 rc=$?"
grep -E "^ROW|FAIL" "$L/probe.log" | sed 's/^ROW //' >> "$L/summary.txt"
timeout 150 python3 -m lowrank_gemm bench lora --fp8 --name lora_fp8 --kn 4096x28672,4096x4096 --ranks 16 \
    --only cublas_base,auto,auto_fp8w,auto_w8a8,auto_w8a8x2,fp8_scaled_mm --out "$L/results" > "$L/bench_lora.log" 2>&1
say "bench lora --fp8 rc=$?"
tar czf "$L/logs.tar.gz" -C "$L" tests.log probe.log bench_lora.log \
    && rm -f "$L/tests.log" "$L/probe.log" "$L/bench_lora.log"
