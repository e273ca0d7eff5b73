#!/usr/bin/env bash
# Session 40: where the M = 1 / 2 decode layer's time over its GEMM goes, per format (scripts/probe_aq_m1.py).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s40d.sh → $OUT/s40d/probe_aq_m1.{json,md}
source "$(dirname "$0")/_device_prelude.sh" s40d
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
probe_run probe_aq_m1 240 scripts/probe_aq_m1.py
