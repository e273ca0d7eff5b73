"""compute-sanitizer target (session 12): act_quant's v3 first passes with the "one" S feed (default at r ≤ 32)
and "one_tma", both formats, a ragged M and the FLUX K; plus the W4A4 layer's direct eager path at M = 1.

    compute-sanitizer --tool memcheck python3 scripts/_sanitize_act_quant.py
"""
import torch

from lowrank_gemm.kernels.act_quant import act_quant
from lowrank_gemm.ops import w4a4_linear
from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4

k = 3072
x = torch.randn(300, k, device="cuda", dtype=torch.bfloat16)
smooth = (torch.rand(k, device="cuda") + 0.5).to(torch.bfloat16)
down = (torch.randn(32, k, device="cuda") * 0.02).to(torch.bfloat16)
for fmt, out, feed in (("int4_g64", "packed", None), ("int4_g64", "f8", None), ("int4_2l", "packed", None),
                       ("int4_2l", "packed", "one_tma")):
    q, sc, s = act_quant(x, smooth, down, 64, fmt, out=out, variant="v3", s_feed=feed)
    torch.cuda.synchronize()
    print("act_quant", fmt, out, feed or "default", bool(torch.isfinite(s).all()), flush=True)
w = torch.randn(4096, k, device="cuda") * 0.02
qw, sw = quantize_weight_int4(w, 64)
up = (torch.randn(4096, 32, device="cuda") * 0.02).to(torch.bfloat16)
y = w4a4_linear(x[:1], pack_int4(qw), sw, smooth, down, up)
torch.cuda.synchronize()
print("layer", bool(torch.isfinite(y).all()), flush=True)
