#!/usr/bin/env bash
# Session 31, call 4: two concurrent streams first seen 16 apart (the ticket-region test) at this tree and at the
# session's start (s31_old/src, d809f1b: round-robin regions), then the whole GPU suite on this tree.
# s31_old: mkdir s31_old && git archive d809f1b src | tar -x -C s31_old (untracked, not committed)
source "$(dirname "$0")/_device_prelude.sh" s31_regions
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
K="fixup_concurrent or outside_graph_pools"
timeout 90 python3 -m pytest -q -m gpu tests/test_lora_gemm_gpu.py tests/test_persistent.py -k "$K" -p no:cacheprovider -rf \
    > "$L/head.log" 2>&1
say "head rc=$? $(tail -1 "$L/head.log")"; grep -E "^FAILED|^E  " "$L/head.log" | head -6 | tee -a "$L/summary.txt"
PYTHONPATH=$PWD/s31_old/src timeout 90 python3 -m pytest -q -m gpu tests/test_lora_gemm_gpu.py -k "fixup_concurrent" \
    -p no:cacheprovider -rf > "$L/old.log" 2>&1
say "d809f1b rc=$? $(tail -1 "$L/old.log")"; grep -E "^FAILED|^E  " "$L/old.log" | head -8 | tee -a "$L/summary.txt"
TEST_TIMEOUT=${TEST_TIMEOUT:-330} bash scripts/gpu_session.sh
