#!/usr/bin/env bash
# Session 13: every GPU test (all kernels now launch through kernels/launch.py), then the host-time probes.
#   LOWRANK_GEMM_COMMIT=<hash> [TESTS="..."] [TEST_LIMIT=420] bash scripts/gpu_s13_verify.sh → $OUT/verify
source "$(dirname "$0")/_device_prelude.sh" verify
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout ${TEST_LIMIT:-420} python3 -m pytest -m gpu -q -n 8 --timeout=200 -p no:cacheprovider -W ignore -rf ${TESTS:-tests} \
    > "$L/gpu_tests.log" 2>&1
say "pytest rc=$?: $(tail -1 "$L/gpu_tests.log")"; grep -E "^FAILED|^ERROR" "$L/gpu_tests.log" | head -20 | tee -a "$L/summary.txt"
timeout 120 python3 scripts/probe_host_parts.py --out "$L" > "$L/parts.log" 2>&1; say "parts rc=$?"
cat "$L/probe_host_parts.txt" >> "$L/summary.txt" 2>/dev/null
timeout 120 python3 scripts/probe_host.py --out "$L" > "$L/host.log" 2>&1; say "host rc=$?"
grep "per call" "$L/probe_host.txt" | tee -a "$L/summary.txt"
