#!/usr/bin/env bash
# Session 40: int4_2l act_quant's fast row maximum (LOWRANK_GEMM_ACT_QUANT_2L_FAST_MAX) — its GPU tests first (same
# bits as the exact walk and the torch quantizer, ties and one-ulp-apart maxima), then act_quant alone and the layer
# with it off / on at 1–64 tokens (scripts/probe_aq_m1.py --knob).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s40f.sh → $OUT/s40f/…
source "$(dirname "$0")/_device_prelude.sh" s40f
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 120 8 tests/test_act_quant.py
timeout 200 python3 scripts/probe_aq_m1.py --out "$L" --fmts int4_2l --ms 1,2,16,64 --widths "" \
    --knob LOWRANK_GEMM_ACT_QUANT_2L_FAST_MAX > "$L/probe.log" 2>&1
say "probe_aq_m1 --knob rc=$?"
grep -E "^ROW|FAIL|SKIP|Error" "$L/probe.log" | sed 's/^ROW //' >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" tests.log probe.log && rm -f "$L/tests.log" "$L/probe.log"
