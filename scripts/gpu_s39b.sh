#!/usr/bin/env bash
# Session 39's second device call (≤ 560 s): act_quant(out="f16") — the fused quantizer writing the decode kernel's
# fp16 token operand (never GPU-run) — most important first:
#   1. GPU suites: act_quant (the fused kernel gained the F16 unit), the fp16 decode path incl. act_quant(out="f16"),
#      the W4A4 layer / GEMM / decode suites through the new layer default;
#   2. scripts/probe_act_quant_f16.py (act_quant alone, both S modes; layer with the switch 0 / 1; M 16–64);
#   3. `bench w4a4 --only decode` (the decode table at the new layer default; this morning's run is the before).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s39b.sh → $OUT/s39b/…
source "$(dirname "$0")/_device_prelude.sh" s39b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 230 14 tests/test_w4a4_decode_f16.py tests/test_act_quant.py tests/test_w4a4_gpu.py tests/test_w4a4_gemm.py \
    tests/test_w4a4_decode.py
timeout 150 python3 scripts/probe_act_quant_f16.py --out "$L" > "$L/probe.log" 2>&1
say "probe_act_quant_f16 rc=$?"
grep -E "^ROW|FAIL" "$L/probe.log" | sed 's/^ROW //' >> "$L/summary.txt"
timeout 140 python3 -m lowrank_gemm bench w4a4 --only decode --out "$L/results" > "$L/bench_decode.log" 2>&1
say "bench w4a4 --only decode rc=$?"
grep -E "layer" "$L/bench_decode.log" | head -40 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" tests.log probe.log bench_decode.log \
    && rm -f "$L/tests.log" "$L/probe.log" "$L/bench_decode.log"
