#!/usr/bin/env bash
# One device call (≈ 4 min): act_quant at FLUX sizes (M = 4608, K = 3072 / 12288), where it is 30–130 µs of the
# W4A4 layer (w4a4.md: int4_2l layer − GEMM 49 µs at fc1, 129 at fc2; int4_g64 31 / 76) against a byte floor of
# ~10 / ~45 µs. Per format: the v3 default and its tile variants, rank 32 vs rank 0 (what S costs), ncu on one launch.
#   LOWRANK_GEMM_COMMIT=<hash> [TESTS="..."] [VARIANTS=a,b] [R0=0] [NCU=0] bash scripts/gpu_actquant_large.sh
#       → $OUT/aq_large (tarred; summary.txt beside). VARIANTS: names from probe_actquant_midm.py's VARIANTS.
source "$(dirname "$0")/_device_prelude.sh" aq_large
say "commit=${LOWRANK_GEMM_COMMIT:-?} $(nvidia-smi --query-gpu=name --format=csv,noheader)"
if [ -n "${TESTS:-}" ]; then
  timeout 240 python3 -m pytest -m gpu -q -n 8 --timeout=150 -p no:cacheprovider -W ignore -rf $TESTS \
      > "$L/gpu_tests.log" 2>&1
  say "pytest rc=$?: $(tail -1 "$L/gpu_tests.log")"; grep -E "^FAILED" "$L/gpu_tests.log" | head -5 | tee -a "$L/summary.txt"
fi
V=${VARIANTS:-default,v2,v3,v3:bm16,v3:bm32,v3:bm128,v3:w2,v3:w8,v3:split2,v3:split4,v3:split16,v3:split32}
run() {  # name, args...
  local name=$1; shift
  timeout 240 python3 scripts/probe_actquant_midm.py --out "$L/$name" --ms 4608 --ks 3072,12288 --aq-only "$@" \
      > "$L/$name.log" 2>&1
  say "probe $name rc=$?"
  grep "^|" "$L/$name.log" | cut -d'|' -f2-6 | grep -v "^ M\|^---" | tee -a "$L/summary.txt"
}
run g64_f8 --f8 --variants "$V"
[ "${R0:-1}" = 1 ] && run g64_f8_r0 --f8 --rank 0 --variants default,v3:bm32,v3:w8
run 2l --fmt int4_2l --variants "$V"
[ "${R0:-1}" = 1 ] && run 2l_r0 --fmt int4_2l --rank 0 --variants default,v3:bm32,v3:w8
[ "${NCU:-1}" = 1 ] || exit 0
cat > /tmp/aq_ncu.py <<'PY'
import sys, torch
from lowrank_gemm.kernels.act_quant import act_quant
fmt, k = sys.argv[1], int(sys.argv[2])
x = torch.randn(4608, k, device="cuda", dtype=torch.bfloat16)
lam = (torch.rand(k, device="cuda") + 0.5).to(torch.bfloat16)
a = (torch.randn(32, k, device="cuda") * 0.02).to(torch.bfloat16)
kw = dict(out="f8") if fmt == "int4_g64" else {}
for _ in range(3):
    act_quant(x, lam, a, 64, fmt, **kw)
torch.cuda.synchronize()
PY
for fk in "int4_g64 3072" "int4_2l 3072"; do
  set -- $fk
  timeout 150 ncu --clock-control none --set full -k regex:act -s 4 -c 3 python3 /tmp/aq_ncu.py $1 $2 \
      > "$L/ncu_$1_$2.txt" 2>&1
  say "ncu $1 $2 rc=$?: $(grep -E "^  [a-z_0-9]+kernel|^\s+Duration|DRAM Throughput|Registers Per|Achieved Occupancy|\
Issue Slots Busy|Theoretical Occupancy" "$L/ncu_$1_$2.txt" | tr -s ' ' | tr '\n' ';')"
done
