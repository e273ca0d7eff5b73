#!/usr/bin/env bash
# Session 19, device call 2: `bench multilora` on the issue-5 grid (last run at b428d50, session 15; since then the
# heuristic changed for untuned cells — session 18's appended expand, session 19's one-adapter plan above M = 64 —
# and three grid cells, M = 256 with one adapter, have no tuned entry), then the untuned Llama-3-8B shapes of
# session 18's check (`probes/s18/verify/ml_unseen`) to compare before / after.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s19_benches.sh → $OUT/{session.log,results.tar.gz,unseen.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BENCH_TIMEOUT=330 bash scripts/gpu_session.sh --no-tests --suites multilora
timeout 200 python3 -m lowrank_gemm bench multilora --kn 4096x6144,14336x4096,4096x14336 \
    --only cublas_base,shrink_expand,fused --out "$OUT/ml_unseen" > "$OUT/ml_unseen.log" 2>&1
echo "multilora unseen rc=$?" >> "$OUT/session.log"
tar czf "$OUT/unseen.tar.gz" -C "$OUT" ml_unseen ml_unseen.log && rm -rf "$OUT/ml_unseen"
