#!/usr/bin/env bash
# Session-9 verification (≈ 5 min): compute-sanitizer on the skinny smoke, the W4A4 GPU suites whose routes changed
# (skinny, GEMV, W4A4, decode), and the skinny layer / GEMM with the new defaults and routes in one process per shape
# next to the GEMV, the decode kernel, cuBLAS bf16 and fp8 (plus a few more configs):
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s9_final.sh
# QUICK=1 (≈ 2.5 min): no sanitizer, the skinny + GEMV suites only, the layer at N = 4096 with the shipped defaults.
QUICK=${QUICK:-0}
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; L=$OUT/s9_final; mkdir -p "$L"
echo "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)" | tee "$L/summary.txt"
suites="tests/test_w4a4_skinny.py tests/test_w4a4_gemv.py"
if [ "$QUICK" != 1 ]; then
  SANITIZE_FMTS=skinny SANITIZE_TIMEOUT=150 bash scripts/sanitize_gluon.sh "$L/sanitize" > /dev/null 2>&1
  echo "sanitize rc=$?: $(grep -oE '^[a-z]+ skinny rc=[0-9]+|(ERROR|RACECHECK) SUMMARY: [^=]*' "$L/sanitize/sanitize_summary.txt" | tr '\n' ' ')" | tee -a "$L/summary.txt"
  suites="$suites tests/test_w4a4_gpu.py tests/test_w4a4_decode.py"
fi
timeout 300 python3 -m pytest -m gpu -q -n 8 --timeout=150 -p no:cacheprovider -W ignore -rf $suites \
    > "$L/gpu_tests.log" 2>&1
echo "pytest rc=$?: $(tail -1 "$L/gpu_tests.log")" | tee -a "$L/summary.txt"
grep -E "^FAILED" "$L/gpu_tests.log" | head -5 | tee -a "$L/summary.txt"
probe() {  # name, shapes, ms, cfgs, env...
  local name=$1 shapes=$2 ms=$3 cfgs=$4; shift 4
  env "$@" timeout 200 python3 scripts/probe_skinny.py --out "$L/$name" --layer --cfgs "$cfgs" --ms "$ms" \
      --small-ms "$ms" --shapes "$shapes" > "$L/$name.log" 2>&1
  echo "probe $name rc=$?" | tee -a "$L/summary.txt"
  grep "^|" "$L/$name.log" | cut -d'|' -f2-6 | tee -a "$L/summary.txt"
}
if [ "$QUICK" = 1 ]; then
  probe n4k 4096x4096,4096x14336 2,3,4,8,16,24,32 "1,4,8;1,4,4,2"
else
  probe n4k 4096x4096,4096x14336 1,2,3,4,8,16,24,32 "1,4,4;1,8,2;1,8,4;1,4,8;2,4,4;1,4,4,2"
  probe n28k 28672x4096 4,16 "1,4,4,2;2,2,4,2;1,8,2,2;2,1,8,2"
fi
tar czf "$OUT/s9_final.tgz" -C "$OUT" s9_final
