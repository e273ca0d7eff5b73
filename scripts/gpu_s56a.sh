#!/usr/bin/env bash
# Session 56's first call (≤ 590 s), whichever GPU comes → $OUT/s56a/: the flat GPU tests (256×28672 r64 among the
# shapes, the H100 table's 4-stage entry), on an H200 the canonical `bench lora` (the H200 LoRA table is still session
# 30's), then the v2 tile probe (probe_lora_v2_tiles.py: Gluon v2 at 64×256 per consumer against cuBLAS and auto); on
# any other GPU the trace probe's ps_st4 at 1024×8192² r64 after it (session 55's open question).
#   LOWRANK_GEMM_COMMIT=<hash> [V2_CELLS=MxNxKxR,…] bash scripts/gpu_s56a.sh
source "$(dirname "$0")/_device_prelude.sh" s56a
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "commit=${LOWRANK_GEMM_COMMIT:-?} $gpu"
gpu_tests 150 2 tests/test_lora_gemm_gpu.py -k "flat_strategy or routes_flat"
[[ $gpu == *H200* ]] && bench_lora 200
probe_run v2tiles 220 scripts/probe_lora_v2_tiles.py ${V2_CELLS:+--cells "$V2_CELLS"}
[[ $gpu != *H200* ]] && probe_run trace 100 scripts/probe_flat_trace.py --cells 1024x8192x8192x64
exit 0
