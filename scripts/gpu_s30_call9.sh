#!/usr/bin/env bash
# Session 30, call 9: the 4096² M = 64 cells (auto = kloop on 64×32 tiles, 1.12–1.24× cuBLAS) as split with in-grid
# S producers — S as words where the epilogue holds the S rows (swap-AB tiles, or prefetch) — and 8192² M = 64 r16.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s30_call9.sh → $OUT/s30_call9/{summary.txt,probe.log,probe/}
source "$(dirname "$0")/_device_prelude.sh" s30_call9
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
EDITS="p4:s_producers=4;p4pf:s_producers=4,prefetch=true;p2pf:s_producers=2,prefetch=true"
EDITS+=";p4swap:s_producers=4,swap_ab=true,block_n=64,num_stages=3"
EDITS+=";p4swap128:s_producers=4,swap_ab=true,block_n=64,block_k=128,num_stages=6"
timeout 240 python3 scripts/probe_s_words.py --out "$L/probe" --edits "$EDITS" \
    --points 64:4096:4096:16,64:4096:4096:8,64:4096:4096:64,64:8192:8192:16 > "$L/probe.log" 2>&1
say "probe rc=$?"
python3 scripts/_s_words_summary.py "$L/probe/s_words.json" | tee -a "$L/summary.txt"
