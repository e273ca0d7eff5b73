#!/usr/bin/env bash
# compute-sanitizer on the W4A4 GEMV (run on the GPU machine): bash scripts/sanitize_gemv.sh [OUTDIR]
# memcheck / racecheck / synccheck over one small checked launch per kernel and config
# (python -m lowrank_gemm.kernels.w4a4_gemv); summary lines to OUTDIR/sanitize_gemv_summary.txt.
set -u
OUTDIR="${1:-${OUT:-./sanitize_logs}}"
mkdir -p "$OUTDIR"
export PYTHONPATH="${PYTHONPATH:-}:src"
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
if [ -z "$SAN" ]; then echo "compute-sanitizer not found" | tee "$OUTDIR/sanitize_gemv_summary.txt"; exit 2; fi
status=0
: > "$OUTDIR/sanitize_gemv_summary.txt"
for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
  log="$OUTDIR/gemv_${tool}.log"
  timeout "${SANITIZE_TIMEOUT:-120}" "$SAN" --tool "$tool" --target-processes all \
    python -m lowrank_gemm.kernels.w4a4_gemv > "$log" 2>&1
  rc=$?
  summary="$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|FAIL' "$log" | tail -3 | tr '\n' ' ') $(grep -c '^OK' "$log") OK"
  echo "$tool rc=$rc :: $summary" | tee -a "$OUTDIR/sanitize_gemv_summary.txt"
  [ $rc -ne 0 ] && status=1
done
exit $status
