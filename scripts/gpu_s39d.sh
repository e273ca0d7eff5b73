#!/usr/bin/env bash
# Session 39's fourth device call (≤ 120 s): scripts/probe_act_quant_f16.py --ab at M = 24 / 48 / 64 — the quant unit's
# width (quant_cols 1024 / 2048 / 4096), act_quant without the branch (r = 0: the S programs' share), the layer with
# PDL off (the packed chain's ~20 µs surplus), the GEMM op on packed operands (fp16 route vs v2).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s39d.sh → $OUT/s39d/…
source "$(dirname "$0")/_device_prelude.sh" s39d
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
timeout 100 python3 scripts/probe_act_quant_f16.py --ab --out "$L" \
    --cases 24x4096x28672,48x4096x28672,64x4096x28672 > "$L/probe.log" 2>&1
say "probe_act_quant_f16 --ab rc=$?"
grep -E "^ROW|FAIL|Error" "$L/probe.log" | sed 's/^ROW //' >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" probe.log && rm -f "$L/probe.log"
