"""Probe (session 49): the candidate ``lora_flat_kernel`` — a persistent grid whose tile loop and K loop are one
software-pipelined loop (``tl.range(..., flatten=True)``), S whole from the down kernel launched before — against
cuBLAS and ``auto`` (what ships: ``persistent_static`` or ``split`` at these M), one process.

    PYTHONPATH=src python scripts/probe_lora_flat.py --out DIR [--cells MxNxKxR,...] [--variants a,b,...]

Variants (128×256×64 tiles, 8 warps, grouped order 8, grid min(#SMs, tiles), Y by pointer stores; ``flat``: the
loops flattened, ``nof``: not (the per-tile pipeline restart, as lora_persistent_kernel has it); the digit: stages):
S from the down kernel in the op's K slices (``down_splits``) for the TMA forms, summed in the epilogue, in one slice
for the pointer forms. ``flat4`` the branch's MMA after the K loop, S and B by pointer loads (call s49b: 1.15–1.4× cuBLAS where the bare
flattened GEMM read 0.98–1.07×); ``_tepi`` the same by TMA; ``_first`` the branch as the accumulator's first term
(pointer loads), ``_tfirst`` (TMA); ``_bare`` no branch, no down launch: the bare GEMM against cuBLAS. On the CPU
(ptxas sm_90a): the flattened kernels with pointer-loaded S and B report C7515 (every wgmma serialized), the TMA ones
do not; the ``_first`` forms lose the main loop's wgmma.wait_group 1 (no MMA kept in flight). The default list is
the rest.
``op_flat``: ``lora_linear(strategy="flat")``, the op's runner on the planner's tile (r ≤ 16).
Each row carries its relative error against a float64 product on the first input set; rows of a failed compile or
launch say so. Writes DIR/probe_lora_flat.{json,md}.
"""

from __future__ import annotations

import argparse

import torch

CELLS = ("4096x28672x4096x16,4096x28672x4096x8,4096x8192x8192x16,4096x4096x4096x16,4096x4096x4096x8,"
         "1024x28672x4096x16,1024x8192x8192x16,1024x8192x8192x8,1024x4096x4096x16")
VARIANTS = {
    "flat4": dict(FLATTEN=True, num_stages=4),
    "flat4_tepi": dict(FLATTEN=True, num_stages=4, LORA_TMA=True),
    "flat3_tepi": dict(FLATTEN=True, num_stages=3, LORA_TMA=True),
    "flat4_first": dict(FLATTEN=True, num_stages=4, LORA_FIRST=True),
    "flat4_tfirst": dict(FLATTEN=True, num_stages=4, LORA_FIRST=True, LORA_TMA=True),
    "flat3_tfirst": dict(FLATTEN=True, num_stages=3, LORA_FIRST=True, LORA_TMA=True),
    "nof4": dict(FLATTEN=False, num_stages=4),
    "nof4_bare": dict(FLATTEN=False, num_stages=4, LOWRANK=False),
    "flat4_bare": dict(FLATTEN=True, num_stages=4, LOWRANK=False),
}
DEFAULT_VARIANTS = "flat4_tepi,nof4,flat4_bare"
_FLAGS = dict(FLATTEN=True, Y_TMA=False, EPI_SPLIT=1, LOWRANK=True, LORA_FIRST=False, LORA_TMA=False)
BM, BN, BK, GROUP_M, WARPS = 128, 256, 64, 8, 8


def flat_fn(v: dict, M: int, N: int, K: int, r: int, scale: float):
    """x, w, a, b, bs → y by the down kernel (one K slice) and lora_flat_kernel under variant ``v``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from lowrank_gemm.kernels import _lora_kernels as K_
    from lowrank_gemm.kernels import lora_gemm
    from lowrank_gemm.kernels.epilogue import rank_block
    from lowrank_gemm.kernels.schedule import num_sms
    br = rank_block(r)
    v = dict(_FLAGS, **v)
    split = v["EPI_SPLIT"]

    def call(x, w, a, b, bs):
        dev = x.device
        y = torch.empty(M, N, device=dev, dtype=x.dtype)
        splits = lora_gemm.down_splits(M, r, K, br, num_sms(dev)) if v["LORA_TMA"] else 1
        s = torch.empty(splits, M, r, device=dev, dtype=torch.float32)
        if v["LOWRANK"]:
            lora_gemm._launch_down(x, a, s, scale, br, Kp=K, R=r)
        tiles = -(-M // BM) * -(-N // BN)
        grid = (min(num_sms(dev), tiles),)
        K_.lora_flat_kernel[grid](
            TensorDescriptor.from_tensor(x, [BM, BK]), TensorDescriptor.from_tensor(w, [BN, BK]),
            s, b, y, y, TensorDescriptor.from_tensor(y, [BM, BN // split]),
            TensorDescriptor.from_tensor(s, [1, BM, br]), TensorDescriptor.from_tensor(b, [BN, br]), M, N, K, r,
            s.stride(1), s.stride(2), b.stride(0), b.stride(1), y.stride(0), y.stride(1),
            BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, BLOCK_R=br, GROUP_M=GROUP_M, LOWRANK=v["LOWRANK"], HAS_BIAS=False,
            FLATTEN=v["FLATTEN"], Y_TMA=v["Y_TMA"], EPI_SPLIT=split, LORA_FIRST=v["LORA_FIRST"],
            LORA_TMA=v["LORA_TMA"], S_SPLITS=splits, num_warps=WARPS, num_stages=v["num_stages"])
        return y
    return call


def rel_err(y, x, w, a, b, scale, lowrank=True):
    ref = x.double() @ w.double().T
    if lowrank:
        ref += scale * (x.double() @ a.double().T) @ b.double().T
    return float((y.double() - ref).norm() / ref.norm())


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--cells", default=CELLS)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    args = ap.parse_args(argv)
    from _ticket_probe import timed_rows, write_tables
    from lowrank_gemm.bench.lora import SCALE, make_sets
    from lowrank_gemm.kernels import lora_gemm
    from lowrank_gemm.plan.planner import plan_lora
    dev = torch.device("cuda")
    rows = []
    for cell in args.cells.split(","):
        M, N, K, r = (int(v) for v in cell.split("x"))
        sets = make_sets(M, N, K, r, torch.bfloat16, dev)
        x0, w0, a0, b0, _ = sets[0]

        def auto(x, w, a, b, bs):
            return lora_gemm.lora_linear(x, w, a, b, SCALE)

        def cublas(x, w, a, b, bs):
            return x @ w.T
        def op_flat(x, w, a, b, bs):
            return lora_gemm.lora_linear(x, w, a, b, SCALE, strategy="flat")
        impls, errs = {"cublas_base": cublas, "auto": auto}, {"auto": rel_err(auto(*sets[0]), x0, w0, a0, b0, SCALE)}
        if r <= 16:     # the op's strategy (planner's tile, S in the down kernel's K slices)
            impls["op_flat"], errs["op_flat"] = op_flat, rel_err(op_flat(*sets[0]), x0, w0, a0, b0, SCALE)
        for name in args.variants.split(","):
            v = VARIANTS[name]
            fn = flat_fn(v, M, N, K, r, SCALE)
            try:
                y = fn(*sets[0])
                torch.cuda.synchronize()
                errs[name] = rel_err(y, x0, w0, a0, b0, SCALE, v.get("LOWRANK", True))
                impls[name] = fn
            except Exception as e:      # a variant that does not compile or launch here: its row says why
                print(f"{cell} {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                rows.append(dict(M=M, N=N, K=K, r=r, impl=name, error=f"{type(e).__name__}: {str(e)[:200]}"))
        strategy = plan_lora(M, N, K, r, torch.bfloat16, dev)[0]
        for row in timed_rows(impls, sets, dict(M=M, N=N, K=K, r=r, strategy=strategy), paired_base=cublas):
            row["rel_err"] = errs.get(row["impl"])
            rows.append(row)
        del sets
        torch.cuda.empty_cache()
    write_tables(args.out, "probe_lora_flat", rows,
                 {"M": "M", "N": "N", "K": "K", "r": "r", "impl": "impl", "auto strategy": "strategy",
                  "graph µs": "graph_us", "× cuBLAS": "x_cublas", "× cuBLAS (paired)": "x_cublas_paired",
                  "rel err": "rel_err", "error": "error"})


if __name__ == "__main__":
    main()
