# Sourced by session 20's device scripts: the repository root as the working directory, the tree's package on
# PYTHONPATH, log() (a timestamped line into $OUT/session.log) and probe NAME KN MS BUDGET_S, which runs
# probe_lora_unseen.py --rule (auto, the rules' plan, the bucket's entry, every family) into $OUT/$PROBE_DIR/NAME.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/$PROBE_DIR"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/session.log"; }
probe() {
  timeout $(( $4 + 30 )) python3 scripts/probe_lora_unseen.py --out "$OUT/$PROBE_DIR/$1" --budget-s "$4" --rule \
      --kn "$2" --ms "$3" --ranks 16,64 > "$OUT/$PROBE_DIR/$1.log" 2>&1
  log "probe $1 rc=$?"
}
log "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)"
