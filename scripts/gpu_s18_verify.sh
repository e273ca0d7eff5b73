#!/usr/bin/env bash
# Session 18, device call 3: the rules after probes/s18/{first,down} — the wave rule (128×128 at 1–1.5 waves of
# 128×256), persistent_static at 64 < M ≤ 1024 where the S tasks add no round, and the multi-LoRA heuristic's
# appended expand from 2 adapters on.
#   1. LoRA and multi-LoRA GPU tests (every tuned plan at its bucket, the heuristic plans at real sizes);
#   2. `bench lora` on the eight untuned shapes (Llama-3-8B, Qwen2.5-7B, Llama-3-70B) at M 256 / 1024, r 16 / 64,
#      with the tuned table hidden (the heuristic alone), cuBLAS and torch unfused in the same process;
#   3. `bench multilora --kn` on the three untuned Llama-3-8B shapes (cuBLAS, shrink + expand, fused).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s18_verify.sh → $OUT/{session.log,gpu_tests.log,verify.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
KN=4096x1024,4096x14336,14336x4096,4096x6144,3584x18944,18944x3584,8192x28672,28672x8192
TEST_TIMEOUT=200 bash scripts/gpu_session.sh --tests "tests/test_lora_gemm_gpu.py tests/test_multilora_gpu.py"
rm -f "$OUT/results.tar.gz"
timeout 150 python3 -c "
import sys, lowrank_gemm.plan.planner as P
P.load_tuned = lambda path: {}          # hide the tuned table: the heuristic alone
from lowrank_gemm.bench.lora import main
sys.exit(main(['--kn', '$KN', '--ms', '256,1024', '--ranks', '16,64', '--only', 'cublas_base,torch_unfused,auto',
               '--out', '$OUT/heuristic']))
" > "$OUT/heuristic.log" 2>&1; echo "heuristic rc=$?" >> "$OUT/session.log"
timeout 200 python3 -m lowrank_gemm bench multilora --kn 4096x6144,14336x4096,4096x14336 \
    --only cublas_base,shrink_expand,fused --out "$OUT/ml_unseen" > "$OUT/ml_unseen.log" 2>&1
echo "multilora rc=$?" >> "$OUT/session.log"
tar czf "$OUT/verify.tar.gz" -C "$OUT" heuristic ml_unseen heuristic.log ml_unseen.log && rm -rf "$OUT/heuristic" "$OUT/ml_unseen"
