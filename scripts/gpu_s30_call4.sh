#!/usr/bin/env bash
# Session 30, call 4: with s_words on by default — the multi-LoRA GPU tests, `bench multilora`, and whether the
# single-adapter cells tuned without S producers (r64 at 4096² / 8192², N = 28672) want them now.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s30_call4.sh → $OUT/s30_call4/{summary.txt,*.log,probe/,multilora.*}
source "$(dirname "$0")/_device_prelude.sh" s30_call4
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 100 python3 -m pytest -q -m gpu tests/test_multilora_gpu.py -n 8 -p no:cacheprovider -rf > "$L/tests.log" 2>&1
say "multi-LoRA GPU tests rc=$? $(tail -1 "$L/tests.log")"
timeout 120 python3 scripts/probe_s_words.py --out "$L/probe" --producers 2,4 \
    --points 1:4096:4096:64,16:4096:4096:64,1:8192:8192:64,16:8192:8192:64,1:4096:28672:16,16:4096:28672:16,1:4096:28672:64,16:4096:28672:64 \
    > "$L/probe.log" 2>&1
say "probe rc=$?"
timeout 260 python3 -m lowrank_gemm bench multilora --out "$L" > "$L/bench_multilora.log" 2>&1
say "bench multilora rc=$?"
grep -hE "^FAILED|Timeout|Error" "$L/tests.log" "$L/probe.log" | head -10 | tee -a "$L/summary.txt"
cut -c1-260 "$L/probe.log"
