#!/usr/bin/env bash
# Session 41's sixth device call (≤ 300 s): the transposed A8 kernel (trans: weights as the kernel's rows, scales from
# global memory, no proxy fence) — the W4A8 GPU tests (both orientations), then the A8 GEMM per depth / orientation
# at the FLUX shapes beside fp8 and the routed W4A4 GEMM.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s41f.sh → $OUT/s41f/
source "$(dirname "$0")/_device_prelude.sh" s41f
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
gpu_tests 240 4 tests/test_w4a8.py
probe_run depth 200 scripts/probe_a8_depth.py
