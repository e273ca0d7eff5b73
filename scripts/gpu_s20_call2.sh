#!/usr/bin/env bash
# Session 20, device call 2: planner.entry_serves and one_wave_kloop_tile's K = 8192 case on shapes they were not
# derived from (call 1 measured the grid shapes):
#   1. probe_lora_unseen.py --rule: `auto` (the new planner) beside `rule` (table hidden), `entry` (the bucket's tuned
#      entry: what auto ran before) and every family — tuned non-grid shapes at M between buckets, and the
#      shapes where the kloop rule changed (K > 4096, a full wave of 64×128 tiles);
#      plus persistent_static on one wave of 64-row tiles (ps_64x128 / ps_64x64, new candidates) at M 256 / 128;
#   2. LoRA GPU tests.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s20_call2.sh → $OUT/{session.log,gpu_tests.log,heldout.tar.gz}
PROBE_DIR=heldout
source "$(dirname "$0")/_probe_unseen.sh"
probe ps64 4096x4096,4096x2048 256,128 55
probe ps64_8k 8192x8192 128 15
probe m512 4096x6144,4096x14336,14336x4096 512 55
probe kloop8k 5120x5120,14336x4096 192 35
probe m96 8192x8192 96 15
probe m128 4096x1024,4096x2048 128 30
probe m256 14336x4096 256 15
tar czf "$OUT/heldout.tar.gz" -C "$OUT" heldout && rm -rf "$OUT/heldout"
TEST_TIMEOUT=170 bash scripts/gpu_session.sh --tests "tests/test_lora_gemm_gpu.py"
rm -f "$OUT/results.tar.gz"
log done
