#!/usr/bin/env bash
# Session 58's last build, for the next device call (≤ 300 s, any GPU) → $OUT/s58j/: the two-block-wide GEMM's GPU
# tests, then scripts/probe_wide_tiles.py (cuBLAS, our 128×256 / 128×128 at rank 0, gemm_n2 tiles; one process).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s58j.sh
source "$(dirname "$0")/_device_prelude.sh" s58j
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 150 4 tests/test_gemm_n2.py
probe_run wide 140 scripts/probe_wide_tiles.py
grep -E "^M=" <(zcat "$L/wide.log.gz") | tee -a "$L/summary.txt"
gzip -f "$L"/*.log
exit 0
