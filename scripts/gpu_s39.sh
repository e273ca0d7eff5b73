#!/usr/bin/env bash
# Session 39's device call (≤ 560 s), most important first:
#   1. the W4A4 layer / GEMM / decode GPU suites through the fp16 decode default (int4_g64, 33–64 tokens; never GPU-run
#      as the default);
#   2. `bench w4a4 --only decode`, the canonical decode table at that default;
#   3. `bench lora --fp8 --name lora_fp8` (fp8 base weight + bf16 adapter, after the residual accumulator 6b71960).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s39.sh → $OUT/s39/…
source "$(dirname "$0")/_device_prelude.sh" s39
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 180 14 tests/test_w4a4_decode_f16.py tests/test_w4a4_gpu.py tests/test_w4a4_gemm.py tests/test_w4a4_decode.py
timeout 140 python3 -m lowrank_gemm bench w4a4 --only decode --out "$L/results" > "$L/bench_decode.log" 2>&1
say "bench w4a4 --only decode rc=$?"
grep -E "layer" "$L/bench_decode.log" | head -40 >> "$L/summary.txt"
timeout 200 python3 -m lowrank_gemm bench lora --fp8 --name lora_fp8 --out "$L/results" > "$L/bench_lora_fp8.log" 2>&1
say "bench lora --fp8 rc=$?"
tar czf "$L/logs.tar.gz" -C "$L" tests.log bench_decode.log bench_lora_fp8.log \
    && rm -f "$L/tests.log" "$L/bench_decode.log" "$L/bench_lora_fp8.log"
