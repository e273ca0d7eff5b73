#!/usr/bin/env bash
# Session 29, on the two-GPU machine (kind nvidia-h200-x2): tensor parallelism over NCCL for the first time — the
# two-GPU test of nn.parallel (tests/test_parallel.py), then `bench tp` (MLP 4096→14336→4096 with LoRA r16, one GPU
# against two).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s29_tp.sh → $OUT/s29_tp/{summary.txt,test.log,bench.log,tp.{json,md}}
source "$(dirname "$0")/_device_prelude.sh" s29_tp
# NVLink multicast stays off (the device notes: it can take the host's GPUs out of service)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)"
timeout 150 python3 -m pytest -q -m gpu tests/test_parallel.py -p no:cacheprovider -rf > "$L/test.log" 2>&1
say "parallel tests rc=$? $(tail -1 "$L/test.log")"
timeout 300 python3 -m lowrank_gemm bench tp --out "$L" --timeout-s 280 > "$L/bench.log" 2>&1
say "bench tp rc=$?"
grep -E "Error|error" "$L/bench.log" | head -5 | tee -a "$L/summary.txt"
cat "$L/tp.md" 2>/dev/null
cat "$L/summary.txt"
