#!/usr/bin/env bash
# Session 40: the W8A8 LoRA op split into quantizer and main kernel at 1–16 tokens, one and two x terms
# (scripts/probe_w8a8_parts.py: why the two-term op is ~5 µs slower at M = 1 than at M = 16).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s40e.sh → $OUT/s40e/probe_w8a8_parts.{json,md}
source "$(dirname "$0")/_device_prelude.sh" s40e
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
probe_run probe_w8a8_parts 200 scripts/probe_w8a8_parts.py
