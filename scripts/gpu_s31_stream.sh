#!/usr/bin/env bash
# Session 31, call 3: the helper-thread test again (grad-mode fix), then the decode split / stream-K tests three times
# at this tree and twice at the session's start (s31_old/src, d809f1b) — call 2's full suite failed one of them once
# (stream-g64int8-M5N336K640: every output unwritten). s31_old: mkdir s31_old && git archive d809f1b src | tar -x -C s31_old
source "$(dirname "$0")/_device_prelude.sh" s31_stream
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 60 python3 -m pytest -q -m gpu tests/test_persistent.py -p no:cacheprovider > "$L/persistent.log" 2>&1
say "persistent rc=$? $(tail -1 "$L/persistent.log")"
for i in 1 2 3; do
  timeout 150 python3 -m pytest -q -m gpu tests/test_w4a4_decode.py -k split_stream -n 8 -p no:cacheprovider -rf \
      > "$L/head_$i.log" 2>&1
  say "head run $i rc=$? $(tail -1 "$L/head_$i.log")"; grep -E "^FAILED" "$L/head_$i.log" | tee -a "$L/summary.txt"
done
say "old tree: $(PYTHONPATH=$PWD/s31_old/src python3 -c "import lowrank_gemm.kernels.lora_gemm as m; print(m.__file__, hasattr(m, \"persistent_zeros\"))")"
for i in 1 2; do
  PYTHONPATH=$PWD/s31_old/src timeout 150 python3 -m pytest -q -m gpu tests/test_w4a4_decode.py -k split_stream -n 8 \
      -p no:cacheprovider -rf > "$L/old_$i.log" 2>&1
  say "d809f1b run $i rc=$? $(tail -1 "$L/old_$i.log")"; grep -E "^FAILED" "$L/old_$i.log" | tee -a "$L/summary.txt"
done
