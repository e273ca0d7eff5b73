#!/usr/bin/env bash
# Session 52, device call 1 (≤ 420 s), any GPU → $OUT/s52a/:
# 1. Y by TMA (Y_TMA, two column halves): the bare flattened GEMM at 3 / 4 stages with and without it, op `flat` at
#    3 stages with and without it, against op `flat` as planned and cuBLAS;
# 2. the 256-token cells (and 1024×28672 r16): op `flat` (never timed there since S_STAGES), the bare GEMM and the
#    branch's epilogue alone, the tuned persistent entry with and without Y by TMA, and stream-K (1.7 waves of tiles
#    as 1.7 tiles of K steps per program; never timed at prefill M);
# 3. flat_plan's narrow-layer rule on the untimed shapes (session 51's s51e).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s52a.sh
source "$(dirname "$0")/_device_prelude.sh" s52a
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
probe_run probe_lora_flat_ys 140 scripts/probe_lora_flat.py --variants flat4_bare,flat4_bare_ys,flat3_bare,flat3_bare_ys \
    --no-auto --y-tma --cells 4096x4096x4096x16,4096x4096x4096x64,4096x28672x4096x64,1024x4096x4096x64
probe_run probe_lora_flat_256 140 scripts/probe_lora_flat.py --variants flat4_bare,flat4_pre --no-auto --tuned-row \
    --y-tma --strategies streamk --cells 256x28672x4096x16,256x28672x4096x64,256x8192x8192x64,1024x28672x4096x16,4096x28672x4096x16
probe_run probe_lora_flat 70 scripts/probe_lora_flat.py --variants "" --no-auto --tuned-row \
    --cells 2048x4096x4096x16,2048x4096x4096x64,8192x4096x4096x16,4096x4096x14336x64,1024x4096x14336x16
# 4. op `flat` at M = 64 (one S block on one spare program; never timed at decode-ish M): the planner's 64×64 tile and
#    64×32 / 64×64 pinned, against the tuned kloop / persistent entry
probe_run probe_lora_flat_64 60 scripts/probe_lora_flat.py --variants "" --no-auto --tuned-row \
    --op-tiles 64x32x256x4x4,64x64x128x4x4 --cells 64x4096x4096x16,64x4096x4096x64,64x8192x8192x64
