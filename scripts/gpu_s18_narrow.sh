#!/usr/bin/env bash
# Session 18, device call 5: narrow projections (k/v, N=1024: Llama-3-8B 4096→1024, Llama-3-70B 8192→1024), where
# `auto` reads 1.6–2.3× cuBLAS at M 256–1024 (three launches against cuBLAS's 5–15 µs): the plan families plus
# one-launch kloop / in-launch split-K on narrower tiles and kcat (scripts/probe_lora_unseen.py).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s18_narrow.sh → $OUT/{narrow.log,narrow.tar.gz,lora_h200.json}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cp src/lowrank_gemm/plan/tuned/lora_h200.json "$OUT/lora_h200.json"
timeout 230 python3 scripts/probe_lora_unseen.py --out "$OUT/narrow" --budget-s 170 \
    --kn 4096x1024,8192x1024 --ms 256,1024,64,4096 --write-tuned "$OUT/lora_h200.json" > "$OUT/narrow.log" 2>&1
echo "probe rc=$?" >> "$OUT/narrow.log"
tar czf "$OUT/narrow.tar.gz" -C "$OUT" narrow && rm -rf "$OUT/narrow"
