#!/usr/bin/env bash
# Session 22, device call 4: stacked bank mode under other plans where it lost to the one-adapter rank-64 plan
# (N = 4096, M = 64, r16 × 4 adapters: 19.2 µs against 17.1), and the M = 16 cells beside it.
#   (M64_ONLY=1: the M = 64 probe alone — the rerun after the first call's pin overflowed SMEM)
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s22_call4.sh → $OUT/{session.log,probe.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader > "$OUT/session.log"
timeout 200 python3 scripts/probe_ml_bank.py --out "$OUT/probe/m64" --kn 4096x4096 --ms 64 --ranks 16 --adapters 4 \
    --pins kloop:64x32x256:2,kloop:64x64x128:4,kloop:64x64x64:6,kloop:64x32x64:8,split,split:64x32x256:4 \
    > "$OUT/probe_m64.log" 2>&1
echo "probe m64 rc=$?" >> "$OUT/session.log"
if [ -z "${M64_ONLY:-}" ]; then
  timeout 150 python3 scripts/probe_ml_bank.py --out "$OUT/probe/m16" --kn 4096x4096,4096x28672 --ms 16 --ranks 16 \
      --adapters 4 --pins split,kloop > "$OUT/probe_m16.log" 2>&1
  echo "probe m16 rc=$?" >> "$OUT/session.log"
fi
(cd "$OUT" && tar czf probe.tar.gz probe probe_*.log && rm -rf probe probe_*.log)
