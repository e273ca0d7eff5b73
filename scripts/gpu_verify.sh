#!/usr/bin/env bash
# Device run: prove the Gluon kernels with the child-process ladders first, then the GPU pytest suites (the
# Gluon suites only if every ladder rung passed), then any extra commands in $EXTRA. Logs → $OUT/logs.tgz.
#   LOWRANK_GEMM_COMMIT=$(git rev-parse --short HEAD) bash scripts/gpu_verify.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; L=$OUT/logs; mkdir -p "$L"
log() { echo "[$(date +%T)] $*" | tee -a "$L/session.log"; }
log "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) commit=${LOWRANK_GEMM_COMMIT:-?}"
ok=1
if [ -z "${SKIP_LADDERS:-}" ]; then
  timeout 240 python3 scripts/bisect_gluon.py --rungs "${RUNGS:-r3,r4,r5,r6,r7,r8,r9,r11,r12}" --no-time --timeout 40 \
      --budget 230 --out "$L/bisect" > "$L/ladder.log" 2>&1; log "ladder rc=$?"
  timeout 150 python3 scripts/probe_lora_v2.py --rungs c1,c2,c3,c4,c5 --no-time --timeout 40 --budget 140 \
      --out "$L/lv2" > "$L/lv2.log" 2>&1; log "lora v2 rungs rc=$?"
  tail -14 "$L/ladder.log" | tee -a "$L/session.log"; tail -8 "$L/lv2.log" | tee -a "$L/session.log"
  grep -qE "\| (FAIL|HANG) " "$L/ladder.log" "$L/lv2.log" && ok=0
fi
T="tests/test_int4_unpack.py tests/test_w4a4_gpu.py tests/test_act_quant.py tests/test_w4_expand.py
   tests/test_multilora_gpu.py tests/test_lora_gemm_gpu.py ${EXTRA_TESTS:-}"
[ $ok = 1 ] && T="$T tests/test_gluon_gpu.py tests/test_gluon_lora_gpu.py"
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -m gpu $T -n 8 --timeout=90 -p no:cacheprovider -W ignore -q -rf \
      > "$L/gpu_tests.log" 2>&1; log "pytest rc=$? (gluon suites included: $ok)"
  tail -15 "$L/gpu_tests.log" | tee -a "$L/session.log"
fi
if [ -n "${EXTRA:-}" ]; then log "extra: $EXTRA"; bash -c "$EXTRA" >> "$L/extra.log" 2>&1; log "extra rc=$?"; fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs
