"""Launches for `ncu` on the device: the fused multi-LoRA GEMM as `bench multilora` calls it (shrink + main), the
same plan with has_lora=False (main alone, base product), and — one adapter — the single-adapter LoRA kernel on
that adapter; four rounds each (ncu times every kernel on its own: the last round is the warm one).
    python3 scripts/_ncu_multilora.py MxNxRxADAPTERS [VARIANT]
VARIANT (session 27): ``key:value,...`` edits of the tuned plan — ``expand:rows``, ``rc:16`` (rows_chunk),
``main:BMxBNxBKxSTAGESxSPLIT``."""
import dataclasses
import math
import sys

import torch

sys.path.insert(0, "src")
from lowrank_gemm.bench.multilora import K, SLOTS, _bank, _ids  # noqa: E402
from lowrank_gemm.kernels import multilora_gemm as mg  # noqa: E402
from lowrank_gemm.kernels.lora_gemm import lora_linear  # noqa: E402

M, N, r, adapters = (int(v) for v in sys.argv[1].split("x"))
dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(1)
ids, distinct = _ids(M, adapters, dev, torch.Generator().manual_seed(2))
x = torch.randn(M, K, device=dev, generator=gen).to(torch.bfloat16)
w = (torch.randn(N, K, device=dev, generator=gen) / math.sqrt(K)).to(torch.bfloat16)
bk = _bank(N, r, dev, gen)
plan = mg.choose_plan(M, N, K, r, SLOTS, "gather", dev, adapters=len(distinct))
if len(sys.argv) > 2 and sys.argv[2]:
    edits = dict(kv.split(":") for kv in sys.argv[2].split(","))
    if "main" in edits:
        b_m, b_n, b_k, st, sp = (int(v) for v in edits["main"].split("x"))
        plan = dataclasses.replace(plan, main=plan.main.replace(block_m=b_m, block_n=b_n, block_k=b_k, num_stages=st,
                                                                split_k=sp, swap_ab=False,
                                                                num_warps=8 if b_m >= 128 else 4))
    if "expand" in edits:
        plan = dataclasses.replace(plan, expand=edits["expand"], fuse_d=0, s_unroll=True, x_tma=False)
    if "rc" in edits:
        plan = dataclasses.replace(plan, rows_chunk=int(edits["rc"]))
print("plan", plan.to_dict(), flush=True)
explicit = plan if len(sys.argv) > 2 and sys.argv[2] else None      # without a variant, as bench multilora calls it (bank route)
for _ in range(4):
    torch.cuda.nvtx.range_push("fused")
    mg.multi_lora_gemm(x, w, bk.bank_a, bk.bank_b, bk.ranks, bk.scales, ids, mode="gather", validate=False,
                       adapters=len(distinct), b_clean=bk.B_ZERO_PADDED, plan=explicit)
    mg.multi_lora_gemm(x, w, bk.bank_a, bk.bank_b, bk.ranks, bk.scales, ids, mode="gather", validate=False,
                       adapters=len(distinct), b_clean=bk.B_ZERO_PADDED, has_lora=False, plan=explicit)
    if len(distinct) == 1:
        lora_linear(x, w, bk.bank_a[distinct[0]], bk.bank_b[distinct[0]], 0.5)
torch.cuda.synchronize()
