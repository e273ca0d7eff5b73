#!/usr/bin/env bash
# For a later call (written in session 17): the multi-LoRA planner on shapes its table was never tuned on (PEFT /
# vLLM projections of Llama-3-8B), as session 17 did for the single adapter (its heuristic then read up to 4.2×):
# `bench multilora --kn` with cuBLAS, shrink + expand and the fused gather kernel in one process.
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 300 python3 -m lowrank_gemm bench multilora --kn 4096x6144,14336x4096,4096x14336 \
    --only cublas_base,shrink_expand,fused --out "$OUT/ml_unseen" > "$OUT/ml_unseen.log" 2>&1
echo "rc=$?" >> "$OUT/ml_unseen.log"
tar czf "$OUT/ml_unseen.tar.gz" -C "$OUT" ml_unseen && rm -rf "$OUT/ml_unseen"
