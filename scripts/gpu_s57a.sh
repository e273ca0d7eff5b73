#!/usr/bin/env bash
# Session 57 (≤ 590 s, any GPU) → $OUT/s57a/: the LoRA v2 GPU tests (ping-pong and COOP), then — only if they pass —
# the v2 tile probe (COOP 128×256 / 256×128 against cuBLAS, auto and v2's default, one process); then the whole GPU
# suite (8 workers) in the time left, so one machine start answers both.
#   LOWRANK_GEMM_COMMIT=<hash> [V2_CELLS=MxNxKxR,…] [TOTAL=<s, default 580>] bash scripts/gpu_s57a.sh
source "$(dirname "$0")/_device_prelude.sh" s57a
t0=$SECONDS
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 170 4 tests/test_gluon_lora_gpu.py
v2ok=$(grep -c "^tests rc=0" "$L/summary.txt")
mv "$L/tests.log" "$L/v2_tests.log"
[ "$v2ok" = 1 ] && probe_run v2tiles 200 scripts/probe_lora_v2_tiles.py ${V2_CELLS:+--cells "$V2_CELLS"}
left=$((${TOTAL:-580} - (SECONDS - t0)))
say "whole suite with ${left} s left"
[ $left -gt 60 ] && gpu_tests $left 8 tests
gzip -f "$L"/*.log
exit 0
