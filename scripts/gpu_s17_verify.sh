#!/usr/bin/env bash
# Session 17, device call 4: the measured heuristic (planner.measured_tile) and the 23 tuned entries for the
# Llama-3-8B projections — LoRA GPU tests (every tuned plan at its bucket), `bench lora` on the four untuned shapes
# with the shipped table (auto = tuned where the probe pinned, else the heuristic), then the same with the tuned
# table hidden (every cell on the heuristic alone).
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
KN=4096x1024,4096x14336,14336x4096,4096x6144
TEST_TIMEOUT=200 bash scripts/gpu_session.sh --tests "tests/test_lora_gemm_gpu.py"
rm -f "$OUT/results.tar.gz"
timeout 200 python3 -m lowrank_gemm bench lora --kn $KN --only cublas_base,torch_unfused,auto --out "$OUT/after" \
    > "$OUT/after.log" 2>&1; echo "after rc=$?" >> "$OUT/session.log"
timeout 170 python3 -c "
import sys, lowrank_gemm.plan.planner as P
P.load_tuned = lambda path: {}          # hide the tuned table: the heuristic alone
from lowrank_gemm.bench.lora import main
sys.exit(main(['--kn', '$KN', '--only', 'cublas_base,auto', '--out', '$OUT/heuristic']))
" > "$OUT/heuristic.log" 2>&1; echo "heuristic rc=$?" >> "$OUT/session.log"
tar czf "$OUT/verify.tar.gz" -C "$OUT" after heuristic && rm -rf "$OUT/after" "$OUT/heuristic"
