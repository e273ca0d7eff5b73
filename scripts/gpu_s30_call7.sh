#!/usr/bin/env bash
# Session 30, call 7: fewer S producers (1, 2) on the tuned four-producer decode plans now that S comes as words
# (call 4 found two better than four at r64) — 8192² and 4096², r16, M = 1 / 16, paired against cuBLAS.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s30_call7.sh → $OUT/s30_call7/{summary.txt,probe.log,probe/}
source "$(dirname "$0")/_device_prelude.sh" s30_call7
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 200 python3 scripts/probe_s_words.py --out "$L/probe" --producers 1,2 \
    --points 1:8192:8192:16,16:8192:8192:16,1:4096:4096:16,16:4096:4096:16 > "$L/probe.log" 2>&1
say "probe rc=$?"
python3 scripts/_s_words_summary.py "$L/probe/s_words.json" | tee -a "$L/summary.txt"
