#!/usr/bin/env bash
# Session 28, call 3: the one issue-5 cell that ties shrink + expand (M = 256, N = 4096, 64 adapters of r16) —
# its tuned plan with single fields changed (probe_multilora_parts.py --edits), shrink + expand beside it.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s28_call3.sh → $OUT/s28c3/{summary.txt,probe/…}
E="w8:shrink.num_warps=8;w2:shrink.num_warps=2;k64:shrink.block_k=64;k256:shrink.block_k=256;sk4:main.split_k=4"
E="$E;sk1:main.split_k=1;ad2:append_d=2;ad1:append_d=1;as2:append_stages=2;as4:append_stages=4"
E="$E;st4:main.num_stages=4;bn64:main.block_n=64;bn64sk1:main.block_n=64,main.split_k=1;mw4:main.num_warps=4"
E="$E;rowsel:append_rowsel=true;gm4:main.group_m=4"
CASES=${CASES:-256x4096x16x64} EDITS=${EDITS:-$E} exec bash "$(dirname "$0")/gpu_plan_edits.sh" s28c3
