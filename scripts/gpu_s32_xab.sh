#!/usr/bin/env bash
# Session 32, device call 3: the f8 decode path's xab table in shared memory — GPU tests of the decode kernel and
# the W4A4 layer, the A/B probe (epilogue loop / wgmma × xab L2 / SMEM, same process), then `bench w4a4 --only
# decode` (the canonical decode table, w4a4_decode.*). The probe also A/Bs the row box and the skinny GEMM's
# opt-in mma epilogue. (Session 33 added the GPU case of the Nunchaku checkpoint import, tests/test_nunchaku.py.)
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s32_xab.sh → $OUT/s32_xab/…
source "$(dirname "$0")/_device_prelude.sh" s32_xab
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 200 14 tests/test_w4a4_decode.py tests/test_w4a4_gpu.py tests/test_w4a4_gemm.py \
    tests/test_w4a4_gemv.py tests/test_w4a4_skinny.py tests/test_nunchaku.py
timeout 240 python3 scripts/probe_decode_epi.py --out "$L" > "$L/probe.log" 2>&1
say "probe rc=$?"
grep "^ROW" "$L/probe.log" | cut -c5- >> "$L/summary.txt"
timeout 300 python3 -m lowrank_gemm bench w4a4 --only decode --out "$L/results" > "$L/bench.log" 2>&1
say "bench rc=$?"
tail -3 "$L/bench.log" >> "$L/summary.txt"
# ≤ 8 files come back: the logs travel as one archive
tar czf "$L/logs.tar.gz" -C "$L" tests.log probe.log bench.log && rm -f "$L/tests.log" "$L/probe.log" "$L/bench.log"
