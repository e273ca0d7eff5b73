"""Launches for ``ncu -k regex:w4a4_decode_kernel`` on the device (session 32): the int4_g64 decode GEMM as ``auto``
runs it at M = 16, K = 4096, N = 28672 (30.0 µs in ``w4a4.md`` against a ~18 µs weight-stream floor), three calls so
``--launch-skip 1 --launch-count 1`` profiles a warm launch. Where does its per-CTA step chain stall?

    python3 scripts/_ncu_w4a4_decode.py [M K N fmt]   (default 16 4096 28672 int4_g64)
"""
import sys

import torch

sys.path.insert(0, "src")
from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4  # noqa: E402
from lowrank_gemm.formats.int4_twolevel import pack_weight_2l  # noqa: E402
from lowrank_gemm.kernels.act_quant import act_quant  # noqa: E402
from lowrank_gemm.kernels.w4a4_gemm import w4a4_gemm  # noqa: E402

M, K, N = (int(v) for v in sys.argv[1:4]) if len(sys.argv) >= 4 else (16, 4096, 28672)
fmt = sys.argv[4] if len(sys.argv) >= 5 else "int4_g64"
torch.manual_seed(0)
dev = "cuda"
w = torch.randn(N, K, device=dev) * 0.02
a = (torch.randn(32, K, device=dev) * 0.02).bfloat16()
b = (torch.randn(N, 32, device=dev) * 0.02).bfloat16()
smooth = (torch.rand(K, device=dev) + 0.5).bfloat16()
if fmt == "int4_g64":
    qw, wsc = quantize_weight_int4(w * smooth.float(), 64)
    wq, wmul = pack_int4(qw), None
else:
    wq, wmul, wsc = pack_weight_2l(w * smooth.float(), 64)
x = torch.randn(M, K, device=dev).bfloat16()
xq, xsc, s = act_quant(x, smooth, a, 64, fmt)
print(fmt, M, K, N, flush=True)
for _ in range(3):
    w4a4_gemm(xq, xsc, wq, wsc, s, b, w_mul=wmul, fmt=fmt, impl="decode")
torch.cuda.synchronize()
