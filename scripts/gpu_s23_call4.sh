#!/usr/bin/env bash
# Session 23, device call 4: the int4_g64 v2 kernel without expanders (weights pre-expanded per call, by TMA) and
# with two partials in flight, in flight without ptxas serializing the wgmma, coop — GPU tests, the FLUX probe, an M sweep.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s23_call4.sh → $OUT/{session.log,gpu_tests.log,probe.tar.gz}
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader > "$OUT/session.log"
timeout 260 python3 -m pytest -m gpu tests/test_gluon_gpu.py -k "f8w or agree" -q -n 8 --maxfail=25 --timeout=150 \
    -p no:cacheprovider -rf > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc=$?" >> "$OUT/session.log"; tail -15 "$OUT/gpu_tests.log" >> "$OUT/session.log"
timeout 280 python3 scripts/probe_w4a4_w8.py --out "$OUT/probe" --msweep 256,512,1024,2048 > "$OUT/probe.log" 2>&1
echo "probe rc=$?" >> "$OUT/session.log"
(cd "$OUT" && tar czf probe.tar.gz probe probe.log && rm -rf probe probe.log)
