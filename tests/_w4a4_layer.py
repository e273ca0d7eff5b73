"""One SVDQuant layer's arguments on the GPU for the kernels' routing tests (x, packed weight, scales, smoothing, LoRA
down / up)."""

import torch


def layer_args(m: int, seed: int, n: int = 4096, k: int = 4096, r: int = 32):
    from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, k, device="cuda", generator=g) * 0.02
    qw, sw = quantize_weight_int4(w, 64)
    smooth = (torch.rand(k, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
    down = (torch.randn(r, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    up = (torch.randn(n, r, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    return x, pack_int4(qw), sw, smooth, down, up
