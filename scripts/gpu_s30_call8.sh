#!/usr/bin/env bash
# Session 30, call 8: the four-producer decode plans' K pipeline (tile depth × stages) with S as words — session 29
# found its best bare GEMM on 128-deep 8-stage tiles; the table's plans are 256-deep with 5 stages.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s30_call8.sh → $OUT/s30_call8/{summary.txt,probe.log,probe/}
source "$(dirname "$0")/_device_prelude.sh" s30_call8
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 240 python3 scripts/probe_s_words.py --out "$L/probe" \
    --edits "k128s6:block_k=128,num_stages=6;k128s8:block_k=128,num_stages=8;k128s10:block_k=128,num_stages=10;k64s12:block_k=64,num_stages=12;bn128:block_n=128,block_k=128,num_stages=5" \
    --points 1:8192:8192:16,16:8192:8192:16,1:4096:4096:16,16:4096:4096:16 > "$L/probe.log" 2>&1
say "probe rc=$?"
python3 scripts/_s_words_summary.py "$L/probe/s_words.json" | tee -a "$L/summary.txt"
