#!/usr/bin/env bash
# One device call for the skinny W4A4 GEMM (kernels/w4a4_skinny.py; docs/gpu_runbook.md sessions 8–9):
#   LOWRANK_GEMM_COMMIT=<hash> MODE=<mode> bash scripts/gpu_skinny_check.sh
# MODE=pdl    (≈ 5 min; session 9's first call): compute-sanitizer on the skinny smoke, the skinny + GEMV GPU suites
#             three times (the W4A4 and decode suites once), the layer's PDL A/B at K = N = 4096, M ≤ 16 (as shipped,
#             the skinny launch on PDL via LOWRANK_GEMM_SKINNY_PDL=1, PDL off everywhere);
# MODE=sweep  (≈ 5 min): the skinny suite, configs × M next to the decode kernel, the GEMV, cuBLAS and fp8 (GEMM and
#             layer) at N = 28672 and N = 4096 (K = 4096, 14336), ncu (full set, one launch) at N = 28672, M = 16 for
#             the configs in NCU_CFGS;
# MODE=final  (≈ 5 min, the default): sanitizer, the skinny / GEMV / W4A4 / decode suites, the shipped defaults and a
#             few more configs at N = 4096 and N = 28672;
# MODE=quick  (≈ 2.5 min): the skinny + GEMV suites, the layer at N = 4096 with the shipped defaults;
# MODE=variants (≈ 7 min; session 10's prepared, CPU-checked-only variants): sanitizer (smokes incl. block_t 32 / 64,
#             load16 and the int4_2l GEMV), the skinny + GEMV suites (incl. test_gpu_token_groups / test_gpu_load16 /
#             the int4_2l GEMV tests), the int4_2l GEMV probe (probe_gemv.py --two-level), then the 16-byte
#             loads (+l16) and 32 / 64 tokens per program (/32, /64) next to the shipped configs at N = 28672 and at
#             N = 4096 (K = 4096, 14336), M = 4 … 64.
# Everything lands under $OUT/skinny_<mode> (tarred; summary.txt beside it).
MODE=${MODE:-final}
source "$(dirname "$0")/_device_prelude.sh" "skinny_$MODE"
say "commit=${LOWRANK_GEMM_COMMIT:-?} mode=$MODE $(nvidia-smi --query-gpu=name --format=csv,noheader)"
sanitize() {  # smokes: skinny by default, SANITIZE_FMTS="skinny gemv" for both
  SANITIZE_FMTS=${SANITIZE_FMTS:-skinny} SANITIZE_TIMEOUT=150 bash scripts/sanitize_gluon.sh "$L/sanitize" \
      > /dev/null 2>&1
  say "sanitize rc=$?: $(grep -oE '^[a-z]+ (skinny|gemv) rc=[0-9]+|(ERROR|RACECHECK) SUMMARY: [^=]*' \
      "$L/sanitize/sanitize_summary.txt" | tr '\n' ' ')"
}
suites() {  # log name, test files...
  local name=$1; shift
  timeout 300 python3 -m pytest -m gpu -q -n 8 --timeout=150 -p no:cacheprovider -W ignore -rf "$@" \
      > "$L/$name.log" 2>&1
  say "pytest $name rc=$?: $(tail -1 "$L/$name.log")"
  grep -E "^FAILED" "$L/$name.log" | head -5 | tee -a "$L/summary.txt"
}
probe() {  # name, shapes, ms, cfgs, env...
  local name=$1 shapes=$2 ms=$3 cfgs=$4; shift 4
  env "$@" timeout 200 python3 scripts/probe_skinny.py --out "$L/$name" --layer --cfgs "$cfgs" --ms "$ms" \
      --small-ms "$ms" --shapes "$shapes" > "$L/$name.log" 2>&1
  say "probe $name rc=$?"
  grep "^|" "$L/$name.log" | cut -d'|' -f2-6 | tee -a "$L/summary.txt"
}
SK=tests/test_w4a4_skinny.py; GV=tests/test_w4a4_gemv.py; ROUTES="tests/test_w4a4_gpu.py tests/test_w4a4_decode.py"
case "$MODE" in
  pdl)
    sanitize
    suites gpu_tests_1 $SK $GV $ROUTES; suites gpu_tests_2 $SK $GV; suites gpu_tests_3 $SK $GV
    probe shipped 4096x4096 4,8,16 "1,4,8"
    probe skinny_pdl_on 4096x4096 4,8,16 "1,4,8" LOWRANK_GEMM_SKINNY_PDL=1
    probe pdl_off 4096x4096 4,8,16 "1,4,8" LOWRANK_GEMM_PDL=0;;
  sweep)
    suites gpu_tests $SK
    probe n28k 28672x4096 1,4,8,16,32,64 "1,4,8;1,4,4,2;4,1,2,2;4,1,4;2,1,4,2;2,1,8,2;8,1,2,2;4,1,4,2"
    probe n4k 4096x4096,4096x14336 1,2,4,8,16,32 "1,4,8;1,4,4;1,8,2;1,8,4;1,4,4,2"
    for cfg in ${NCU_CFGS:-1,4,8 4,1,2,2}; do
      LOWRANK_GEMM_SKINNY_CONFIG=$cfg timeout 120 ncu --clock-control none --set full -k regex:skinny -s 1 -c 1 \
          python3 scripts/_ncu_decode.py skinny 16 > "$L/ncu_skinny_${cfg//,/_}.txt" 2>&1
      say "ncu $cfg rc=$?: $(grep -E "^\s+Duration|DRAM Throughput|L1/TEX Cache Throughput|Registers Per|Achieved \
Occupancy|Issue Slots Busy" "$L/ncu_skinny_${cfg//,/_}.txt" | tr -s ' ' | tr '\n' ';')"
    done;;
  final)
    sanitize
    suites gpu_tests $SK $GV $ROUTES
    probe n4k 4096x4096,4096x14336 1,2,3,4,8,16,24,32 "1,4,8;1,4,4,2;1,4,4;1,8,4"
    probe n28k 28672x4096 4,16 "1,4,4,2;2,1,8,2;2,1,4,2";;
  variants)
    SANITIZE_FMTS="skinny gemv" sanitize
    suites gpu_tests $SK $GV
    timeout 150 python3 scripts/probe_gemv.py --two-level --ms 1,2 --out "$L/gemv_2l" > "$L/gemv_2l.log" 2>&1
    say "probe gemv_2l rc=$?"; grep "^|" "$L/gemv_2l.log" | cut -d'|' -f2-6 | tee -a "$L/summary.txt"
    probe n28k 28672x4096 4,16,32,64 \
        "4,1,2,2;4,1,2,2+l16;4,1,2+l16;2,1,2,2+l16;2,1,1,2/32+l16;4,1,1/64+l16;2,1,1/64+l16;1,4,2/64;2,2,2/64;4,1,2/64"
    probe n4k 4096x4096,4096x14336 16,32,48,64 \
        "1,4,4,2;2,2,4,2;1,4,2/32;1,4,2/64;2,2,2/32;2,2,2/64;2,1,2,2+l16;2,1,1,2/32+l16;2,1,1/64+l16";;
  quick)
    suites gpu_tests $SK $GV
    probe n4k 4096x4096,4096x14336 2,3,4,8,16,24,32 "1,4,8;1,4,4,2";;
  *) say "unknown MODE=$MODE (pdl | sweep | final | quick | variants)"; exit 2;;
esac
tar czf "$OUT/skinny_$MODE.tgz" -C "$OUT" "skinny_$MODE"
