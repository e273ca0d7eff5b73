#!/usr/bin/env bash
# Session 40: compute-sanitizer (racecheck, synccheck, memcheck) on the W4A4 decode kernel's three default paths —
# e4m3 tokens with the shared-memory a/b table and the row box (sessions 32–34), fp16 tokens (sessions 38–39), int4_2l
# — last checked in session 3. The smoke first, plain.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s40g.sh → $OUT/s40g/…
source "$(dirname "$0")/_device_prelude.sh" s40g
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
timeout 90 python3 -m lowrank_gemm.kernels.gluon.smoke --fmt decode 2>&1 | tee -a "$L/summary.txt"
SANITIZE_FMTS=decode SANITIZE_TIMEOUT=110 bash scripts/sanitize_gluon.sh "$L/sanitize" > /dev/null 2>&1
say "sanitize rc=$?"
cat "$L/sanitize/sanitize_summary.txt" >> "$L/summary.txt"
tar czf "$L/sanitize_logs.tar.gz" -C "$L" sanitize && rm -rf "$L/sanitize"
