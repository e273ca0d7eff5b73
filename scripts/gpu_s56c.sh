#!/usr/bin/env bash
# Session 56 (≤ 480 s, any GPU) → $OUT/s56c/: the LoRA v2 GPU tests (ping-pong and the new COOP schedule: both
# consumers on one tile), then — only if they pass — the v2 tile probe (probe_lora_v2_tiles.py: COOP 128×256 and
# 256×128 against cuBLAS, auto and v2's default, in one process).
#   LOWRANK_GEMM_COMMIT=<hash> [V2_CELLS=MxNxKxR,…] bash scripts/gpu_s56c.sh
source "$(dirname "$0")/_device_prelude.sh" s56c
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
timeout 200 python3 -m pytest -m gpu tests/test_gluon_lora_gpu.py -q -n 4 --timeout=60 -p no:cacheprovider -rf \
    > "$L/tests.log" 2>&1
rc=$?
say "tests rc=$rc $(tail -1 "$L/tests.log")"
grep -E "^FAILED|^ERROR" "$L/tests.log" | head -20 | tee -a "$L/summary.txt"
[ $rc = 0 ] && probe_run v2tiles 260 scripts/probe_lora_v2_tiles.py ${V2_CELLS:+--cells "$V2_CELLS"}
exit 0
