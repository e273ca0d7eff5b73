#!/usr/bin/env bash
# Session 18, device call 2: what rank 64 costs `split` on untuned shapes (the down kernel's 16-rank blocks) and
# two fixes (scripts/probe_lora_down.py), then the multi-LoRA planner on untuned Llama-3-8B projections
# (`bench multilora --kn`, cuBLAS / shrink + expand / fused in one process).
#   bash scripts/gpu_s18_down.sh → $OUT/{down.log,down.tar.gz,ml_unseen.log,ml_unseen.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 260 python3 scripts/probe_lora_down.py --out "$OUT/down" --budget-s 200 > "$OUT/down.log" 2>&1
echo "probe rc=$?" >> "$OUT/down.log"
tar czf "$OUT/down.tar.gz" -C "$OUT" down && rm -rf "$OUT/down"
timeout 250 python3 -m lowrank_gemm bench multilora --kn 4096x6144,14336x4096,4096x14336 \
    --only cublas_base,shrink_expand,fused --out "$OUT/ml_unseen" > "$OUT/ml_unseen.log" 2>&1
echo "rc=$?" >> "$OUT/ml_unseen.log"
tar czf "$OUT/ml_unseen.tar.gz" -C "$OUT" ml_unseen && rm -rf "$OUT/ml_unseen"
