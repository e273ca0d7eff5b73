#!/usr/bin/env bash
# Session 20, device call 4 (short): the M ≤ 64 kloop at rank 64 on 64×32×128 (was ×256, 2 stages) on untuned
# shapes, where `auto` now differs from the old rules' plan (`k_32`); and the M=256 points of call 3 whose rows did
# not come back (2048², 4096→1024), so the table's re-pins replay from saved rows.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s20_call4.sh → $OUT/{session.log,probes.tar.gz}
PROBE_DIR=probes
source "$(dirname "$0")/_probe_unseen.sh"
probe m64_r64 3072x3072,5120x4096,2048x4096 64 50
probe m256_repin 2048x2048,4096x1024 256 35
tar czf "$OUT/probes.tar.gz" -C "$OUT" probes && rm -rf "$OUT/probes"
log done
