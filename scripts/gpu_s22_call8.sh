#!/usr/bin/env bash
# Session 22, device call 8: the opt-in wide stacked mode (LOWRANK_GEMM_ML_STACK_WIDE=1: 16 adapters of r16, 4 of
# r64 — a stacked rank of 256 on the rank-64 plan as split, the epilogue in rank chunks), probe only.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s22_call8.sh → $OUT/{session.log,probe.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOWRANK_GEMM_ML_STACK_WIDE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader > "$OUT/session.log"
timeout 100 python3 scripts/probe_ml_bank.py --out "$OUT/probe/a16" --kn 4096x4096,4096x28672 --ms 16 --ranks 16 \
    --adapters 16 > "$OUT/probe_a16.log" 2>&1
echo "probe a16 rc=$?" >> "$OUT/session.log"
timeout 60 python3 scripts/probe_ml_bank.py --out "$OUT/probe/r64" --kn 4096x4096 --ms 16 --ranks 64 --adapters 4 \
    > "$OUT/probe_r64.log" 2>&1
echo "probe r64 rc=$?" >> "$OUT/session.log"
(cd "$OUT" && tar czf probe.tar.gz probe probe_a16.log probe_r64.log && rm -rf probe probe_a16.log probe_r64.log)
