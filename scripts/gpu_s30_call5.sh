#!/usr/bin/env bash
# Session 30, call 5: the three LoRA cells pinned to two S producers (s_words) — the tuned-plan and producer GPU
# tests, `bench lora` on those cells (cuBLAS and auto only), and a repeat of the 8192² r64 producer edit.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s30_call5.sh → $OUT/s30_call5/{summary.txt,*.log,lora_*/,probe/}
source "$(dirname "$0")/_device_prelude.sh" s30_call5
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 120 python3 -m pytest -q -m gpu tests/test_lora_gemm_gpu.py -k "tuned_plan or s_producers or s_words" -n 8 \
    -p no:cacheprovider -rf > "$L/tests.log" 2>&1
say "GPU tests rc=$? $(tail -1 "$L/tests.log")"
for kn in 4096x4096:1,16 4096x28672:1; do
  timeout 120 python3 -m lowrank_gemm bench lora --kn "${kn%%:*}" --ms "${kn##*:}" --ranks 64 --only cublas_base,auto \
      --out "$L/lora_${kn%%:*}" > "$L/bench_${kn%%:*}.log" 2>&1
  say "bench lora $kn rc=$?"; grep -E "^\| [0-9]+ .*auto" "$L/lora_${kn%%:*}/lora.md" | tee -a "$L/summary.txt"
done
timeout 100 python3 scripts/probe_s_words.py --out "$L/probe" --producers 2 --points 1:8192:8192:64,16:8192:8192:64 \
    > "$L/probe.log" 2>&1
say "probe rc=$?"
grep -hE "^FAILED|Timeout|Error" "$L/tests.log" "$L/probe.log" | head -10 | tee -a "$L/summary.txt"
cut -c1-200 "$L/probe.log"
