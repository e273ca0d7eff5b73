"""Does the Gluon LoRA v2 kernel (a loader warp and two consumer warpgroups; the branch's S and B tiles loaded on
one barrier during the K loop) close the 256-token and 4096² gaps with a larger tile?

Session 55 found that flat's branch costs ~2–3 µs per tile because Triton issues the S and B loads in the epilogue, one
round trip after the other; v2's loader already issues both at the tile's start. v2 was only ever timed at its default
tiles (128×128 per consumer): M = 256 126–137 µs against v1's 112. Session 56 (first call, H100): ping-pong at 64×256
per consumer is worse still (1.31–2.67× cuBLAS: each consumer's 64-row tile reads W from L2 four times at 256 tokens).
Here, per cell, in one process: cuBLAS x·Wᵀ, ``lora_linear`` auto, v2 at its default and v2 COOP (both consumers
on one 128×256 or 256×128 tile: v1's and cuBLAS's tile areas), both shrink modes (``TILES``: ``pp`` ping-pong,
``coop``). Every impl is checked against an fp32 composite on the first set first (WRONG above 1e-2). ``--parts``
splits the ``pre`` path: its shrink alone and each tile's kernel with S computed beforehand. Session 57 (H100): COOP
1.26–3.0× cuBLAS against auto's 1.04–1.15; its kernel alone 1.20–1.26×, the ping-pong kernel alone 1.08 at 4096³.

    PYTHONPATH=src python scripts/probe_lora_v2_tiles.py --out DIR [--cells MxNxKxR,...] [--parts]

Writes DIR/probe_lora_v2_tiles.{json,md}; prints ``ROW`` lines.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _ticket_probe import lora_baselines, lora_cells, timed_rows, write_tables  # noqa: E402  (scripts/ helper)

CELLS = ("256x28672x4096x16,256x28672x4096x64,4096x4096x4096x16,1024x4096x4096x64,256x4096x4096x16,"
         "256x8192x8192x64")
TILES = ("coop128x256x64", "coop256x128x64")


def v2_fn(config, shrink):
    from lowrank_gemm.bench.lora import SCALE
    from lowrank_gemm.kernels.gluon import lora_ws

    def call(x, w, a, b, bs):
        return lora_ws.launch_lora_v2(x, w, a, b, SCALE, config=config, shrink=shrink)
    return call


def kernel_only_fn(config, sets):
    """v2 ``pre`` with S = x·Aᵀ computed beforehand for every rotated set: the kernel alone (main product, branch
    expand, bias), so its time against cuBLAS's x·Wᵀ is the Gluon main loop's quality, the shrink kept out."""
    from lowrank_gemm.bench.lora import SCALE
    from lowrank_gemm.kernels.gluon import lora_ws
    from lowrank_gemm.kernels.launch import launch
    pre = {x.data_ptr(): lora_ws.pre_shrink(x, a) for x, w, a, b, _ in sets}

    def call(x, w, a, b, bs):
        g, args, cx, _, out, _ = lora_ws.kernel_args_v2(x, w, a, b, SCALE, config=config, shrink="pre",
                                                        s_pre=pre[x.data_ptr()])
        launch(lora_ws.lora_ws_kernel, (g, ), *args, **cx, num_warps=lora_ws.CONSUMER_WARPS)
        return out
    return call


def shrink_fn(x, w, a, b, bs):
    """The ``pre`` shrink alone (``lora_ws.pre_shrink``, as kernel_args_v2 runs it)."""
    from lowrank_gemm.kernels.gluon import lora_ws
    return lora_ws.pre_shrink(x, a)


def tile_config(tile, r):
    from lowrank_gemm.kernels.epilogue import rank_block
    from lowrank_gemm.plan.config import KernelConfig
    coop = tile.startswith("coop")
    bm, bn, bk = (int(v) for v in tile.removeprefix("coop").removeprefix("pp").split("x"))
    # stages and LOWRANK slots are the launcher's (plan_lora_v2: the ledger's deepest ring, lora_ws.lowrank_stages)
    return KernelConfig(block_m=bm, block_n=bn, block_k=bk, block_r=rank_block(r), group_m=8,
                        num_warps=8 if coop else 4)


def rel_err(fn, s):
    from lowrank_gemm.bench.lora import SCALE
    x, w, a, b, _ = s
    ref = x.float() @ w.float().T + SCALE * ((x.float() @ a.float().T).to(x.dtype).float() @ b.float().T)
    return ((fn(*s).float() - ref).abs().max() / ref.abs().max()).item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for the tables")
    ap.add_argument("--cells", default=CELLS, help="comma-separated MxNxKxR")
    ap.add_argument("--parts", action="store_true",
                    help="also time the pre shrink alone and each tile's kernel with S computed beforehand")
    args = ap.parse_args(argv)
    from lowrank_gemm.kernels.gluon import lora_ws
    auto, cublas = lora_baselines()
    rows = []
    for M, N, K, r, sets in lora_cells(args.cells):
        impls = {"cublas_base": cublas, "auto": auto,
                 f"v2_default_{lora_ws.shrink_mode(M)}": v2_fn(None, None)}
        for tile in TILES:
            for shrink in lora_ws.SHRINK_MODES:
                cfg = tile_config(tile, r)
                if lora_ws.can_implement_v2(cfg, dict(M=M, N=N, K=K, rank=r, shrink=shrink)):
                    impls[f"v2_{tile}_{shrink}"] = v2_fn(cfg, shrink)
                else:
                    print(f"SKIP v2_{tile}_{shrink} at {M}x{N}x{K} r{r}: does not fit", flush=True)
            if args.parts and lora_ws.can_implement_v2(cfg, dict(M=M, N=N, K=K, rank=r, shrink="pre")):
                impls[f"v2_{tile}_kernel_only"] = kernel_only_fn(cfg, sets)
        if args.parts:
            impls["v2_default_kernel_only"] = kernel_only_fn(None, sets)
            impls["shrink_only"] = shrink_fn
        ok = {}
        for name, fn in impls.items():
            if name in ("cublas_base", "shrink_only"):
                ok[name] = fn
                continue
            try:
                err = rel_err(fn, sets[0])
            except Exception as exc:    # reported, not hidden: a config the launcher rejects on the GPU
                print(f"FAIL {name} at {M}x{N}x{K} r{r}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            print(f"{name} rel_err {err:.2e}" + ("  WRONG" if not err <= 1e-2 else ""), flush=True)
            if err <= 1e-2:
                ok[name] = fn
        for row in timed_rows(ok, sets, dict(M=M, N=N, K=K, r=r), pair_with="auto"):
            rows.append(row)
            print("ROW", " ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    write_tables(args.out, "probe_lora_v2_tiles", rows,
                 {c: c for c in ("M", "N", "K", "r", "impl", "graph_us", "x_cublas", "x_pair")})


if __name__ == "__main__":
    main()
