#!/usr/bin/env bash
# Session 28, call 7: single-field edits of the tuned plans on the issue-5 cells closest to 1.10× cuBLAS (N = 28672,
# M ≤ 64, 4–16 adapters), after the shrink's warp count paid on the M = 256 cell (calls 3–4).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s28_call7.sh → $OUT/s28c7/{summary.txt,probe/…}
E="w8:shrink.num_warps=8;w2:shrink.num_warps=2;k64:shrink.block_k=64;k256:shrink.block_k=256"
E="$E;sr:shrink_rows=true;srw8:shrink_rows=true,shrink.num_warps=8;st4:main.num_stages=4;st6:main.num_stages=6"
E="$E;gm4:main.group_m=4;as2:append_stages=2;as4:append_stages=4"
CASES=${CASES:-16x28672x16x4,16x28672x64x4,64x28672x64x4,64x28672x16x16,16x28672x16x16} EDITS=${EDITS:-$E} exec bash "$(dirname "$0")/gpu_plan_edits.sh" s28c7
