#!/usr/bin/env bash
# Session 19, device call 2: the tree after call 1's rules and pins (most needed first: refusals ate the budget).
#   1. LoRA GPU tests (every tuned plan at its bucket, incl. the three new entries; the heuristic at real sizes);
#   2. probe_lora_unseen.py on held-out shapes for `one_wave_kloop_tile` (K ≤ 4096, never probed): 4096→3072,
#      3072→4096, 2048² at M = 256 / 128 — `auto` (the rule) next to every family in one process;
#   3. `bench multilora`, full (with the eager torch loop), into benchmarks/results/h200/ (→ results.tar.gz).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s19_call2.sh → $OUT/{session.log,gpu_tests.log,heldout.tar.gz,results.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TEST_TIMEOUT=170 bash scripts/gpu_session.sh --tests "tests/test_lora_gemm_gpu.py"
rm -f "$OUT/results.tar.gz"
timeout 110 python3 scripts/probe_lora_unseen.py --out "$OUT/heldout" --budget-s 90 \
    --kn 4096x3072,3072x4096,2048x2048 --ms 256,128 --ranks 16,64 > "$OUT/heldout.log" 2>&1
echo "heldout rc=$?" >> "$OUT/session.log"
tar czf "$OUT/heldout.tar.gz" -C "$OUT" heldout heldout.log && rm -rf "$OUT/heldout"
BENCH_TIMEOUT=${BENCH_TIMEOUT:-240} bash scripts/gpu_session.sh --no-tests --suites multilora
