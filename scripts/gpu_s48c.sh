#!/usr/bin/env bash
# Session 48, device call 3 (≤ 420 s), any GPU: plan `append_park` (S parked once per program, each appended step's
# A operand a masked pipelined load of it; reverted after this call, ae402ab holds it) — its GPU test and the
# appended / PDL tests, then `probe_multilora_parts.py --edits` on the issue-5 cells of the 1.10× target that miss and
# four more appended cells: the tuned plan with append_park at 3 (its ring) and 4 stages.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s48c.sh → $OUT/s48c/
source "$(dirname "$0")/_device_prelude.sh" s48c
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 150 8 tests/test_multilora_gpu.py -k "park or pdl_and_s_unroll or appended_expand"
gzip -f "$L/tests.log"
ml_probe 250 "--edits append_park" \
    --cases 64x4096x16x16,64x4096x64x16,64x4096x64x4,64x4096x16x4,16x4096x16x16,16x4096x64x16,16x4096x64x4,64x28672x16x16,16x28672x16x16,64x28672x64x16,16x28672x64x16,256x4096x16x16,256x4096x64x16,64x4096x64x64,64x28672x16x64 \
    --edits "park:append_park=true;park4:append_park=true,append_stages=4"
