# Sourced by the one-call device scripts: `source "$(dirname "$0")/_device_prelude.sh" <log dir name>` → strict mode,
# the repository root as the working directory, the tree's package on PYTHONPATH, $L = $OUT/<name> and say(), which
# echoes a line and appends it to $L/summary.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; L=$OUT/$1; mkdir -p "$L"
say() { echo "$*" | tee -a "$L/summary.txt"; }
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
