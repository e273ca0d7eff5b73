#!/usr/bin/env bash
# Session 19, device call 1: the multi-LoRA heuristic for one adapter above M = 64 (shrink launch + appended
# expand, tile width by the planner's wave rule) and the LoRA narrow rule at M = 128 / N = 2048.
#   1. multi-LoRA GPU tests (tuned plans at their buckets, the heuristic at real sizes);
#   2. probe_multilora_unseen.py on one-adapter cells at M = 128 / 256 (three in the issue-5 grid, untuned since
#      the tuned table has no a1 entry there) — heur vs the old fused-shrink plan (fused128) vs the other width;
#   3. probe_lora_unseen.py at M = 128 / 256 on 4096→2048, 4096² and 4096→1024: the narrow rule's plan next to split
#      and the other families in one process (session 18 left M = 128 and N = 2048 extrapolated), and one kloop
#      launch on a wave of 64×128 tiles for the grid's worst cell (4096², M = 256: 1.37–1.59×).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s19_first.sh → $OUT/{session.log,gpu_tests.log,first.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TEST_TIMEOUT=170 bash scripts/gpu_session.sh --tests "tests/test_multilora_gpu.py"
rm -f "$OUT/results.tar.gz"
A1="4096,28672,16,256,1;4096,28672,64,256,1;4096,4096,64,256,1;4096,4096,16,256,1;4096,14336,16,256,1"
A1="$A1;4096,6144,64,256,1;14336,4096,16,256,1;4096,28672,16,128,1;4096,14336,64,128,1;4096,6144,16,128,4"
timeout 150 python3 scripts/probe_multilora_unseen.py --out "$OUT/ml_a1" --budget-s 120 --cases "$A1" \
    > "$OUT/ml_a1.log" 2>&1; echo "ml_a1 rc=$?" >> "$OUT/session.log"
timeout 170 python3 scripts/probe_lora_unseen.py --out "$OUT/lora_narrow" --budget-s 140 \
    --kn 4096x2048,4096x4096,4096x1024 --ms 128,256 --ranks 16,64 > "$OUT/lora_narrow.log" 2>&1
echo "lora_narrow rc=$?" >> "$OUT/session.log"
tar czf "$OUT/first.tar.gz" -C "$OUT" ml_a1 lora_narrow ml_a1.log lora_narrow.log && rm -rf "$OUT/ml_a1" "$OUT/lora_narrow"
