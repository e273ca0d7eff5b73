#!/usr/bin/env bash
# Session 46, device call 7 (≤ 300 s), on an H200 only (an H100 exits at once): the canonical `bench w4a4` (FLUX +
# decode) and `bench w4a4 --only decode` → $OUT/s46g/h200/ (they predate the A8 trans rule and the W4A8 e4m3 decode
# route).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s46g.sh → $OUT/s46g/
source "$(dirname "$0")/_device_prelude.sh" s46g
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
[[ $gpu == *H200* ]] || { say "not an H200: nothing run"; exit 0; }
timeout 180 python3 -m lowrank_gemm bench w4a4 --out "$L/h200" > "$L/w4a4.log" 2>&1
say "bench w4a4 rc=$?"
timeout 90 python3 -m lowrank_gemm bench w4a4 --only decode --out "$L/h200" > "$L/w4a4_decode.log" 2>&1
say "bench w4a4 --only decode rc=$?"
gzip -f "$L"/w4a4*.log
