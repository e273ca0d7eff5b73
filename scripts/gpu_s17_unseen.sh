#!/usr/bin/env bash
# Session 17, device call 2: how `auto` does on LoRA shapes it was never tuned on (PEFT on Llama-3-8B:
# k/v 4096→1024, gate/up 4096→14336, down 14336→4096; vLLM's fused qkv 4096→6144), next to cuBLAS and
# torch's unfused branch in one process; and which kernels cuBLAS runs at every shape (tile, cluster, split).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s17_unseen.sh → $OUT/{session.log,cublas_kernels.*,unseen.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/session.log"; }
log "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)"
timeout 120 python3 scripts/probe_cublas_kernels.py --out "$OUT" > "$OUT/cublas.log" 2>&1; log "cublas rc=$?"
timeout 330 python3 -m lowrank_gemm bench lora --kn 4096x1024,4096x14336,14336x4096,4096x6144 \
    --only cublas_base,torch_unfused,auto --out "$OUT/unseen" > "$OUT/unseen.log" 2>&1; log "unseen rc=$?"
tail -3 "$OUT/unseen.log" >> "$OUT/session.log"
tar czf "$OUT/unseen.tar.gz" -C "$OUT" unseen && rm -rf "$OUT/unseen"
log done
