#!/usr/bin/env bash
# Session 45, device call 5 (≤ 330 s): the decode smoke (its paths plus K = 3072's padded xab table and the W4A8
# layer at M ≤ 16), then compute-sanitizer racecheck / synccheck / memcheck on it.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s45c.sh → $OUT/s45c/
source "$(dirname "$0")/_device_prelude.sh" s45c
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 60 python3 -m lowrank_gemm.kernels.gluon.smoke --fmt decode > "$L/smoke.log" 2>&1
say "smoke rc=$?"; cat "$L/smoke.log" >> "$L/summary.txt"
SANITIZE_FMTS=decode SANITIZE_TIMEOUT=85 bash scripts/sanitize_gluon.sh "$L/sanitize"
say "sanitize rc=$?"; cat "$L/sanitize/sanitize_summary.txt" >> "$L/summary.txt"
tar czf "$L/sanitize_logs.tar.gz" -C "$L" sanitize && rm -rf "$L/sanitize"
