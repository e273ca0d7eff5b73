#!/usr/bin/env bash
# Session 41's canonical decode rerun (≤ 200 s, an H200): `bench w4a4 --only decode` with the W4A8 quantizer's early
# PDL trigger → results/h200/w4a4_decode.*
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s41k.sh → $OUT/s41k/
source "$(dirname "$0")/_device_prelude.sh" s41k
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 180 python3 -m lowrank_gemm bench w4a4 --only decode --out "$L/results" > "$L/bench_decode.log" 2>&1
say "bench w4a4 --only decode rc=$?"
grep -E "a8|auto|cublas" "$L/bench_decode.log" | grep -E "layer|cublas" | head -30 >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" bench_decode.log && rm -f "$L/bench_decode.log"
