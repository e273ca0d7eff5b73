#!/usr/bin/env bash
# Session 23, device call 6: fp32 w_scale rows on the no-expander W4A4 kernel (ws_f32) — the bit-identity GPU test,
# then the probe at fc1 / fc2.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s23_call6.sh → $OUT/{session.log,gpu_tests.log,probe.tar.gz}
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader > "$OUT/session.log"
timeout 120 python3 -m pytest -m gpu tests/test_gluon_gpu.py -k "agree" -q -n 3 --timeout=100 -p no:cacheprovider -rf \
    > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc=$?" >> "$OUT/session.log"; tail -5 "$OUT/gpu_tests.log" >> "$OUT/session.log"
timeout 150 python3 scripts/probe_w4a4_w8.py --out "$OUT/probe" --shapes fc1,fc2 > "$OUT/probe.log" 2>&1
echo "probe rc=$?" >> "$OUT/session.log"
(cd "$OUT" && tar czf probe.tar.gz probe probe.log && rm -rf probe probe.log)
