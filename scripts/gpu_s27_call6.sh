#!/usr/bin/env bash
# Session 27, call 6: the shrink launch by row (plan shrink_rows) under each case's routed plan — its GPU tests, then
# probe_multilora_parts.py --shrink-rows on the many-adapter cells (ncu, call 3: the block shrink alone 13.9 µs at
# M = 256, 64 adapters).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s27_call6.sh → $OUT/s27c6/{summary.txt,tests.log,probe/…}
source "$(dirname "$0")/_device_prelude.sh" s27c6
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 150 python3 -m pytest -q -m gpu tests/test_multilora_gpu.py -k "shrink_by_row" -p no:cacheprovider > "$L/tests.log" 2>&1
say "tests rc=$? $(tail -1 "$L/tests.log")"
timeout 240 python3 scripts/probe_multilora_parts.py --out "$L/probe" --shrink-rows 2,4,8 \
    --cases ${CASES:-256x4096x16x64,256x4096x16x16,256x4096x64x64,64x4096x16x64,64x4096x16x16,256x28672x16x64,64x28672x16x64,64x28672x64x16,16x4096x16x16} \
    > "$L/probe.log" 2>&1
say "probe rc=$?"; grep -E "WRONG|Error" "$L/probe.log" | head -5 | tee -a "$L/summary.txt"
