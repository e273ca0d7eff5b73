#!/usr/bin/env bash
# Session 36's second queued device call: the W8A16 multi-LoRA prefill tiles that do not spill
# (probe_multilora_fp8 --w8a16-tiles) and the unsigned-activation layer (act_shift) beside the signed one
# (probe_unsigned.py). ~4 minutes.
#   LOWRANK_GEMM_COMMIT=<hash> [OLD_UNSIGNED=<rev in _ab/>] bash scripts/gpu_s36_probes.sh → $OUT/s36_probes/…
source "$(dirname "$0")/_device_prelude.sh" s36_probes
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader)"
timeout 150 python3 scripts/probe_multilora_fp8.py --out "$L/ml_tiles" \
    --cases 256x28672x4096x16,1024x4096x4096x64,4096x4096x4096x64 \
    --w8a16-tiles 128x128x64w8,64x256x64w8,128x128x128w8,64x256x128w8 > "$L/ml_tiles.log" 2>&1
say "ml tiles rc=$?"; grep -E "^ROW|tile|SKIP" "$L/ml_tiles.log" >> "$L/summary.txt"
timeout 100 python3 scripts/probe_unsigned.py --out "$L/unsigned" > "$L/unsigned.log" 2>&1
say "unsigned rc=$?"; grep -E "^ROW|FAIL" "$L/unsigned.log" >> "$L/summary.txt"
logs="ml_tiles.log unsigned.log"
if [ -n "${OLD_UNSIGNED:-}" ]; then   # session 37: the one-pass quantizer + fp32 S GEMM of OLD_UNSIGNED's tree (_ab/)
  PYTHONPATH=$PWD/_ab/$OLD_UNSIGNED/src timeout 100 python3 scripts/probe_unsigned.py --out "$L/unsigned_old" \
      > "$L/unsigned_old.log" 2>&1
  say "unsigned old ($OLD_UNSIGNED) rc=$?"; grep -E "^ROW|FAIL" "$L/unsigned_old.log" | sed 's/^/OLD /' >> "$L/summary.txt"
  logs="$logs unsigned_old.log"
fi
tar czf "$L/logs.tar.gz" -C "$L" $logs && (cd "$L" && rm -f $logs)
