#!/usr/bin/env bash
# One device-machine call: GPU tests, then benchmark suites, results under $OUT.
#   scripts/gpu_session.sh [--tests "pytest args"] [-k "pytest -k expression"] [--suites "lora multilora w4a4 ab"]
#                          [--quick] [--sanitize]
# (--tests is word-split, so a -k expression with spaces goes through -k: session 28's call 5 ran no tests)
# Everything comes back as $OUT/session.log, $OUT/gpu_tests.log and $OUT/results.tar.gz
# (benchmarks/results/<gpu>/* written by the suites: h200, h100, … — bench.common.results_dir), since the device tool
# returns ≤ 8 files.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TESTS="tests"; KEXPR=""; SUITES=""; QUICK=""; SANITIZE=0; TEST_TIMEOUT=${TEST_TIMEOUT:-240}
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) TESTS="$2"; shift 2;;
    --no-tests) TESTS=""; shift;;
    -k) KEXPR="$2"; shift 2;;
    --suites) SUITES="$2"; shift 2;;
    --quick) QUICK="--quick"; shift;;
    --sanitize) SANITIZE=1; shift;;
    *) echo "unknown arg $1"; exit 2;;
  esac
done
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
RES=$(python3 -c "from lowrank_gemm.bench.common import results_dir; print(results_dir())" 2>/dev/null \
      || echo benchmarks/results/unknown_gpu)
LOGS=$RES/logs; mkdir -p "$LOGS"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/session.log"; }
log "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/session.log"
if [ -n "${PRE:-}" ]; then log "pre: $PRE"; timeout 90 bash -c "$PRE" >>"$OUT/session.log" 2>&1; log "pre rc=$?"; fi
if [ -n "$TESTS" ]; then
  log "pytest -m gpu $TESTS${KEXPR:+ -k \"$KEXPR\"}"
  # -n: one worker per few cores — a fresh machine compiles every kernel variant, and serially that took ~1 s per
  # test (session 10 lost two runs to it)
  KARGS=(); [ -n "$KEXPR" ] && KARGS=(-k "$KEXPR")
  timeout "$TEST_TIMEOUT" python3 -m pytest -m gpu $TESTS ${KARGS[@]+"${KARGS[@]}"} -q -n "${PYTEST_WORKERS:-8}" --maxfail=25 --timeout=150 \
      -p no:cacheprovider -rf \
      >"$OUT/gpu_tests.log" 2>&1; log "pytest rc=$?"
  tail -25 "$OUT/gpu_tests.log" | tee -a "$OUT/session.log"
fi
for s in $SUITES; do
  log "bench $s $QUICK"
  timeout "${BENCH_TIMEOUT:-420}" python3 -m lowrank_gemm bench "$s" $QUICK --out "$RES" >>"$LOGS/bench_$s.log" 2>&1
  log "bench $s rc=$?"; tail -40 "$LOGS/bench_$s.log" >> "$OUT/session.log"
done
if [ "$SANITIZE" = 1 ] && [ -x scripts/sanitize_gluon.sh ]; then
  log "compute-sanitizer"; timeout 240 scripts/sanitize_gluon.sh >"$OUT/sanitize.log" 2>&1; log "sanitize rc=$?"
fi
tar czf "$OUT/results.tar.gz" "$RES"
log "done"
