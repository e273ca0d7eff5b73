#!/usr/bin/env bash
# Session 40's PDL-chain call (≤ 250 s): act_quant(packed) → the GEMM op, whose token-operand kernel sits mid-chain,
# per w4_expand.OPERAND_PDL_TRIGGER ("default" = the committed per-operand choice, then early / after_wait / off for
# both) and with PDL off, at 8–48 tokens; then the W4A4 decode, expansion, GEMM, layer and act_quant GPU suites.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s40b.sh → $OUT/s40b/…
source "$(dirname "$0")/_device_prelude.sh" s40b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
timeout 150 python3 scripts/probe_act_quant_f16.py --chain --out "$L" \
    --cases 8x4096x28672,16x4096x28672,17x4096x28672,24x4096x28672,32x4096x28672,48x4096x28672 \
    > "$L/probe.log" 2>&1
say "probe_act_quant_f16 --chain rc=$?"
grep -E "^ROW|FAIL" "$L/probe.log" | sed 's/^ROW //' >> "$L/summary.txt"
gpu_tests 150 14 tests/test_w4a4_decode_f16.py tests/test_w4a4_decode.py tests/test_w4_expand.py tests/test_w4a4_gemm.py tests/test_w4a4_gpu.py tests/test_act_quant.py
tar czf "$L/logs.tar.gz" -C "$L" tests.log probe.log && rm -f "$L/tests.log" "$L/probe.log"
