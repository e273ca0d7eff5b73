#!/usr/bin/env bash
# Session 28: the GPU tests of this session's changes — the multi-LoRA file (the 8-warp shrink pin) and the
# four-consumer W4A4 kernel's cases (late release), under the watchdog.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s28_tests.sh → $OUT/s28t/{summary.txt,multilora.log,quad.log}
source "$(dirname "$0")/_device_prelude.sh" s28t
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 200 python3 -m pytest -q -m gpu tests/test_multilora_gpu.py -n 8 -p no:cacheprovider -rf > "$L/multilora.log" 2>&1
say "multilora tests rc=$? $(tail -1 "$L/multilora.log")"
timeout 150 python3 -m pytest -q -m gpu tests/test_gluon_gpu.py -k quad -n 4 -p no:cacheprovider -rf > "$L/quad.log" 2>&1
say "quad tests rc=$? $(tail -1 "$L/quad.log")"
grep -hE "^FAILED|Timeout" "$L/multilora.log" "$L/quad.log" | head -10 | tee -a "$L/summary.txt"
