#!/usr/bin/env bash
# Session 25: in-flight loop bodies of 4 / 8 groups (w4a4_ws._f8_chain) and permuted fp32 w_scale rows (ws_perm)
# against today's pairs, GEMM alone at the
# FLUX shapes, same process (probe_w4a4_w8.py), then the GPU tests of the new variants.
#   bash scripts/gpu_s25_depth.sh → $OUT/depth/{summary.txt,probe_w4a4_w8.{json,md},gpu_tests.log}
source "$(dirname "$0")/_device_prelude.sh" depth
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout ${PROBE_TIMEOUT:-200} python3 scripts/probe_w4a4_w8.py --out "$L" --shapes ${SHAPES:-fc1,fc2,sq,fc1b} \
    --variants ${VARIANTS:-w8_coop_inflight2_ws32,w8_coop_inflight2_ws32_perm,w8_coop_inflight4_ws32,w8_coop_inflight4_ws32_perm} > "$L/probe.log" 2>&1
say "probe rc=$?"; cat "$L/probe_w4a4_w8.md" >> "$L/summary.txt" 2>/dev/null
rc=skipped
[ "${TEST_FILES:-}" = none ] || { timeout ${TEST_TIMEOUT:-200} python3 -m pytest -m gpu ${TEST_FILES:-tests/test_gluon_gpu.py} -q -n 8 --timeout=150 -p no:cacheprovider -rf \
    -k "${TESTS_K:-f8wci or bit_identically or agree}" > "$L/gpu_tests.log" 2>&1; rc=$?; }
say "pytest rc=$rc"; [ "$rc" = skipped ] || tail -8 "$L/gpu_tests.log" | tee -a "$L/summary.txt"
cat "$L/probe_w4a4_w8.md"
