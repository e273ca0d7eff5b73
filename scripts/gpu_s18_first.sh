#!/usr/bin/env bash
# Next session's first call (written in session 17, whose device time ran out after the held-out check):
#   the plan families on session 17's held-out shapes (Qwen2.5-7B 3584↔18944, Llama-3-70B 8192↔28672), including
#   128×256 with the partial last wave split in the launch (sp_128x256_ws*), to give `measured_tile` a wave-
#   efficiency input (3584→18944 M=256: 148 tiles = 1.12 waves read 1.55×). Winners go into a copy of the table.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s18_first.sh → $OUT/{families.log,families.tar.gz,lora_h200.json}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cp src/lowrank_gemm/plan/tuned/lora_h200.json "$OUT/lora_h200.json"
timeout 470 python3 scripts/probe_lora_unseen.py --out "$OUT/families" --budget-s 340 \
    --kn 3584x18944,18944x3584,8192x28672,28672x8192 --ms 256,16,1024,4096,64 \
    --write-tuned "$OUT/lora_h200.json" > "$OUT/families.log" 2>&1; echo "probe rc=$?" >> "$OUT/families.log"
tar czf "$OUT/families.tar.gz" -C "$OUT" families && rm -rf "$OUT/families"
