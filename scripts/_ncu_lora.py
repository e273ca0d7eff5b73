"""Launches for ``ncu -k regex:lora_main_kernel`` on the device (written in session 31, not yet run): the 8192² decode
plan as ``auto`` runs it (in-grid S producers, S handed over as words) or the same tile with rank 0 (``bare``), three
calls each, so ``--launch-skip 1 --launch-count 1`` profiles a warm launch. Where do the ~1.4 µs that the branch adds
at 8192², M = 1 go (session 31: bare 34.66 µs, auto 36.10)?

    python3 scripts/_ncu_lora.py auto|bare [M K N r]   (default 1 8192 8192 16)
"""
import sys

import torch

sys.path.insert(0, "src")
from lowrank_gemm.kernels.lora_gemm import lora_linear, run_strategy  # noqa: E402
from lowrank_gemm.plan.planner import plan_lora  # noqa: E402

what = sys.argv[1] if len(sys.argv) > 1 else "auto"
M, K, N, r = (int(v) for v in sys.argv[2:6]) if len(sys.argv) >= 6 else (1, 8192, 8192, 16)
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(M, K, generator=g, device="cuda").bfloat16()
w = (torch.randn(N, K, generator=g, device="cuda") / K ** 0.5).bfloat16()
a = (torch.randn(r, K, generator=g, device="cuda") / K ** 0.5).bfloat16()
b = (torch.randn(N, r, generator=g, device="cuda") / r ** 0.5).bfloat16()
strategy, cfg = plan_lora(M, N, K, r, torch.bfloat16, x.device)
print(what, strategy, cfg, flush=True)
for _ in range(3):
    if what == "auto":
        lora_linear(x, w, a, b, 0.5)
    elif what == "bare":
        run_strategy("split", x, w, a[:0], b[:, :0], 0.5, None, cfg.replace(s_producers=0))
    else:
        raise SystemExit(f"unknown launch {what!r}: auto or bare")
torch.cuda.synchronize()
