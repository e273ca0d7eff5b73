#!/usr/bin/env bash
# Next session's first call (written in session 16, whose device time ran out after the final bench):
#   1. the LoRA GPU tests (every tuned plan at its bucket; epi_stages);
#   2. the persistent probe with the epi_stages=1 A/B (ps vs ps_e1, ps_256x128 vs ps_256x128_e1), writing its
#      winners into a copy of the tuned table in $OUT (not the tree: merge by hand after reading the A/B);
#   3. nothing else — ~4 minutes, leaving time for a `bench lora` on whatever table comes out of it.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s17_first.sh → $OUT/{session.log,gpu_tests.log,probe.log,…}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TEST_TIMEOUT=200 bash scripts/gpu_session.sh --tests "tests/test_lora_gemm_gpu.py tests/test_smem_ledger.py"
rm -f "$OUT/results.tar.gz"
cp src/lowrank_gemm/plan/tuned/lora_h200.json "$OUT/lora_h200.json"
timeout 240 python3 scripts/probe_lora_persistent.py --out "$OUT/persistent" --budget-s 180 \
    --write-tuned "$OUT/lora_h200.json" > "$OUT/probe.log" 2>&1; echo "probe rc=$?" >> "$OUT/session.log"
tar czf "$OUT/persistent.tar.gz" -C "$OUT" persistent && rm -rf "$OUT/persistent"
