#!/usr/bin/env bash
# Session 47, device calls 1–2 (≤ 420 s), any GPU: expand="pre" (the branch by its own launch between the shrink and
# the main kernel, PDL-chained) — its GPU tests, then `probe_multilora_parts.py --edits` on the issue-5 cells of the
# 1.10× target (M ≤ 64, ≤ 16 adapters) against today's plans; winners are pinned on the CPU.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s47.sh → $OUT/s47/
source "$(dirname "$0")/_device_prelude.sh" s47
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
gpu_tests 150 8 tests/test_multilora_gpu.py -k "pre_expand or matches_reference_bf16 or pdl"
gzip -f "$L/tests.log"
P="fuse_d=0,s_unroll=true,expand=pre"
timeout 260 python3 scripts/probe_multilora_parts.py --out "$L/ml" \
    --cases 64x4096x16x16,64x4096x16x4,64x4096x64x16,64x4096x64x4,64x4096x64x1,16x4096x16x16,16x4096x64x16,16x4096x64x4,64x28672x16x16,64x28672x64x16,16x28672x16x16,64x28672x64x4 \
    --edits "pre:$P;pre_m16:$P,pre_bm=16;pre_m32n64:$P,pre_bm=32,pre_bn=64;pre_n256:$P,pre_bn=256,pre_bm=16" > "$L/ml.log" 2>&1
say "probe_multilora_parts --edits pre rc=$?"
grep -E "µs|WRONG|rejects|Error" "$L/ml.log" | head -150 >> "$L/summary.txt"
gzip -f "$L/ml.log"
