#!/usr/bin/env bash
# Session 37's one device call (device starts kept failing: session 36's two queued calls folded into one, most
# important first, ≤ 600 s): the GPU suites session 36–37 touched (the unsigned codes in act_quant v3 included), the
# unsigned layer beside the signed one for this tree and OLD_UNSIGNED's (the one-pass quantizer it replaced), the eager
# host A/B of the Gluon plan caches against OLD's src, then the W8A16 multi-LoRA prefill tiles.
#   mkdir -p _ab/$OLD _ab/$OLD_UNSIGNED && git archive … | tar -x -C _ab/…        (run with carry: ["_ab"])
#   LOWRANK_GEMM_COMMIT=<hash> OLD=eaa7911 OLD_UNSIGNED=179e299 bash scripts/gpu_s37.sh → $OUT/s37/…
source "$(dirname "$0")/_device_prelude.sh" s37
say "commit=${LOWRANK_GEMM_COMMIT:-?} old=${OLD:?} old_unsigned=${OLD_UNSIGNED:?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 200 14 tests/test_w4a4_unsigned.py tests/test_gluon_gpu.py tests/test_w4a4_decode.py tests/test_launch.py \
    tests/test_row_quant.py tests/test_lora_kcat.py tests/test_multilora_fp8.py tests/test_lora_fp8_weight.py \
    tests/test_multilora_gpu.py tests/test_w4a4_gpu.py tests/test_act_quant.py
for tree in new old; do
  pp=$PWD/src; [ $tree = old ] && pp=$PWD/_ab/$OLD_UNSIGNED/src
  PYTHONPATH=$pp timeout 80 python3 scripts/probe_unsigned.py --out "$L/unsigned_$tree" > "$L/unsigned_$tree.log" 2>&1
  say "unsigned $tree rc=$?"; grep -E "^ROW|FAIL" "$L/unsigned_$tree.log" | sed "s/^/$tree /" >> "$L/summary.txt"
done
OPS=cublas_4096,lora,lora_w8a8,w4a4_g64,w4a4_g64_m16,w4a4_g64_flux,multilora
for rep in 1 2; do
  for tree in old new; do
    src=$PWD/src; [ $tree = old ] && src=$PWD/_ab/$OLD/src
    PROBE_SRC=$src timeout 60 python3 scripts/probe_host.py --no-profile --calls 300 --ops $OPS --out "$L/$tree$rep" \
        > "$L/$tree$rep.log" 2>&1
    say "$tree rep $rep rc=$?: $(grep 'per call' "$L/$tree$rep/probe_host.txt" | sed 's/: host / /;s/ µs per call//' | tr '\n' ' ')"
  done
done
timeout 130 python3 scripts/probe_multilora_fp8.py --out "$L/ml_tiles" \
    --cases 256x28672x4096x16,1024x4096x4096x64,4096x4096x4096x64 \
    --w8a16-tiles 128x128x64w8,64x256x64w8,128x128x128w8,64x256x128w8 > "$L/ml_tiles.log" 2>&1
say "ml tiles rc=$?"; grep -E "^ROW|tile|SKIP" "$L/ml_tiles.log" >> "$L/summary.txt"
tar czf "$L/logs.tar.gz" -C "$L" $(cd "$L" && ls *.log) && (cd "$L" && rm -f *.log)
