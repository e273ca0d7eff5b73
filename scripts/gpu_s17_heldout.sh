#!/usr/bin/env bash
# Session 17, device call 5: the measured heuristic on shapes it was not derived from (Llama-3-70B gate/up and down,
# Qwen2.5-7B gate/up and down; no tuned entries), `auto` next to cuBLAS and torch's unfused branch in one process.
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 250 python3 -m lowrank_gemm bench lora --kn 3584x18944,18944x3584,8192x28672,28672x8192 \
    --only cublas_base,torch_unfused,auto --out "$OUT/heldout" > "$OUT/heldout.log" 2>&1; echo "heldout rc=$?" >> "$OUT/heldout.log"
tar czf "$OUT/heldout.tar.gz" -C "$OUT" heldout && rm -rf "$OUT/heldout"
