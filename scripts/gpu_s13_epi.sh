#!/usr/bin/env bash
# Session 13: the GEMV's epilogue operands before the K loop (LOWRANK_GEMM_GEMV_EPI_EARLY=1): bit-identity tests,
# then the layer A/B in one process per format (shipped vs epi_early), twice.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s13_epi.sh → $OUT/epi
source "$(dirname "$0")/_device_prelude.sh" epi
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 200 python3 -m pytest -m gpu -q -n 8 --timeout=150 -p no:cacheprovider -W ignore -rf tests/test_w4a4_gemv.py \
    -k "epilogue_early or gpu_layer" > "$L/gpu_tests.log" 2>&1
say "pytest rc=$?: $(tail -1 "$L/gpu_tests.log")"; grep -E "^FAILED|^ERROR" "$L/gpu_tests.log" | head | tee -a "$L/summary.txt"
for fmt in int4_g64 int4_2l; do
  for rep in 1 2; do
    timeout 200 python3 scripts/probe_gemv.py --layer --fmt $fmt --shapes 28672:4096,14336:4096,4096:4096 \
        --variants "shipped;epi_early" --out "$L/${fmt}_$rep" > "$L/${fmt}_$rep.log" 2>&1
    say "$fmt rep $rep rc=$?"; grep "^|" "$L/${fmt}_$rep.log" | grep -v cublas | tee -a "$L/summary.txt"
  done
done
