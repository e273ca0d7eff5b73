"""Random single-adapter LoRA problems for the CPU interpreter tests (fp16: the interpreter's bf16 dot is wrong)."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lowrank_gemm.kernels import lora_gemm as LG
from lowrank_gemm.kernels.lora_gemm import run_strategy
from lowrank_gemm.plan.planner import can_implement

CPU = torch.device("cpu")


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


def run(strategy, x, w, a, b, scale, bias, c):
    """One strategy into a NaN-poisoned output (unwritten elements fail the comparison)."""
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype)
    assert can_implement(strategy, (x.shape[0], w.shape[0], x.shape[1], a.shape[0]), c)
    LG.clear_weight_cache()
    return run_strategy(strategy, x, w, a, b, scale, bias, c, out=out)


def tickets_zero():
    """Split-K arrival tickets are back at zero after a launch (graph replays depend on it)."""
    region = LG._TICKETS.region(CPU)
    return region is None or not region.any()


class AtenOps(TorchDispatchMode):
    """The aten ops a call dispatches (our Triton launches do not show): a per-call zero / fill is a memset node in a
    captured graph."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))
