#!/usr/bin/env bash
# Session 28, call 4: the shrink by row's launch shape (warps, K step, K slices) on the two issue-5 cells that route it
# (M = 256, N = 4096, 64 adapters of r16 / r64), after call 3 found 8 warps 1 µs faster on the r16 cell.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s28_call4.sh → $OUT/s28c4/{summary.txt,probe/…}
E="w8:shrink.num_warps=8;w8k256:shrink.num_warps=8,shrink.block_k=256;w8k512:shrink.num_warps=8,shrink.block_k=512"
E="$E;w8k1024:shrink.num_warps=8,shrink.block_k=1024;w16k512:shrink.num_warps=16,shrink.block_k=512"
E="$E;w8s2:shrink.num_warps=8,shrink.split_k=2;w8k256s2:shrink.num_warps=8,shrink.block_k=256,shrink.split_k=2"
E="$E;w8s8:shrink.num_warps=8,shrink.split_k=8;w8k256s8:shrink.num_warps=8,shrink.block_k=256,shrink.split_k=8"
E="$E;w4k256:shrink.block_k=256;w4k512:shrink.block_k=512;w16:shrink.num_warps=16"
E="$E;w8rowsel:shrink.num_warps=8,append_rowsel=true;w8gm4:shrink.num_warps=8,main.group_m=4"
CASES=${CASES:-256x4096x16x64,256x4096x64x64} EDITS=${EDITS:-$E} exec bash "$(dirname "$0")/gpu_plan_edits.sh" s28c4
