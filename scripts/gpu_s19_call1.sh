#!/usr/bin/env bash
# Session 19, device call 1 (one call: three refusals cost ~4.5 of the 30 minutes before it ran): the multi-LoRA
# heuristic for one adapter above M = 64 (shrink launch + appended expand, tile width by the planner's wave rule)
# and the LoRA narrow rule at M = 128 / N = 2048.
#   1. multi-LoRA GPU tests (tuned plans at their buckets, the heuristic at real sizes);
#   2. probe_multilora_unseen.py on one-adapter cells at M = 128 / 256 (three in the issue-5 grid, untuned since
#      the tuned table has no a1 entry there) — heur vs the old fused-shrink plan (fused128) vs the other width;
#   3. `bench multilora` on the issue-5 grid (last run at b428d50, session 15), without the eager torch loop;
#   4. probe_lora_unseen.py at M = 128 / 256 on 4096→2048, 4096² and 4096→1024: the narrow rule's plan next to split
#      and the other families in one process (session 18 left M = 128 and N = 2048 extrapolated), and one kloop
#      launch on a wave of 64×128 tiles for the grid's worst cell (4096², M = 256: 1.37–1.59×).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s19_call1.sh → $OUT/{session.log,gpu_tests.log,call1.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TEST_TIMEOUT=140 bash scripts/gpu_session.sh --tests "tests/test_multilora_gpu.py"
rm -f "$OUT/results.tar.gz"
A1="4096,28672,16,256,1;4096,28672,64,256,1;4096,4096,64,256,1;4096,4096,16,256,1;4096,14336,16,256,1"
A1="$A1;4096,6144,64,256,1;14336,4096,16,256,1;4096,28672,16,128,1;4096,14336,64,128,1;4096,6144,16,128,4"
timeout 100 python3 scripts/probe_multilora_unseen.py --out "$OUT/ml_a1" --budget-s 75 --cases "$A1" \
    > "$OUT/ml_a1.log" 2>&1; echo "ml_a1 rc=$?" >> "$OUT/session.log"
timeout 210 python3 -m lowrank_gemm bench multilora --only cublas_base,shrink_expand,fused,fused_segment,segment_sort \
    --out "$OUT/ml_grid" > "$OUT/ml_grid.log" 2>&1; echo "ml_grid rc=$?" >> "$OUT/session.log"
timeout 100 python3 scripts/probe_lora_unseen.py --out "$OUT/lora_narrow" --budget-s 80 \
    --kn 4096x4096,4096x2048,4096x1024 --ms 256,128 --ranks 16,64 > "$OUT/lora_narrow.log" 2>&1
echo "lora_narrow rc=$?" >> "$OUT/session.log"
tar czf "$OUT/call1.tar.gz" -C "$OUT" ml_a1 ml_grid lora_narrow ml_a1.log ml_grid.log lora_narrow.log
rm -rf "$OUT/ml_a1" "$OUT/ml_grid" "$OUT/lora_narrow"
