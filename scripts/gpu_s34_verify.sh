#!/usr/bin/env bash
# Session 34, device call 3: the decode / W4A4 / skinny GPU tests at the new defaults (xab table, row box, skinny mma
# epilogue), the fp8 row quantizer's and the fp8-weight LoRA's GPU tests, then the fp8-weight LoRA config probe
# (probe_lora_fp8w: is any widening config near the half-bytes prediction?).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s34_verify.sh → $OUT/s34_verify/…
source "$(dirname "$0")/_device_prelude.sh" s34_verify
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 200 14 tests/test_w4a4_decode.py tests/test_w4a4_gpu.py tests/test_w4a4_gemm.py \
    tests/test_w4a4_gemv.py tests/test_w4a4_skinny.py tests/test_row_quant.py tests/test_lora_fp8_weight.py
timeout 260 python3 scripts/probe_lora_fp8w.py --out "$L" --budget-s 220 > "$L/probe.log" 2>&1
say "fp8w probe rc=$?"
grep -E "^ROW|^PLAN" "$L/probe.log" | cut -c1-200 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" tests.log probe.log && rm -f "$L/tests.log" "$L/probe.log"
