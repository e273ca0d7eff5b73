#!/usr/bin/env bash
# Session 20, device call 1: does a tuned LoRA entry serve the M between buckets well?
#   1. probe_lora_unseen.py --rule on the issue-2 grid shapes at M between the table's buckets (1, 16, 64, 256,
#      1024, 4096): `auto` (the bucket's entry) next to `rule` (the table hidden) and every plan family, one process;
#   2. `bench lora --only cublas_base,torch_unfused,auto` on the grid (where the canonical s16 table stands today).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s20_call1.sh → $OUT/{session.log,offbucket.tar.gz,grid.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/session.log"; }
log "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)"
timeout 300 python3 scripts/probe_lora_unseen.py --out "$OUT/offbucket" --budget-s 270 --rule \
    --kn 4096x4096,4096x28672,8192x8192 --ms 128,512,2048,192,768 --ranks 16,64 > "$OUT/offbucket.log" 2>&1
log "offbucket rc=$?"
tar czf "$OUT/offbucket.tar.gz" -C "$OUT" offbucket offbucket.log && rm -rf "$OUT/offbucket"
mkdir -p "$OUT/grid"
timeout 200 python3 -m lowrank_gemm bench lora --only cublas_base,torch_unfused,auto --out "$OUT/grid" \
    > "$OUT/grid/bench.log" 2>&1
log "grid rc=$?"
tar czf "$OUT/grid.tar.gz" -C "$OUT" grid && rm -rf "$OUT/grid"
log done
