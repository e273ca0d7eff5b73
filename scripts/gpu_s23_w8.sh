#!/usr/bin/env bash
# Session 23, device calls 2–4: the int4_g64 v2 kernel without expanders (weights pre-expanded per call, by TMA; coop;
# partials in flight) — the no-expander GPU tests and the bit-identity test, then the FLUX probe.
#   LOWRANK_GEMM_COMMIT=<hash> [PROBE_ARGS="--msweep 256,512,1024,2048"] bash scripts/gpu_s23_w8.sh
#   → $OUT/{session.log,gpu_tests.log,probe.tar.gz}
# (calls 2 and 3 ran it without PROBE_ARGS, call 4 with the M sweep; they were gpu_s23_call{2,3,4}.sh then.)
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader > "$OUT/session.log"
timeout 260 python3 -m pytest -m gpu tests/test_gluon_gpu.py -k "f8w or agree" -q -n 8 --maxfail=25 --timeout=150 \
    -p no:cacheprovider -rf > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc=$?" >> "$OUT/session.log"; tail -15 "$OUT/gpu_tests.log" >> "$OUT/session.log"
# shellcheck disable=SC2086
timeout 280 python3 scripts/probe_w4a4_w8.py --out "$OUT/probe" ${PROBE_ARGS:-} > "$OUT/probe.log" 2>&1
echo "probe rc=$?" >> "$OUT/session.log"
(cd "$OUT" && tar czf probe.tar.gz probe probe.log && rm -rf probe probe.log)
