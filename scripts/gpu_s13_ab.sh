#!/usr/bin/env bash
# Session 13: eager host time, this tree against an earlier commit's src on the same host (alternating processes),
# then the host-time parts and the GPU tests touched since the last full run.
#   git archive <old> src | tar -x -C _ab/<old>   (untracked: travels with the tree), then
#   LOWRANK_GEMM_COMMIT=<hash> OLD=<old> [TESTS="..."] bash scripts/gpu_s13_ab.sh → $OUT/ab
source "$(dirname "$0")/_device_prelude.sh" ab
say "commit=${LOWRANK_GEMM_COMMIT:-?} old=${OLD:?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
for rep in 1 2 3; do
  for tree in old new; do
    src=$PWD/src; [ $tree = old ] && src=$PWD/_ab/$OLD/src
    PROBE_SRC=$src timeout 120 python3 scripts/probe_host.py --no-profile --calls 400 --out "$L/$tree$rep" \
        > "$L/$tree$rep.log" 2>&1
    say "$tree rep $rep rc=$?: $(grep 'per call' "$L/$tree$rep/probe_host.txt" | sed 's/: host / /;s/ µs per call//' | tr '\n' ' ')"
  done
done
timeout 120 python3 scripts/probe_host_parts.py --out "$L" > "$L/parts.log" 2>&1; say "parts rc=$?"
cat "$L/probe_host_parts.txt" >> "$L/summary.txt" 2>/dev/null
if [ -n "${TESTS:-}" ]; then
  timeout 300 python3 -m pytest -m gpu -q -n 8 --timeout=200 -p no:cacheprovider -W ignore -rf $TESTS \
      > "$L/gpu_tests.log" 2>&1
  say "pytest rc=$?: $(tail -1 "$L/gpu_tests.log")"; grep -E "^FAILED|^ERROR" "$L/gpu_tests.log" | head -20 | tee -a "$L/summary.txt"
fi
