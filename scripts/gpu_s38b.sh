#!/usr/bin/env bash
# Session 38's second device call (≤ 300 s): the GPU suites of the re-applied residual accumulator (1d1b564: LoRA
# and multi-LoRA fp8 paths), then probe_decode_f16 again at M = 48 / 64 (does the fp16 layer's 10 % at M = 64
# repeat, and where between 32 and 64 does it start to pay?).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s38b.sh → $OUT/s38b/…
source "$(dirname "$0")/_device_prelude.sh" s38b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 150 14 tests/test_lora_fp8_weight.py tests/test_multilora_fp8.py
timeout 100 python3 scripts/probe_decode_f16.py --out "$L/f16" --cases 48x4096x28672,64x4096x28672 \
    > "$L/f16.log" 2>&1
say "probe_decode_f16 rc=$?"; grep -E "^ROW|FAIL|Error" "$L/f16.log" >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" $(cd "$L" && ls *.log) && (cd "$L" && rm -f *.log)
