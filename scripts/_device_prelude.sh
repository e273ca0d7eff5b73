# Sourced by the one-call device scripts: `source "$(dirname "$0")/_device_prelude.sh" <log dir name>` → strict mode,
# the repository root as the working directory, the tree's package on PYTHONPATH, $L = $OUT/<name> and say(), which
# echoes a line and appends it to $L/summary.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; L=$OUT/$1; mkdir -p "$L"
say() { echo "$*" | tee -a "$L/summary.txt"; }
# the device's copy of the tree may carry a stale .git: results name their commit from LOWRANK_GEMM_COMMIT (session 55's
# inline calls left it unset and their tables read 2640c78 for d12100f)
[ -n "${LOWRANK_GEMM_COMMIT:-}" ] || say "WARNING: LOWRANK_GEMM_COMMIT unset: results' commit field reads the device copy's git"
# gpu_tests <timeout s> <workers> <test files…>: `pytest -m gpu` on them into $L/tests.log; the tally and the failures
# go to the summary
gpu_tests() {
    local t=$1 n=$2; shift 2
    timeout "$t" python3 -m pytest -m gpu "$@" -q -n "$n" --timeout=$((t - 20)) -p no:cacheprovider -rf \
        > "$L/tests.log" 2>&1
    say "tests rc=$? $(tail -1 "$L/tests.log")"
    grep -E "^FAILED|^ERROR" "$L/tests.log" | head -20 | tee -a "$L/summary.txt"
}
# probe_run <name> <timeout s> <script> [args…]: `python3 <script> --out $L args…` into $L/<name>.log; its rc, ROW /
# FAIL / SKIP / error lines go to the summary, the log is gzipped
probe_run() {
    local name=$1 t=$2; shift 2
    timeout "$t" python3 "$@" --out "$L" > "$L/$name.log" 2>&1
    say "$name rc=$?"
    grep -E "^ROW|FAIL|SKIP|Error" "$L/$name.log" | sed 's/^ROW //' >> "$L/summary.txt"
    gzip -f "$L/$name.log"
}
# bench_lora <timeout s>: `bench lora` on the issue-2 grid (cuBLAS, unfused torch, auto) → $L/lora/
bench_lora() {
    timeout "$1" python3 -m lowrank_gemm bench lora --only cublas_base,torch_unfused,auto --out "$L/lora" \
        > "$L/lora.log" 2>&1
    say "bench lora rc=$?"
    gzip -f "$L/lora.log"
}
# bench_multilora <timeout s>: the full `bench multilora` → $L/multilora/ (its targets to the summary)
bench_multilora() {
    timeout "$1" python3 -m lowrank_gemm bench multilora --out "$L/multilora" > "$L/multilora.log" 2>&1
    say "bench multilora rc=$?"
    sed -n '/## Targets/,$p' "$L/multilora/multilora.md" >> "$L/summary.txt"
    gzip -f "$L/multilora.log"
}
# multilora_grid: the multi-LoRA GPU tests, then the full `bench multilora`
multilora_grid() {
    gpu_tests 150 8 tests/test_multilora_gpu.py tests/test_nn_multilora.py tests/test_multilora_stack.py
    gzip -f "$L/tests.log"
    bench_multilora 200
}
# ml_probe <timeout s> <label> <probe_multilora_parts.py args…>: the probe → $L/ml/; its timed / wrong / rejected rows
# to the summary
ml_probe() {
    local t=$1 label=$2; shift 2
    timeout "$t" python3 scripts/probe_multilora_parts.py --out "$L/ml" "$@" > "$L/ml.log" 2>&1
    say "probe_multilora_parts $label rc=$?"
    grep -E "µs|WRONG|rejects|Error" "$L/ml.log" | head -150 >> "$L/summary.txt"
    gzip -f "$L/ml.log"
}
# segment_plans <timeout s> <MxNxRxadapters,…>: `probe_multilora_parts.py --mode segment` with session 46's candidates
# (main tiles, shrink blocks, shrink by row, stacking depth) → $L/ml/; winners are pinned on the CPU (--pin-from)
segment_plans() {
    ml_probe "$1" "--mode segment" --mode segment --cases "$2" --configs --shrink-rows 4 \
        --mains 64x128x128x4x1,64x64x128x4x2 \
        --edits "sbm64:shrink_rows=false,shrink.block_m=64;sbm32:shrink_rows=false,shrink.block_m=32;ad1:append_d=1;ad2:append_d=2"
}
# ncu_multilora <timeout s> <metrics> <MxNxRxadapters> <plan edits> <tag>: each kernel of the fused multi-LoRA call on
# its own (`scripts/_ncu_multilora.py` under ncu, clocks not locked) → $L/ncu_<tag>.csv.gz; the last round's requested
# metrics per kernel to the summary
ncu_multilora() {
    local t=$1 metrics=$2 case=$3 edits=$4 tag=$5
    timeout "$t" ncu --clock-control none --csv --page raw --metrics "$metrics" \
        python3 scripts/_ncu_multilora.py "$case" "$edits" > "$L/ncu_$tag.csv" 2> "$L/ncu_$tag.err"
    say "== $tag ($case $edits) rc=$?"
    python3 - "$L/ncu_$tag.csv" "$metrics" <<'PY' | tee -a "$L/summary.txt"
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
hdr, data = rows[0], rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
for r in data[-(len(data) // 4):]:
    print(r[ix["Kernel Name"]][:28], *(f"{m.split('__')[1][:18]}={r[ix[m]]}" for m in sys.argv[2].split(",") if m in ix))
PY
    gzip -f "$L/ncu_$tag.csv"
}
# tune_lora <seconds> <MxKxNxR,…>: `python -m lowrank_gemm tune lora` on the shapes, new shapes started for
# <seconds> − 90, killed at <seconds> + 35; the user table under $L/table, the report under $L/tune
tune_lora() {
    local left=$1 shapes=$2
    say "tune lora with ${left} s left: $shapes"
    LOWRANK_GEMM_TUNED_DIR=$L/table timeout $((left + 35)) python3 -m lowrank_gemm tune lora --shapes "$shapes" \
        --budget-s $((left - 90)) --out "$L/tune" > "$L/tune.log" 2>&1
    say "tune rc=$?"
    grep -E "^M=|wrote|budget|Error" "$L/tune.log" | tee -a "$L/summary.txt"
    # a call brings back at most 8 files: the report and the table in one archive
    tar czf "$L/tune.tgz" -C "$L" tune table 2>/dev/null && rm -rf "$L/tune" "$L/table"
}
# decode_rows <rank> <timeout s>: scripts/probe_decode_rows.py at M = 24 / 32 into $L/r<rank>/; its rows to the summary
decode_rows() {
    mkdir -p "$L/r$1"
    timeout "$2" python3 scripts/probe_decode_rows.py --out "$L/r$1" --ms 24,32 --r "$1" > "$L/r$1.log" 2>&1
    say "rows r$1 rc=$?"
    grep -E "^ROW|FAIL|Error" "$L/r$1.log" | sed 's/^ROW //' >> "$L/summary.txt"
    gzip -f "$L/r$1.log"                              # a call brings back ≤ 8 files
}
