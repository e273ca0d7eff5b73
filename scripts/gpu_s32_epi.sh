#!/usr/bin/env bash
# Session 32, device call 2: the decode kernel's low-rank term as one wgmma — its GPU tests and the W4A4 / decode
# suites, then the A/B probe (GEMM alone and the layer, epilogue loop vs wgmma, same process).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s32_epi.sh → $OUT/s32_epi/…
source "$(dirname "$0")/_device_prelude.sh" s32_epi
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
timeout 200 python3 -m pytest -m gpu tests/test_w4a4_decode.py tests/test_w4a4_gpu.py tests/test_w4a4_gemm.py \
    -q -n 14 --timeout=150 -p no:cacheprovider -rf > "$L/tests.log" 2>&1
say "tests rc=$? $(tail -1 "$L/tests.log")"
grep -E "^FAILED|^ERROR" "$L/tests.log" | head -20 | tee -a "$L/summary.txt"
timeout 300 python3 scripts/probe_decode_epi.py --out "$L" > "$L/probe.log" 2>&1
say "probe rc=$?"
grep "^ROW" "$L/probe.log" | cut -c5- | tee -a "$L/summary.txt"
tail -5 "$L/probe.log" | tee -a "$L/summary.txt"
