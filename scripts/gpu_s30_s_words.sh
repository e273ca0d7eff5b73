#!/usr/bin/env bash
# For the next session (written in session 29, not yet run): LoraOptions.s_words on the GPU — the S-producer GPU
# tests of the LoRA and multi-LoRA files with the option on, then the A/B probe (auto with it off / on against
# cuBLAS, paired). If it holds (bit-identical, faster), make it the default in LoraOptions and rerun `bench lora`.
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s30_s_words.sh → $OUT/s30_words/{summary.txt,*.log,probe/}
source "$(dirname "$0")/_device_prelude.sh" s30_words
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 170 env LOWRANK_GEMM_LORA_OPTIONS=pdl,s_words python3 -m pytest -q -m gpu tests/test_lora_gemm_gpu.py \
    tests/test_multilora_gpu.py -n 8 -p no:cacheprovider -rf > "$L/tests.log" 2>&1
say "GPU tests with s_words rc=$? $(tail -1 "$L/tests.log")"
timeout 200 python3 scripts/probe_s_words.py --out "$L/probe" > "$L/probe.log" 2>&1
say "probe rc=$?"
grep -hE "^FAILED|Timeout|Error" "$L/tests.log" "$L/probe.log" | head -10 | tee -a "$L/summary.txt"
cat "$L/probe.log"
