#!/usr/bin/env bash
# Session 36's first queued device call (written while loans were paused): the GPU suites of what session 36 changed
# (the Gluon plan caches, fp8_rows / build_xcat / the bgmv baselines through kernels.launch, the unsigned activations),
# then the eager host time of this tree against OLD's src on one host (alternating processes). ~7 minutes; the
# probes are scripts/gpu_s36_probes.sh.
#   mkdir -p _ab/$OLD && git archive $OLD src | tar -x -C _ab/$OLD        (run with carry: ["_ab"])
#   LOWRANK_GEMM_COMMIT=<hash> OLD=eaa7911 bash scripts/gpu_s36_first.sh → $OUT/s36_first/…
source "$(dirname "$0")/_device_prelude.sh" s36_first
say "commit=${LOWRANK_GEMM_COMMIT:-?} old=${OLD:?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
gpu_tests 240 14 tests/test_gluon_gpu.py tests/test_w4a4_decode.py tests/test_launch.py tests/test_row_quant.py \
    tests/test_lora_kcat.py tests/test_multilora_fp8.py tests/test_lora_fp8_weight.py tests/test_multilora_gpu.py \
    tests/test_w4a4_unsigned.py tests/test_w4a4_gpu.py tests/test_parallel.py
OPS=cublas_4096,lora,lora_w8a8,w4a4_g64,w4a4_g64_m16,w4a4_g64_flux,multilora
for rep in 1 2 3; do
  for tree in old new; do
    src=$PWD/src; [ $tree = old ] && src=$PWD/_ab/$OLD/src
    PROBE_SRC=$src timeout 90 python3 scripts/probe_host.py --no-profile --calls 300 --ops $OPS --out "$L/$tree$rep" \
        > "$L/$tree$rep.log" 2>&1
    say "$tree rep $rep rc=$?: $(grep 'per call' "$L/$tree$rep/probe_host.txt" | sed 's/: host / /;s/ µs per call//' | tr '\n' ' ')"
  done
done
tar czf "$L/logs.tar.gz" -C "$L" tests.log && rm -f "$L/tests.log"
