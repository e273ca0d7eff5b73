#!/usr/bin/env bash
# Session 28, call 1: the four-consumer W4A4 kernel (gluon/w4a4_quad.py, opt-in) — its GPU tests (the int4_g64_quad
# cases of tests/test_gluon_gpu.py, under the watchdog), then the GEMM alone at the FLUX shapes beside the routed
# coop in-flight kernel (v2_default), fp8 _scaled_mm and bf16 cuBLAS in one process (probe_w4a4_w8.py).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s28_call1.sh → $OUT/s28c1/{summary.txt,tests.log,probe_w4a4_w8.*}
source "$(dirname "$0")/_device_prelude.sh" s28c1
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -m gpu tests/test_gluon_gpu.py -k "${TESTS_K:-quad}" -n 4 \
    -p no:cacheprovider -rf > "$L/tests.log" 2>&1
say "tests rc=$? $(tail -1 "$L/tests.log")"
grep -E "^FAILED|Timeout" "$L/tests.log" | head -8 | tee -a "$L/summary.txt"
timeout ${PROBE_TIMEOUT:-240} python3 scripts/probe_w4a4_w8.py --out "$L" --shapes ${SHAPES:-fc1,fc2,sq,fc1b} \
    --variants ${VARIANTS:-w8_quad} > "$L/probe.log" 2>&1
say "probe rc=$?"
grep -E "Error|error" "$L/probe.log" | head -5 | tee -a "$L/summary.txt"
cat "$L/probe_w4a4_w8.md" >> "$L/summary.txt" 2>/dev/null
cat "$L/summary.txt"
