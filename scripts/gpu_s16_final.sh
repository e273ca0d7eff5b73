#!/usr/bin/env bash
# Session 16, two device calls on a warm machine:
#   PART=probe: LoRA GPU tests (incl. every tuned plan at its bucket), then the persistent probe, which merges its
#               winners into plan/tuned/lora_h200.json (copied to $OUT);
#   PART=bench: `bench lora` (full) on the tree's table (copy the probe's $OUT/lora_h200.json into the tree first).
#   PART=probe LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s16_final.sh
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TABLE=src/lowrank_gemm/plan/tuned/lora_h200.json
if [ "${PART:-probe}" = probe ]; then
  TEST_TIMEOUT=200 bash scripts/gpu_session.sh --tests "tests/test_lora_gemm_gpu.py tests/test_smem_ledger.py"
  timeout 200 python3 scripts/probe_lora_persistent.py --out "$OUT/persistent" --budget-s 150 \
      --write-tuned "$TABLE" > "$OUT/probe.log" 2>&1; echo "probe rc=$?" >> "$OUT/session.log"
  cp "$TABLE" "$OUT/lora_h200.json"
  tar czf "$OUT/persistent.tar.gz" -C "$OUT" persistent && rm -rf "$OUT/persistent"
else
  BENCH_TIMEOUT=480 bash scripts/gpu_session.sh --no-tests --suites lora
fi
