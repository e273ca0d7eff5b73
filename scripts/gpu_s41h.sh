#!/usr/bin/env bash
# Session 41's eighth device call (≤ 300 s): the fixed one-launch decode quantizer and the trans default (K ≤ 4096)
# under the W4A8 GPU tests, then `bench w4a4` (FLUX + decode) with the W4A4 (auto) and W4A8 (a8) rows, one process.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s41h.sh → $OUT/s41h/
source "$(dirname "$0")/_device_prelude.sh" s41h
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
gpu_tests 240 4 tests/test_w4a8.py
timeout 240 python3 -m lowrank_gemm bench w4a4 --impls auto,a8 --out "$L/results" > "$L/bench.log" 2>&1
say "bench w4a4 rc=$?"
grep -E "a8|auto" "$L/bench.log" | grep layer | head -40 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" bench.log && rm -f "$L/bench.log"
