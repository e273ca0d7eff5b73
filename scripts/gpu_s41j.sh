#!/usr/bin/env bash
# Session 41's last device call (≤ 240 s): the W4A8 decode quantizer's PDL trigger (scripts/probe_a8_pdl.py) and the
# W4A8 GPU tests on the reviewed tree.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s41j.sh → $OUT/s41j/
source "$(dirname "$0")/_device_prelude.sh" s41j
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
gpu_tests 200 4 tests/test_w4a8.py
(cd scripts && probe_run pdl 150 probe_a8_pdl.py)
