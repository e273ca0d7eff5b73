#!/usr/bin/env bash
# Session-9 device call (≈ 6 min): the skinny GEMM with row tiles sharing token registers, 16·nibble operands and
# the MAGIC accumulator start — GPU suite first, then in one process per shape the configs next to the decode
# kernel, the GEMV and cuBLAS / fp8 (GEMM and layer), and ncu (full set, one launch) at N = 28672, M = 16:
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s9_probe.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; L=$OUT/s9_probe; mkdir -p "$L"
echo "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)" | tee "$L/summary.txt"
timeout 200 python3 -m pytest -m gpu -q -n 8 --timeout=100 -p no:cacheprovider -W ignore -rf \
    tests/test_w4a4_skinny.py > "$L/gpu_tests.log" 2>&1
echo "pytest rc=$?: $(tail -1 "$L/gpu_tests.log")" | tee -a "$L/summary.txt"
grep -E "^FAILED" "$L/gpu_tests.log" | head -5 | tee -a "$L/summary.txt"
probe() {  # name, shapes, ms, cfgs, env...
  local name=$1 shapes=$2 ms=$3 cfgs=$4; shift 4
  env "$@" timeout 200 python3 scripts/probe_skinny.py --out "$L/$name" --layer --cfgs "$cfgs" --ms "$ms" \
      --small-ms "$ms" --shapes "$shapes" > "$L/$name.log" 2>&1
  echo "probe $name rc=$?" | tee -a "$L/summary.txt"
  grep "^|" "$L/$name.log" | cut -d'|' -f2-6,8 | tee -a "$L/summary.txt"
}
probe n28k 28672x4096 1,4,8,16,32,64 "1,4,2;4,1,2,2;4,1,4;2,1,4,2;4,1,2,4;8,1,2,2;2,2,2,2;4,1,4,2"
probe n4k 4096x4096,4096x14336 1,2,4,8,16 "1,4,2;1,4,4;2,2,2;1,4,2,2;1,8,2"
for cfg in ${NCU_CFGS:-1,4,2 4,1,2,2}; do
  LOWRANK_GEMM_SKINNY_CONFIG=$cfg timeout 120 ncu --clock-control none --set full -k regex:skinny -s 1 -c 1 \
      python3 scripts/_ncu_decode.py skinny 16 > "$L/ncu_skinny_${cfg//,/_}.txt" 2>&1
  echo "ncu $cfg rc=$?: $(grep -E "^\s+Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy" \
      "$L/ncu_skinny_${cfg//,/_}.txt" | tr -s ' ' | tr '\n' ';')" | tee -a "$L/summary.txt"
done
tar czf "$OUT/s9_probe.tgz" -C "$OUT" s9_probe
