#!/usr/bin/env bash
# For the next session (written in session 30, not yet run): the LoRA GPU tests, including session 30's
# torch.compile reduce-overhead test over the s_words decode plans (never run on a GPU yet), then
# scripts/probe_splitk_decode.py — whether a split-K base GEMM closes the 8192² decode gap (NOTES.md, session 30).
#   LOWRANK_GEMM_COMMIT=<hash> bash scripts/gpu_s31_first.sh → $OUT/s31_first/{summary.txt,tests.log,probe.log,probe/}
source "$(dirname "$0")/_device_prelude.sh" s31_first
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
timeout 170 python3 -m pytest -q -m gpu tests/test_lora_gemm_gpu.py -n 8 -p no:cacheprovider -rf > "$L/tests.log" 2>&1
say "LoRA GPU tests rc=$? $(tail -1 "$L/tests.log")"
grep -E "^FAILED|reduce_overhead" "$L/tests.log" | head -10 | tee -a "$L/summary.txt"
timeout 330 python3 scripts/probe_splitk_decode.py --out "$L/probe" > "$L/probe.log" 2>&1
say "probe rc=$?"
python3 - "$L/probe/splitk_decode.json" <<'PY' | tee -a "$L/summary.txt"
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["M"], r["K"], r["impl"], r.get("graph_us"), r.get("ratio_paired"), r.get("rel_err"), r.get("error", ""))
PY
