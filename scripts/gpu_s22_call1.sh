#!/usr/bin/env bash
# Session 22, device call 1: the session-21 commits that ran on the CPU only, and the 8192² M = 64 r64 pin lead.
#   1. multi-LoRA GPU tests (Gluon-bucket routing 0a9c626, the module's AdapterBank d768985, bank alignment 7353ace,
#      the slot-0 B pointer 94f85c7) and the single-adapter LoRA GPU tests (the bank arguments' kernels);
#   2. bench lora at 8192², M = 64, r64: auto (kloop) next to persistent_static / kloop / split, same process.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s22_call1.sh → $OUT/{session.log,gpu_tests.log,lora8192.tar.gz}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TEST_TIMEOUT=260 bash scripts/gpu_session.sh --tests "tests/test_multilora_gpu.py tests/test_lora_gemm_gpu.py"
rm -f "$OUT/results.tar.gz"
mkdir -p "$OUT/lora8192"
timeout 150 python3 -m lowrank_gemm bench lora --kn 8192x8192 --ms 64 --ranks 64 \
    --only cublas_base,auto,kloop,split,persistent_static --out "$OUT/lora8192" > "$OUT/lora8192/bench.log" 2>&1
echo "bench lora 8192 rc=$?" >> "$OUT/session.log"
tar czf "$OUT/lora8192.tar.gz" -C "$OUT" lora8192 && rm -rf "$OUT/lora8192"
