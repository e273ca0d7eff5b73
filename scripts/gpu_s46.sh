#!/usr/bin/env bash
# Session 46, device call 1 (≤ 420 s). What runs depends on the card that comes:
# - an H200: the canonical `bench w4a4` (FLUX + decode) and `bench w4a4 --only decode` → $OUT/s46/h200/ (they predate
#   the A8 trans rule and the W4A8 e4m3 decode route);
# - an H100: the multi-LoRA cell it loses to shrink + expand (N = 4096, r16, M = 256, 64 adapters) over plan candidates
#   (`probe_multilora_parts.py`, winners → an H100 table on the CPU), then `bench lora`'s two 8192² r64 cells
#   session 45's 110 s cut (M = 1024 / 4096).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s46.sh → $OUT/s46/
source "$(dirname "$0")/_device_prelude.sh" s46
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
if [[ $gpu == *H200* ]]; then
    timeout 220 python3 -m lowrank_gemm bench w4a4 --out "$L/h200" > "$L/w4a4.log" 2>&1
    say "bench w4a4 rc=$?"
    timeout 100 python3 -m lowrank_gemm bench w4a4 --only decode --out "$L/h200" > "$L/w4a4_decode.log" 2>&1
    say "bench w4a4 --only decode rc=$?"
    gzip -f "$L"/w4a4*.log
else
    timeout 170 python3 scripts/probe_multilora_parts.py --out "$L/ml" --cases 256x4096x16x64 --configs \
        --shrink-rows 4,8 --mains 64x128x128x4x1 \
        > "$L/ml.log" 2>&1
    say "probe_multilora_parts rc=$?"
    grep -E "µs" "$L/ml.log" | head -60 >> "$L/summary.txt"
    timeout 130 python3 -m lowrank_gemm bench lora --kn 8192x8192 --ranks 64 --ms 1024,4096 \
        --only cublas_base,torch_unfused,auto --name lora_8192r64 --out "$L/lora" > "$L/lora.log" 2>&1
    say "bench lora (2 cells) rc=$?"
    gzip -f "$L"/ml.log "$L"/lora.log
fi
