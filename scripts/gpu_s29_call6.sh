#!/usr/bin/env bash
# Session 29, device call 6: (1) LoRA at 4096² decode M on today's 64-row swap tiles with 0/2/4/8 in-grid S producers
# (probe_lora_narrow_swap.py --wide, paired against cuBLAS); (2) single-field edits of the four N = 28672 multi-LoRA
# cells nearest the 1.10× line (gpu_plan_edits.sh's probe).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s29_call6.sh → $OUT/s29_call6/{summary.txt,wide.log,edits.log,…}
source "$(dirname "$0")/_device_prelude.sh" s29_call6
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 200 python3 scripts/probe_lora_narrow_swap.py --wide --out "$L/wide" \
    --points 1:4096:4096:8,1:4096:4096:16,1:4096:4096:64,16:4096:4096:8,16:4096:4096:16,16:4096:4096:64 \
    > "$L/wide.log" 2>&1
say "wide rc=$?"
E="sw2:shrink.num_warps=2;sw8:shrink.num_warps=8;sk64:shrink.block_k=64;sk256:shrink.block_k=256"
E="$E;ms4:main.num_stages=4;ms6:main.num_stages=6;mk128:main.block_k=128;ad2:append_d=2;ad4:append_d=4"
E="$E;as4:append_stages=4;gm1:main.group_m=1;rows8:shrink_rows=true,shrink.split_k=4,shrink.num_warps=8"
timeout 300 python3 scripts/probe_multilora_parts.py --out "$L/edits" \
    --cases 64x28672x64x4,16x28672x64x4,64x28672x16x16,16x28672x16x16 --edits "$E" > "$L/edits.log" 2>&1
say "edits rc=$?"
grep -E "WRONG|Error|error|rejects" "$L/edits.log" | head -8 | tee -a "$L/summary.txt"
cat "$L/edits/probe_multilora_parts.md" >> "$L/summary.txt" 2>/dev/null
cat "$L/summary.txt"
