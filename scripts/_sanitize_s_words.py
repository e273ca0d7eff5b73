"""compute-sanitizer target (session 30): the LoRA op's in-grid S producers with S handed over as stamped
words (``LoraOptions.s_words``, on by default since session 30) — the tuned decode plans (4 producers at 4096² /
8192², two on the N = 28672 r64 cell), a ragged M on a pinned three-producer plan, the counter protocol beside
it, and a CUDA-graph replay whose pairs are carved from the spare.

    compute-sanitizer --tool memcheck python3 scripts/_sanitize_s_words.py
"""
import torch

from lowrank_gemm.bench.common import capture_graph
from lowrank_gemm.kernels.lora_gemm import lora_linear, lora_options
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.plan.planner import pinned
from lowrank_gemm.reference import lora_linear_ref


def case(M, N, K, r, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = lambda *s, sc=1.0: (torch.randn(*s, device="cuda", generator=g) * sc).to(torch.bfloat16)  # noqa: E731
    return t(M, K), t(N, K, sc=K ** -0.5), t(r, K, sc=K ** -0.5), t(N, r, sc=r ** -0.5), t(N)


def check(name, x, w, a, b, bias, **pin):
    ref = lora_linear_ref(x, w, a, b, 0.5, bias)
    for words in (True, False):
        with lora_options(s_words=words), pinned(**pin) if pin else lora_options():
            y = lora_linear(x, w, a, b, 0.5, bias)
        torch.cuda.synchronize()
        err = float((y.double() - ref).norm() / ref.norm())
        print(name, "words" if words else "counters", f"rel_err={err:.2e}", "ok" if err < 1e-2 else "WRONG", flush=True)


def main():
    for M, N, K, r in ((1, 4096, 4096, 16), (16, 8192, 8192, 16), (1, 28672, 4096, 64)):
        check(f"auto {M}x{N}x{K} r{r}", *case(M, N, K, r))
    ragged = KernelConfig(block_m=16, block_n=64, block_k=128, block_r=64, group_m=1, num_warps=4, num_stages=3,
                          swap_ab=True, s_producers=3)
    check("pinned 37x5000x3000 r40 P3", *case(37, 5000, 3000, 40, seed=1), strategy="split", config=ragged)
    x, w, a, b, bias = case(16, 4096, 4096, 16, seed=2)
    eager, g, out = capture_graph(lambda: lora_linear(x, w, a, b, 0.5, bias))
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    print("graph replays", "ok" if torch.equal(out, eager) else "WRONG", flush=True)


if __name__ == "__main__":
    main()
