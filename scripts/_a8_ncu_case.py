"""One FLUX fc1 W4A8 GEMM (A8 route) launched a few times, for `ncu -k regex:w4a4_ws` (scripts/gpu_s41b.sh)."""
import torch

from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
from lowrank_gemm.kernels.act_e4m3 import act_quant_e4m3
from lowrank_gemm.kernels.w4a4_gemm import w4a4_gemm

m, n, k = 4608, 12288, 3072
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
lam = (torch.rand(k, device="cuda") + 0.5).bfloat16()
a = (torch.randn(32, k, device="cuda") * 0.02).bfloat16()
b = (torch.randn(n, 32, device="cuda") * 0.02).bfloat16()
qw, sw = quantize_weight_int4(torch.randn(n, k, device="cuda") * 0.02, 64)
x8, t, s = act_quant_e4m3(x, lam, a)
for _ in range(3):
    w4a4_gemm(x8, t, pack_int4(qw), sw, s, b)
torch.cuda.synchronize()
