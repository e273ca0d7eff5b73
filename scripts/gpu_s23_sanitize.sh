#!/usr/bin/env bash
# Session 23, device call 5 (its last part): compute-sanitizer (racecheck, synccheck, memcheck) on the no-expander W4A4 kernel
# (coop, two partials in flight) that auto now runs from W8_MIN_M tokens.
#   bash scripts/gpu_s23_sanitize.sh → $OUT/{sanitize_summary.txt,sanitize.tar.gz}
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/san"
export PYTHONPATH=$PWD/src
SANITIZE_FMTS=int4_g64_w8 SANITIZE_TIMEOUT=${SANITIZE_TIMEOUT:-150} bash scripts/sanitize_gluon.sh "$OUT/san"
echo "sanitize rc=$?" >> "$OUT/san/sanitize_summary.txt"
cp "$OUT/san/sanitize_summary.txt" "$OUT/"
(cd "$OUT" && tar czf sanitize.tar.gz san && rm -rf san)
