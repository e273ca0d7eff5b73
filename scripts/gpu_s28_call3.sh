#!/usr/bin/env bash
# Session 28, call 3: the one issue-5 cell that ties shrink + expand (M = 256, N = 4096, 64 adapters of r16) —
# its tuned plan with single fields changed (probe_multilora_parts.py --edits), shrink + expand beside it.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s28_call3.sh → $OUT/s28c3/{summary.txt,probe/…}
source "$(dirname "$0")/_device_prelude.sh" s28c3
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
E="w8:shrink.num_warps=8;w2:shrink.num_warps=2;k64:shrink.block_k=64;k256:shrink.block_k=256;sk4:main.split_k=4"
E="$E;sk1:main.split_k=1;ad2:append_d=2;ad1:append_d=1;as2:append_stages=2;as4:append_stages=4"
E="$E;st4:main.num_stages=4;bn64:main.block_n=64;bn64sk1:main.block_n=64,main.split_k=1;mw4:main.num_warps=4"
E="$E;rowsel:append_rowsel=true;gm4:main.group_m=4"
timeout ${PROBE_TIMEOUT:-400} python3 scripts/probe_multilora_parts.py --out "$L/probe" --cases "${CASES:-256x4096x16x64}" \
    --edits "${EDITS:-$E}" > "$L/probe.log" 2>&1
say "probe rc=$?"
grep -E "WRONG|Error|error|rejects" "$L/probe.log" | head -8 | tee -a "$L/summary.txt"
cat "$L/probe/probe_multilora_parts.md" >> "$L/summary.txt" 2>/dev/null
cat "$L/summary.txt"
