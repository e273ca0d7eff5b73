#!/usr/bin/env bash
# One device call (≈ 5 min) for the skinny W4A4 GEMM (docs/gpu_runbook.md; written in session 8, run in session 9):
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_skinny_check.sh
# 1. compute-sanitizer (memcheck, racecheck, synccheck) on the skinny smoke;
# 2. the skinny + GEMV GPU suites three times (an unwritten-output failure was seen once in a reverted variant),
#    the W4A4 and decode suites once (the session-8 routes);
# 3. the layer's PDL A/B at M ≤ 16: probe_skinny --layer as shipped (the skinny launch without PDL since session 9),
#    with the skinny launch on PDL (LOWRANK_GEMM_SKINNY_PDL=1), and with PDL off everywhere.
# Everything lands under $OUT (logs tarred, probe tables beside them).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; L=$OUT/skinny_check; mkdir -p "$L"
echo "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)" | tee "$L/summary.txt"
SANITIZE_FMTS=skinny SANITIZE_TIMEOUT=150 bash scripts/sanitize_gluon.sh "$L/sanitize" > /dev/null 2>&1
echo "sanitize rc=$?: $(tr '\n' ' ' < "$L/sanitize/sanitize_summary.txt")" | tee -a "$L/summary.txt"
for i in 1 2 3; do
  extra=""; [ $i = 1 ] && extra="tests/test_w4a4_gpu.py tests/test_w4a4_decode.py"   # the routes, once
  timeout 200 python3 -m pytest -m gpu -q -n 8 --timeout=100 -p no:cacheprovider -W ignore -rf \
      tests/test_w4a4_skinny.py tests/test_w4a4_gemv.py $extra > "$L/gpu_tests_$i.log" 2>&1
  echo "pytest run $i rc=$?: $(tail -1 "$L/gpu_tests_$i.log")" | tee -a "$L/summary.txt"
done
probe() {  # name, env...
  local name=$1; shift
  env "$@" timeout 120 python3 scripts/probe_skinny.py --out "$L/$name" --layer --cfgs "1,4,8" --ms 4,8,16 \
      --shapes 4096x4096 > "$L/$name.log" 2>&1
  echo "probe $name rc=$?" | tee -a "$L/summary.txt"
  grep -E "layer:|skinny:" "$L/$name.log" | grep "^|" | cut -d'|' -f2-6 | tee -a "$L/summary.txt"
}
probe shipped
probe skinny_pdl_on LOWRANK_GEMM_SKINNY_PDL=1
probe pdl_off LOWRANK_GEMM_PDL=0
tar czf "$OUT/skinny_check.tgz" -C "$OUT" skinny_check
