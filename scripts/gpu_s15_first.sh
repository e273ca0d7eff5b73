#!/usr/bin/env bash
# Next session's first call (written in session 14, which ran out of device time before it):
#   1. the GEMV and multi-LoRA GPU tests (int4_g64's M = 1 early-trigger + EPI_EARLY route; the pinned two-CTA plans);
#   2. `bench multilora` (full) on the final tuned table — the committed multilora.json predates bbe29a7's four pins;
#   3. the M ≤ 16 heuristic question: untuned N with the heuristic plan (BM 64, fused shrink) against the swap-AB
#      BK 64 candidates (every tuned M = 16 winner is a swap-AB plan; two untuned probes agreed in session 14).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s15_first.sh → $OUT/{session.log,gpu_tests.log,results.tar.gz,heur16}
cd "$(dirname "$0")/.."
TEST_TIMEOUT=200 BENCH_TIMEOUT=300 bash scripts/gpu_session.sh \
    --tests "tests/test_w4a4_gemv.py tests/test_multilora_gpu.py" --suites multilora
export PYTHONPATH=$PWD/src
timeout 200 python3 scripts/probe_multilora_parts.py --configs --out "${OUT:-/tmp/out}/heur16" \
    --cases 16x6144x16x1,16x6144x16x4,16x8192x16x1,16x8192x16x4,16x14336x64x1,16x14336x16x16 \
    > "${OUT:-/tmp/out}/heur16.log" 2>&1
grep "^|" "${OUT:-/tmp/out}/heur16.log" | grep -v -- "---"
