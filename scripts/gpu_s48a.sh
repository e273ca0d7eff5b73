#!/usr/bin/env bash
# Session 48, device call 1 (≤ 420 s), any GPU: plan `b_l2` (each tile's adapters' B rows prefetched to L2 before the
# K loop; reverted after this call, 09a04ad holds it) — its GPU test and the multi-LoRA PDL tests, then
# `probe_multilora_parts.py --edits` on the issue-5 cells of the 1.10× target that miss: the tuned plan with b_l2, the
# one-MMA stacked epilogue (epi_d 16) with and without it.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s48a.sh → $OUT/s48a/
source "$(dirname "$0")/_device_prelude.sh" s48a
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 150 8 tests/test_multilora_gpu.py -k "b_l2 or pdl_and_s_unroll or appended_expand"
gzip -f "$L/tests.log"
ml_probe 260 "--edits b_l2" \
    --cases 64x4096x16x16,64x4096x64x16,64x4096x64x4,64x4096x16x4,16x4096x16x16,16x4096x64x16,16x4096x64x4,64x28672x16x16,16x28672x16x16,64x28672x64x16,16x28672x64x16,64x4096x64x1 \
    --edits "l2:b_l2=true;e16:expand=epilogue,epi_d=16,b_vec=true;l2e16:expand=epilogue,epi_d=16,b_vec=true,b_l2=true"
