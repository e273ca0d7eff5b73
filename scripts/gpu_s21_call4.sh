#!/usr/bin/env bash
# Session 21, device call 4: bank mode on the persistent plans (M = 256) and other plans at N = 28672 M = 64 r64.
#   1. the multi-LoRA GPU tests (bank mode now also at M = 200 / 256);
#   2. probe_ml_bank.py at M = 256 (the persistent route) and at N = 28672 M = 64 r64 under other bank plans.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s21_call4.sh → $OUT/{session.log,gpu_tests.log,probe.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TEST_TIMEOUT=200 bash scripts/gpu_session.sh --tests "tests/test_multilora_gpu.py"
rm -f "$OUT/results.tar.gz"
timeout 120 python3 scripts/probe_ml_bank.py --out "$OUT/probe/m256" --ms 256 > "$OUT/probe_m256.log" 2>&1
echo "probe m256 rc=$?" >> "$OUT/session.log"
timeout 100 python3 scripts/probe_ml_bank.py --out "$OUT/probe/pins" --kn 4096x28672 --ms 64 --ranks 64 \
    --pins kloop:64x128x128:3,kloop:64x128x64:6,persistent_static,split > "$OUT/probe_pins.log" 2>&1
echo "probe pins rc=$?" >> "$OUT/session.log"
tar czf "$OUT/probe.tar.gz" -C "$OUT" probe probe_m256.log probe_pins.log && rm -rf "$OUT/probe" "$OUT"/probe_*.log
