#!/usr/bin/env bash
# Session 20, device call 3: the tree with planner.one_wave_persistent_tile and the six re-pinned M=256 entries.
#   1. probe_lora_unseen.py --rule on held-out shapes for the persistent 64-row rule (never probed with it):
#      4096→3072, 3072→4096, 2048², 4096→1024, 8192→1024 at M=256; 3584² at M=160;
#   2. the same probe at M=64 on the grid's 4096² / 8192² and 4096→6144 with persistent 64-row candidates (S once
#      instead of once per N tile) — can the one-wave persistent plan serve the decode bucket too?
#   3. `bench lora --only cublas_base,torch_unfused,auto` on the grid (→ grid.tar.gz);
#   4. LoRA GPU tests (every tuned plan at its bucket, the new entries included).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s20_call3.sh → $OUT/{session.log,gpu_tests.log,probes.tar.gz,grid.tar.gz}
PROBE_DIR=probes
source "$(dirname "$0")/_probe_unseen.sh"
mkdir -p "$OUT/grid"
probe ps_heldout 4096x3072,3072x4096,2048x2048,4096x1024,8192x1024 256 60
probe ps_m160 3584x3584 160 10
probe ps_m64 4096x4096,8192x8192,4096x6144 64 40
tar czf "$OUT/probes.tar.gz" -C "$OUT" probes && rm -rf "$OUT/probes"
timeout 170 python3 -m lowrank_gemm bench lora --only cublas_base,torch_unfused,auto --out "$OUT/grid" \
    > "$OUT/grid/bench.log" 2>&1
log "grid rc=$?"
tar czf "$OUT/grid.tar.gz" -C "$OUT" grid && rm -rf "$OUT/grid"
TEST_TIMEOUT=160 bash scripts/gpu_session.sh --tests "tests/test_lora_gemm_gpu.py"
rm -f "$OUT/results.tar.gz"
log done
