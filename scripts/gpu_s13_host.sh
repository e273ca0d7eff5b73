#!/usr/bin/env bash
# Session 13, one device call (≈ 3 min): (1) host time of an eager call piece by piece (probe_host_parts.py) and in
# total (probe_host.py); (2) ncu of the W4A4 GEMV (M = 1, K = 4096, N = 28672) next to the plain read kernel over the
# same 62.4 MB, full section set, one launch each.
#   LOWRANK_GEMM_COMMIT=<hash> [NCU=0] [PARTS=0] [HOST=0] bash scripts/gpu_s13_host.sh → $OUT/host
source "$(dirname "$0")/_device_prelude.sh" host
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
if [ "${PARTS:-1}" = 1 ]; then
  timeout 150 python3 scripts/probe_host_parts.py --out "$L" > "$L/parts.log" 2>&1; say "parts rc=$?"
  cat "$L/probe_host_parts.txt" >> "$L/summary.txt" 2>/dev/null
fi
if [ "${HOST:-1}" = 1 ]; then
  timeout 150 python3 scripts/probe_host.py --out "$L" > "$L/host.log" 2>&1; say "host rc=$?"
  grep "per call" "$L/probe_host.txt" | tee -a "$L/summary.txt"
fi
if [ "${NCU:-1}" = 1 ]; then
  for what in gemv stream; do
    timeout 150 ncu --clock-control none --set full -k regex:"gemv|stream" -s 1 -c 1 python3 scripts/_ncu_decode.py \
        $what > "$L/ncu_$what.txt" 2>&1
    say "ncu $what rc=$?: $(grep -E "^\s+(Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|\
Theoretical Occupancy|Waves Per SM|L2 Hit Rate|L1/TEX Hit Rate|Issued Warp|No Eligible|Block Limit Registers|Mem Busy|\
Max Bandwidth|Mem Pipes Busy)" "$L/ncu_$what.txt" | tr -s ' ' | tr '\n' ';')"
  done
fi
