#!/usr/bin/env bash
# Session 17, device call 3: LoRA plan families on the untuned Llama-3-8B shapes (scripts/probe_lora_unseen.py),
# winners merged into a copy of the tuned table in $OUT (merge by hand after reading the table).
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cp src/lowrank_gemm/plan/tuned/lora_h200.json "$OUT/lora_h200.json"
timeout 470 python3 scripts/probe_lora_unseen.py --out "$OUT/families" --budget-s 340 \
    --write-tuned "$OUT/lora_h200.json" > "$OUT/families.log" 2>&1; echo "probe rc=$?" >> "$OUT/families.log"
tar czf "$OUT/families.tar.gz" -C "$OUT" families && rm -rf "$OUT/families"
