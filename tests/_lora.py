"""Random single-adapter LoRA problems for the CPU interpreter tests (fp16: the interpreter's bf16 dot is wrong)."""

import torch


def make(M, N, K, r, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).half()
    w = (torch.randn(N, K, generator=g) / K ** 0.5).half()
    a = (torch.randn(r, K, generator=g) / K ** 0.5).half()
    b = torch.randn(N, r, generator=g).half()
    bb = torch.randn(N, generator=g).half() if bias else None
    return x, w, a, b, bb


def rel_err(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()
