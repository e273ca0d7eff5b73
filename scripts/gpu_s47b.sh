#!/usr/bin/env bash
# Session 47, device call 3 (≤ 300 s), any GPU: split-K on the decode-M multi-LoRA plans (the N = 4096 cells run 32
# tiles of 64×128 on 132 SMs, split 1) — `probe_multilora_parts.py --edits` with main.split_k 2 / 4 on the issue-5
# cells of the 1.10× target that miss; winners are pinned on the CPU.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s47b.sh → $OUT/s47b/
source "$(dirname "$0")/_device_prelude.sh" s47b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
ml_probe 280 "--edits split" \
    --cases 64x4096x16x16,64x4096x64x16,64x4096x64x4,64x4096x16x4,16x4096x16x16,16x4096x64x16,16x4096x64x4,64x28672x16x16,16x28672x16x16,64x28672x64x4,16x28672x64x4,64x4096x64x1 \
    --edits "sk2:main.split_k=2;sk4:main.split_k=4;sk2n64:main.split_k=2,main.block_n=64;sk4k64:main.split_k=4,main.block_k=64,main.num_stages=6"
