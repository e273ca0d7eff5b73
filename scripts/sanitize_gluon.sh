#!/usr/bin/env bash
# Race and barrier checks of the warp-specialized v2 kernels (run on the GPU machine):
#   bash scripts/sanitize_gluon.sh [OUTDIR]
# Each tool runs one small checked launch per kernel (lowrank_gemm.kernels.gluon.smoke); the logs
# go to OUTDIR (default: $OUT or ./sanitize_logs). Record the summary lines in benchmarks/NOTES.md.
# SANITIZE_FMTS=gemv runs the W4A4 GEMV's smoke instead (python -m lowrank_gemm.kernels.w4a4_gemv: both
# kernels, split-K and not); SANITIZE_FMTS=skinny the skinny GEMM's (python -m lowrank_gemm.kernels.w4a4_skinny);
# SANITIZE_FMTS=decode the decode kernel's three default paths (python -m lowrank_gemm.kernels.gluon.smoke --fmt decode).
set -u
OUTDIR="${1:-${OUT:-./sanitize_logs}}"
mkdir -p "$OUTDIR"
export PYTHONPATH="${PYTHONPATH:-}:src"
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
if [ -z "$SAN" ]; then echo "compute-sanitizer not found" | tee "$OUTDIR/sanitize_summary.txt"; exit 2; fi
status=0
: > "$OUTDIR/sanitize_summary.txt"
# Both formats by default (int4_2l v2 verified on the H200 in session 2); SANITIZE_FMTS narrows it.
for fmt in ${SANITIZE_FMTS:-int4_g64 int4_2l}; do
  for tool in ${SANITIZE_TOOLS:-racecheck synccheck memcheck}; do
    log="$OUTDIR/${tool}_${fmt}.log"
    extra=""
    [ "$tool" = racecheck ] && extra="--racecheck-report all"
    if [ "$fmt" = gemv ]; then smoke=(-m lowrank_gemm.kernels.w4a4_gemv);
    elif [ "$fmt" = decode ]; then smoke=(-m lowrank_gemm.kernels.gluon.smoke --fmt decode);
    elif [ "$fmt" = skinny ]; then smoke=(-m lowrank_gemm.kernels.w4a4_skinny); else
      smoke=(-m lowrank_gemm.kernels.gluon.smoke --fmt "$fmt"); fi
    timeout "${SANITIZE_TIMEOUT:-120}" "$SAN" --tool "$tool" $extra --target-processes all \
      python "${smoke[@]}" > "$log" 2>&1
    rc=$?
    summary="$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|hazard|OK|FAIL' "$log" | tail -4 | tr '\n' ' ')"
    echo "$tool $fmt rc=$rc :: $summary" | tee -a "$OUTDIR/sanitize_summary.txt"
    [ $rc -ne 0 ] && status=1
  done
done
exit $status
