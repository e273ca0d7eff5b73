#!/usr/bin/env bash
# Session 38's device call (≤ 600 s), most important first:
# 1. the int4_g64 decode kernel's new fp16 path (exact fp16 operands, no per-group rescale; never GPU-run): its
#    suite (the other decode paths' PTX is unchanged, compared on the CPU), then probe_decode_f16 (GEMM and layer,
#    M = 16 / 32 / 64; ≤ 400 s in all: the session's device time is short);
# 2. the unsigned v3 quantizer at 4 CTAs per SM (db54990, never GPU-run): its suite, probe_unsigned at FLUX fc2 and
#    M = 64;
# 3. session 35's residual accumulator (1d1b564 applied to this tree's src in _ab/loacc) against this tree:
#    `bench lora --fp8` at decode, trees alternated.
#   mkdir -p _ab/loacc && git archive HEAD src | tar -x -C _ab/loacc && (cd _ab/loacc && git show 1d1b564 -- src | patch -p1)
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s38.sh    (run with carry: ["_ab"]) → $OUT/s38/…
source "$(dirname "$0")/_device_prelude.sh" s38
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 130 14 tests/test_w4a4_decode_f16.py tests/test_w4a4_unsigned.py
timeout 130 python3 scripts/probe_decode_f16.py --out "$L/f16" --cases 16x4096x28672,32x4096x28672,64x4096x28672 \
    > "$L/f16.log" 2>&1
say "probe_decode_f16 rc=$?"; grep -E "^ROW|FAIL|Error" "$L/f16.log" >> "$L/summary.txt"
timeout 50 python3 scripts/probe_unsigned.py --out "$L/unsigned" --cases 4608x12288x3072,64x4096x28672 \
    > "$L/unsigned.log" 2>&1
say "unsigned rc=$?"; grep -E "^ROW|FAIL" "$L/unsigned.log" >> "$L/summary.txt"
for tree in head loacc; do
  pp=$PWD/src; [[ $tree == loacc* ]] && pp=$PWD/_ab/loacc/src
  PYTHONPATH=$pp timeout 50 python3 -m lowrank_gemm bench lora --fp8 --kn 4096x28672,4096x4096 --ranks 16 \
      --ms 1,16,64 --only cublas_base,auto_w8a8,auto_w8a8x2 --name lora_fp8_decode_$tree --out "$L/results" \
      > "$L/bench_$tree.log" 2>&1
  say "bench $tree rc=$?"; grep -E "auto_w8a8|cublas" "$L/bench_$tree.log" | grep graph | sed "s/^/$tree /" >> "$L/summary.txt"
done
tar czf "$L/logs.tar.gz" -C "$L" $(cd "$L" && ls *.log) && (cd "$L" && rm -f *.log)
