# Sourced by the one-call device scripts: `source "$(dirname "$0")/_device_prelude.sh" <log dir name>` → strict mode,
# the repository root as the working directory, the tree's package on PYTHONPATH, $L = $OUT/<name> and say(), which
# echoes a line and appends it to $L/summary.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; L=$OUT/$1; mkdir -p "$L"
say() { echo "$*" | tee -a "$L/summary.txt"; }
