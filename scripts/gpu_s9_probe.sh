#!/usr/bin/env bash
# Session-9 device call 2 (≈ 4 min): where the skinny GEMM's time goes at N = 28672 (ncu, full set, one launch per
# config at M = 16), PDL on / off for the layer at N = 28672 (M = 1, 4, 16, 64), and the layer at N = 4096 for
# M = 1..4 (skinny now launched without PDL vs the GEMV):
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s9_probe.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; L=$OUT/s9_probe; mkdir -p "$L"
echo "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)" | tee "$L/summary.txt"
for cfg in 1,4,2 4,1,4; do
  LOWRANK_GEMM_SKINNY_CONFIG=$cfg timeout 150 ncu --clock-control none --set full -k regex:skinny -s 1 -c 1 \
      python3 scripts/_ncu_decode.py skinny 16 > "$L/ncu_skinny_${cfg//,/_}.txt" 2>&1
  echo "ncu $cfg rc=$?" | tee -a "$L/summary.txt"
done
probe() {  # name, shapes, ms, cfgs, env...
  local name=$1 shapes=$2 ms=$3 cfgs=$4; shift 4
  env "$@" timeout 150 python3 scripts/probe_skinny.py --out "$L/$name" --layer --cfgs "$cfgs" --ms "$ms" \
      --shapes "$shapes" > "$L/$name.log" 2>&1
  echo "probe $name rc=$?" | tee -a "$L/summary.txt"
  grep "^|" "$L/$name.log" | cut -d'|' -f2-6 | tee -a "$L/summary.txt"
}
probe n28k_pdl 28672x4096 1,4,16,64 "1,4,2;4,1,4;2,1,4"
probe n28k_nopdl 28672x4096 1,4,16,64 "1,4,2" LOWRANK_GEMM_PDL=0
probe n4k_few 4096x4096 1,2,3,4 "1,4,2"
