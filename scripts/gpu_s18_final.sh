#!/usr/bin/env bash
# Session 18, device call 6: the narrow-N rule (one kloop launch on 64×64 tiles at 64 < M ≤ 256) and the 7 probe
# winners of probes/s18/narrow — LoRA GPU tests (every tuned plan at its bucket), then `bench lora` with the tuned
# table hidden on the narrow shapes at M 128 / 256 (M=128 and N=2048 were not probed: the rule's extrapolation).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s18_final.sh → $OUT/{session.log,gpu_tests.log,final.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TEST_TIMEOUT=160 bash scripts/gpu_session.sh --tests "tests/test_lora_gemm_gpu.py"
rm -f "$OUT/results.tar.gz"
timeout 100 python3 -c "
import sys, lowrank_gemm.plan.planner as P
P.load_tuned = lambda path: {}          # hide the tuned table: the heuristic alone
from lowrank_gemm.bench.lora import main
sys.exit(main(['--kn', '4096x1024,8192x1024,4096x2048', '--ms', '128,256', '--ranks', '16,64',
               '--only', 'cublas_base,torch_unfused,auto', '--out', '$OUT/narrow_heuristic']))
" > "$OUT/narrow_heuristic.log" 2>&1; echo "heuristic rc=$?" >> "$OUT/session.log"
tar czf "$OUT/final.tar.gz" -C "$OUT" narrow_heuristic narrow_heuristic.log && rm -rf "$OUT/narrow_heuristic"
