#!/usr/bin/env bash
# Session 22, device call 6: stacked bank mode on split where the kloop plan's N tile is narrower than the stacked
# rank (N = 4096, M = 64), the A gather masked to live rows.
#   1. the multi-LoRA GPU tests; 2. probe_ml_bank.py --adapters 4 at N = 4096 M = 64 (stacked now on split);
#   3. `bench multilora`, full (canonical) → results.tar.gz.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s22_call6.sh → $OUT/{session.log,gpu_tests.log,probe.tar.gz,results.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TEST_TIMEOUT=150 bash scripts/gpu_session.sh --tests "tests/test_multilora_gpu.py"
rm -f "$OUT/results.tar.gz"
timeout 90 python3 scripts/probe_ml_bank.py --out "$OUT/probe/m64" --kn 4096x4096 --ms 64 --ranks 16 --adapters 4 \
    --pins kloop,split:64x32x256:4 > "$OUT/probe_m64.log" 2>&1
echo "probe m64 rc=$?" >> "$OUT/session.log"
(cd "$OUT" && tar czf probe.tar.gz probe probe_m64.log && rm -rf probe probe_m64.log)
BENCH_TIMEOUT=${BENCH_TIMEOUT:-260} bash scripts/gpu_session.sh --no-tests --suites multilora
