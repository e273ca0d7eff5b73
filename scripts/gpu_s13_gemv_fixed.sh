#!/usr/bin/env bash
# Session 13: the GEMV alone across N (shipped config and hints), for its fixed cost next to the layer's
# (probes/s13/waves) — the decode lead's decomposition.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s13_gemv_fixed.sh → $OUT/gemv_fixed
source "$(dirname "$0")/_device_prelude.sh" gemv_fixed
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
S=4096:4096,14336:4096,26400:4096,27456:4096,28672:4096,29568:4096
for rep in 1 2; do
  timeout 200 python3 scripts/probe_gemv.py --cfgs "g:16,64,2,1+ef" --ms 1 --shapes $S --out "$L/r$rep" \
      > "$L/r$rep.log" 2>&1
  say "rep $rep rc=$?"; grep "^|" "$L/r$rep.log" | tee -a "$L/summary.txt"
done
