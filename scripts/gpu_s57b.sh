#!/usr/bin/env bash
# Session 57's second call (≤ 150 s, any GPU) → $OUT/s57b/: where v2 COOP loses — the v2 tile probe with --parts (the
# pre shrink alone; each tile's kernel with S computed beforehand) at 4096³ r16 and 256×28672 r16.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s57b.sh
source "$(dirname "$0")/_device_prelude.sh" s57b
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
probe_run v2parts 140 scripts/probe_lora_v2_tiles.py --parts --cells 4096x4096x4096x16,256x28672x4096x16
exit 0
