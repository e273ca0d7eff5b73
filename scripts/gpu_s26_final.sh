#!/usr/bin/env bash
# Session 26, final call: the decode-M variants once more without the refused 16-slot ring (64-wide tiles, one expander,
# 8 RAW slots), racecheck of the 16-slot ring at a small shape (refused by the launcher at babe6c3, whose guard this
# call's RAW_GUARD_OFF bypassed; the guard is gone since the odd-MAIN fix), then the GPU tests of the Gluon / W4A4 kernels and the canonical `bench w4a4` + `bench ab` (gpu_session.sh).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s26_final.sh → $OUT/{s26f/summary.txt,session.log,gpu_tests.log,results.tar.gz}
source "$(dirname "$0")/_device_prelude.sh" s26f
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 120 python3 scripts/probe_w4a4_w8.py --out "$L" --shapes dec64 --variants v2_raw8,v2_bn64,v2_ex1 > "$L/probe.log" 2>&1
say "probe rc=$?"; cat "$L/probe_w4a4_w8.md" >> "$L/summary.txt" 2>/dev/null
if [ "${RACECHECK:-1}" = 1 ]; then
  RAW_GUARD_OFF=1 timeout 150 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 10 \
      python3 scripts/_v2_stage_check.py "raw16=64,2048,4096,32,64,raw:16" > "$L/racecheck.log" 2>&1
  say "racecheck rc=$?"; grep -E "ERROR SUMMARY|Hazard|hazard|ok |MISMATCH" "$L/racecheck.log" | head -8 | tee -a "$L/summary.txt"
fi
cd "$(dirname "$0")/.." && bash scripts/gpu_session.sh --tests "${TESTS:-tests/test_gluon_gpu.py tests/test_w4a4_gpu.py}" \
    --suites "${SUITES:-w4a4 ab}"
