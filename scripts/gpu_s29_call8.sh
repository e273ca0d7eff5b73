#!/usr/bin/env bash
# Session 29, device call 8: the S_PRODUCERS launch's one-atomic arrival (_s_arrive) — the LoRA and multi-LoRA GPU
# tests, then the 4096² / 8192² decode points on 64-row swap tiles ± producers, paired against cuBLAS (the same
# probe as call 6, which measured the two-atomic protocol).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s29_call8.sh → $OUT/s29_call8/{summary.txt,lora.log,multilora.log,wide/}
source "$(dirname "$0")/_device_prelude.sh" s29_call8
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 150 python3 scripts/probe_lora_narrow_swap.py --wide --out "$L/wide" \
    --points 1:4096:4096:8,1:4096:4096:16,1:4096:4096:64,16:4096:4096:8,16:4096:4096:16,16:4096:4096:64,1:8192:8192:16,16:8192:8192:16 \
    > "$L/wide.log" 2>&1
say "wide rc=$?"
timeout 170 python3 -m pytest -q -m gpu tests/test_lora_gemm_gpu.py -n 8 -p no:cacheprovider -rf > "$L/lora.log" 2>&1
say "lora tests rc=$? $(tail -1 "$L/lora.log")"
timeout 170 python3 -m pytest -q -m gpu tests/test_multilora_gpu.py -n 8 -p no:cacheprovider -rf > "$L/multilora.log" 2>&1
say "multilora tests rc=$? $(tail -1 "$L/multilora.log")"
grep -hE "^FAILED|Timeout" "$L/lora.log" "$L/multilora.log" | head -10 | tee -a "$L/summary.txt"
cat "$L/summary.txt"
