#!/usr/bin/env bash
# Session 38's first device call (≤ 600 s), most important first: the unsigned v3 quantizer at 4 CTAs per SM (db54990,
# never GPU-run: its suite, then probe_unsigned at FLUX fc2 and M = 64), then session 35's two-term fp8 x with the
# residual's own accumulator on the swapped decode tiles — 1d1b564 applied to this tree's src in _ab/loacc — A/B
# against this tree: its GPU suites, `bench lora --fp8` at decode and the multi-LoRA fp8 decode cells, trees
# alternated.
#   mkdir -p _ab/loacc && git archive HEAD src | tar -x -C _ab/loacc && (cd _ab/loacc && git show 1d1b564 -- src | patch -p1)
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s38.sh    (run with carry: ["_ab"]) → $OUT/s38/…
source "$(dirname "$0")/_device_prelude.sh" s38
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 150 14 tests/test_w4a4_unsigned.py
timeout 70 python3 scripts/probe_unsigned.py --out "$L/unsigned" --cases 4608x12288x3072,64x4096x28672 \
    > "$L/unsigned.log" 2>&1
say "unsigned rc=$?"; grep -E "^ROW|FAIL" "$L/unsigned.log" >> "$L/summary.txt"
PYTHONPATH=$PWD/_ab/loacc/src timeout 170 python3 -m pytest -m gpu tests/test_lora_fp8_weight.py \
    tests/test_multilora_fp8.py -q -n 14 --timeout=150 -p no:cacheprovider -rf > "$L/tests_loacc.log" 2>&1
say "loacc tests rc=$? $(tail -1 "$L/tests_loacc.log")"; grep -E "^FAILED|^ERROR" "$L/tests_loacc.log" | head >> "$L/summary.txt"
for tree in head loacc head2 loacc2; do
  pp=$PWD/src; [[ $tree == loacc* ]] && pp=$PWD/_ab/loacc/src
  PYTHONPATH=$pp timeout 60 python3 -m lowrank_gemm bench lora --fp8 --kn 4096x28672,4096x4096 --ranks 16 \
      --ms 1,16,64 --only cublas_base,auto_w8a8,auto_w8a8x2 --name lora_fp8_decode_$tree --out "$L/results" \
      > "$L/bench_$tree.log" 2>&1
  say "bench $tree rc=$?"; grep -E "auto_w8a8|cublas" "$L/bench_$tree.log" | grep graph | sed "s/^/$tree /" >> "$L/summary.txt"
  [[ $tree == *2 ]] && continue
  PYTHONPATH=$pp timeout 70 python3 scripts/probe_multilora_fp8.py --out "$L/results_ml_$tree" \
      --cases 1x28672x4096x4,16x28672x4096x16,64x28672x4096x16 > "$L/probe_ml_$tree.log" 2>&1
  say "multilora fp8 $tree rc=$?"
  grep -E "^ROW|^SKIP" "$L/probe_ml_$tree.log" | grep -E "w8a8|cublas" | cut -c1-200 | sed "s/^/$tree /" >> "$L/summary.txt"
done
tar czf "$L/logs.tar.gz" -C "$L" $(cd "$L" && ls *.log) && (cd "$L" && rm -f *.log)
