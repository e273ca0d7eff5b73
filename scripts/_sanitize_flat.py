"""compute-sanitizer target (session 54): the LoRA op's one-launch kernels whose programs wait on other programs'
in-grid S tasks — ``flat`` (its planner tile, pinned) at 256 tokens (S tasks on the slack), on a grid wider than its
tiles (programs that hold S tasks only), on a ragged shape, and ``persistent_static`` at 256 tokens — each against the
float64 reference, then a CUDA-graph replay bit-identical to the eager call.

    compute-sanitizer --tool memcheck python3 scripts/_sanitize_flat.py
"""
import torch

from _sanitize_s_words import case
from lowrank_gemm.bench.common import capture_graph
from lowrank_gemm.kernels.lora_gemm import lora_linear
from lowrank_gemm.reference import lora_linear_ref


for strategy, (M, N, K, r) in (("flat", (256, 28672, 4096, 64)), ("flat", (1024, 4096, 4096, 64)),
                               ("flat", (300, 5000, 3000, 40)), ("persistent_static", (256, 28672, 4096, 64))):
    x, w, a, b, bias = case(M, N, K, r, seed=M + r)
    y = lora_linear(x, w, a, b, 0.5, bias, strategy=strategy)
    torch.cuda.synchronize()
    ref = lora_linear_ref(x, w, a, b, 0.5, bias)
    err = float((y.double() - ref).norm() / ref.norm())
    print(strategy, f"{M}x{N}x{K} r{r}", f"rel_err={err:.2e}", "ok" if err < 1e-2 else "WRONG", flush=True)
    eager, g, out = capture_graph(lambda: lora_linear(x, w, a, b, 0.5, bias, strategy=strategy))
    for _ in range(2):
        g.replay()
    torch.cuda.synchronize()
    print(strategy, "graph replays", "ok" if torch.equal(out, eager) and torch.equal(out, y) else "WRONG", flush=True)
