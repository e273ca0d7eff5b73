#!/usr/bin/env bash
# Session 28, call 12: the two untuned cells the heuristic still loses to shrink + expand (M = 64, 64 adapters of r16,
# 4096→6144 and 4096→14336; the rows expand since c9a77ad) — single-field edits of that plan (narrower tiles, whose
# register budget allows 32-row chunks, split-K, the shrink by row, K slices).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s28_call12.sh → $OUT/s28c12/{summary.txt,probe/…}
E="bn64:main.block_n=64,rows_chunk=32;bn64s1:main.block_n=64,main.split_k=1,rows_chunk=32"
E="$E;bn64s4:main.block_n=64,main.split_k=4,rows_chunk=32;s4:main.split_k=4;s1:main.split_k=1"
E="$E;sr:shrink_rows=true,shrink.split_k=4,shrink.num_warps=8;bn64sr:main.block_n=64,rows_chunk=32,shrink_rows=true,shrink.split_k=4,shrink.num_warps=8"
E="$E;w8:shrink.num_warps=8;ss2:shrink.split_k=2;ss8:shrink.split_k=8;rc8:rows_chunk=8"
CASES=${CASES:-64x6144x16x64,64x14336x16x64} EDITS=${EDITS:-$E} exec bash "$(dirname "$0")/gpu_plan_edits.sh" s28c12
