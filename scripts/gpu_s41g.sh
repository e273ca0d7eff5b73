#!/usr/bin/env bash
# Session 41's seventh device call (≤ 300 s): the one-launch W4A8 decode quantizer (codes, t and S per (row, rank
# chunk) program) under the W4A8 GPU tests and `bench w4a4 --only decode`; the FLUX A8 GEMM in both orientations
# again (scripts/probe_a8_depth.py) for the trans default.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s41g.sh → $OUT/s41g/
source "$(dirname "$0")/_device_prelude.sh" s41g
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
gpu_tests 240 4 tests/test_w4a8.py
timeout 150 python3 -m lowrank_gemm bench w4a4 --only decode --impls auto,a8 --out "$L/results" > "$L/bench_decode.log" 2>&1
say "bench w4a4 --only decode rc=$?"
grep -E "a8|auto" "$L/bench_decode.log" | head -40 >> "$L/summary.txt"
probe_run depth 200 scripts/probe_a8_depth.py
tar czf "$L/logs.tar.gz" -C "$L" bench_decode.log && rm -f "$L/bench_decode.log"
