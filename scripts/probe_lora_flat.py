"""Probe (session 49): the candidate ``lora_flat_kernel`` — a persistent grid whose tile loop and K loop are one
software-pipelined loop (``tl.range(..., flatten=True)``), S whole from the down kernel launched before — against
cuBLAS and ``auto`` (what ships: ``persistent_static`` or ``split`` at these M), one process.

    PYTHONPATH=src python scripts/probe_lora_flat.py --out DIR [--cells MxNxKxR,...] [--variants a,b,...]

Rows: ``cublas_base``, ``auto`` (what ships), ``op_flat`` = ``lora_linear(strategy="flat")`` (the planner's tile; S
tasks in the grid, one wait after each program's first tile: the op's form since call 4), and the kernel with S from
the down kernel in the op's K slices (128×256×64 tiles, 8 warps, grouped order 8, grid min(#SMs, tiles); the digit:
stages): ``flat4_tepi`` flattened (call 3's form), ``nof4`` not flattened, ``flat4_bare`` flattened without the
branch (no down launch): the bare GEMM against cuBLAS, ``flat4_pre`` flattened with S from one down launch outside the
timed call (session 50: what the branch's epilogue alone costs; its rel err is on the first input set, whose S it is). (Calls 2–3 also timed the branch by pointer loads —
C7515 in ptxas, 15–40 % slower — and as the accumulator's first term; those forms are gone.)
Each row carries its relative error against a float64 product on the first input set; rows of a failed compile or
launch say so. Writes DIR/probe_lora_flat.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib

import torch

# issue 2's cells from M = 1024
CELLS = ",".join(f"{M}x{nk}x{r}" for M in (4096, 1024) for nk in ("28672x4096", "8192x8192", "4096x4096")
                 for r in (8, 16, 64))
VARIANTS = {
    "flat4_tepi": dict(FLATTEN=True, num_stages=4),
    "nof4": dict(FLATTEN=False, num_stages=4),
    "flat4_bare": dict(FLATTEN=True, num_stages=4, LOWRANK=False),
    "flat4_pre": dict(FLATTEN=True, num_stages=4, PRE_S=True),
    # session 52: Y by TMA in two column halves (Y_TMA), and the 3-stage forms it needs at r16 to fit
    "flat4_bare_ys": dict(FLATTEN=True, num_stages=4, LOWRANK=False, Y_TMA=True),
    "flat3_bare": dict(FLATTEN=True, num_stages=3, LOWRANK=False),
    "flat3_bare_ys": dict(FLATTEN=True, num_stages=3, LOWRANK=False, Y_TMA=True),
    "flat3_pre": dict(FLATTEN=True, num_stages=3, PRE_S=True),
    "flat3_pre_ys": dict(FLATTEN=True, num_stages=3, PRE_S=True, Y_TMA=True),
    "flat4_bare_y4": dict(FLATTEN=True, num_stages=4, LOWRANK=False, Y_TMA=True, Y_PIECES=4),
}
DEFAULT_VARIANTS = "flat4_bare,flat4_pre"
_FLAGS = dict(FLATTEN=True, LOWRANK=True)
BM, BN, BK, GROUP_M, WARPS = 128, 256, 64, 8, 8


def flat_fn(v: dict, M: int, N: int, K: int, r: int, scale: float, cfg=None, splits: int | None = None, trace=None):
    """x, w, a, b, bs → y by the down kernel (the op's K slices) and lora_flat_kernel under variant ``v``. ``cfg``: a
    KernelConfig whose tile, warps, grouping and stages replace the probe's (``v``'s num_stages still wins); ``splits``:
    S's K slices instead of the op's; ``trace``: the kernel's TRACE buffer (probe_flat_trace.py)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from lowrank_gemm.kernels import _lora_kernels as K_
    from lowrank_gemm.kernels import lora_gemm
    from lowrank_gemm.kernels.epilogue import rank_block
    from lowrank_gemm.kernels.schedule import num_sms
    bm, bn, bk, br, group_m, warps = ((BM, BN, BK, rank_block(r), GROUP_M, WARPS) if cfg is None else
                                      (cfg.block_m, cfg.block_n, cfg.block_k, cfg.block_r, cfg.group_m, cfg.num_warps))
    v = {**_FLAGS, **({} if cfg is None else {"num_stages": cfg.num_stages}), **v}
    pre = {}

    def call(x, w, a, b, bs):
        dev = x.device
        y = torch.empty(M, N, device=dev, dtype=x.dtype)
        n_s = splits or lora_gemm.down_splits(M, r, K, br, num_sms(dev))
        if v.get("PRE_S"):      # S once, outside the timed call: the kernel's branch alone
            if "s" not in pre:
                pre["s"] = torch.empty(n_s, M, r, device=dev, dtype=torch.float32)
                lora_gemm._launch_down(x, a, pre["s"], scale, br, Kp=K, R=r)
            s = pre["s"]
        else:
            s = torch.empty(n_s, M, r, device=dev, dtype=torch.float32)
            if v["LOWRANK"]:
                lora_gemm._launch_down(x, a, s, scale, br, Kp=K, R=r)
        tiles = -(-M // bm) * -(-N // bn)
        y_tma, pieces = bool(v.get("Y_TMA")), v.get("Y_PIECES", 2)
        K_.lora_flat_kernel[(min(num_sms(dev), tiles),)](
            TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
            TensorDescriptor.from_tensor(a, [br, bk]), s, s, b, y, y, TensorDescriptor.from_tensor(s, [1, bm, br]),
            TensorDescriptor.from_tensor(b, [bn, br]), M, N, K, r, scale,
            s.stride(1), s.stride(2), b.stride(0), b.stride(1), y.stride(0), y.stride(1),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, BLOCK_R=br, GROUP_M=group_m, LOWRANK=v["LOWRANK"], HAS_BIAS=False,
            FLATTEN=v["FLATTEN"], LORA_TMA=True, S_SPLITS=n_s, num_warps=warps, num_stages=v["num_stages"],
            y_desc=TensorDescriptor.from_tensor(y, [bm, bn // pieces]) if y_tma else None, Y_TMA=y_tma,
            Y_PIECES=pieces, TRACE=trace is not None, trace_ptr=trace)
        return y
    return call


@contextlib.contextmanager
def y_by_tma(strategies, pieces=None):
    """The op with Y stored by TMA for ``strategies`` (``lora_gemm.Y_TMA_STRATEGIES``), in ``pieces`` column pieces;
    the knobs as they were afterwards. Memoized plans are dropped on both edges: the planner's ledger counts the
    staging piece where the op stores Y so."""
    from lowrank_gemm.kernels import lora_gemm
    from lowrank_gemm.plan.planner import clear_plan_cache
    before = lora_gemm.Y_TMA_STRATEGIES, lora_gemm.Y_PIECES
    lora_gemm.Y_TMA_STRATEGIES = frozenset(strategies)
    lora_gemm.Y_PIECES = pieces or lora_gemm.Y_PIECES
    clear_plan_cache()
    try:
        yield
    finally:
        lora_gemm.Y_TMA_STRATEGIES, lora_gemm.Y_PIECES = before
        clear_plan_cache()


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
    ap.add_argument("--op-tiles", default="", help="extra op `flat` rows on pinned tiles: BMxBNxBKxWARPSxSTAGES,…")
    ap.add_argument("--no-auto", action="store_true", help="no `auto` row")
    ap.add_argument("--tuned-row", action="store_true", help="a row of the tuned table's entry, pinned")
    ap.add_argument("--y-tma-from", type=int, default=0, help="skip the first N of --y-tma's rows")
    ap.add_argument("--pair-with", default="", help="an impl's name: every row's ratio to it timed in alternation")
    ap.add_argument("--stem", default="probe_lora_flat", help="output file stem")
    ap.add_argument("--strategies", default="",
                    help="extra rows op_<strategy>: lora_linear pinned to each strategy on the planner's config for it")
    ap.add_argument("--y-tma", action="store_true",
                    help="session 52: op `flat` at its stages capped at 3 with pointer stores (op_flat_s3) and with Y "
                         "stored by TMA in halves (op_flat_ys: where the staging buffer fits at r16), then op `flat` "
                         "as planned with Y in quarters (op_flat_y4); with --tuned-row on a persistent entry, that "
                         "entry with Y by TMA too")
    args = ap.parse_args(argv)
    from _ticket_probe import lora_baselines, lora_cells, timed_rows, write_tables
    from lowrank_gemm.bench.lora import SCALE
    from lowrank_gemm.kernels import lora_gemm
    from lowrank_gemm.plan.planner import pinned, plan_lora
    dev = torch.device("cuda")
    auto, cublas = lora_baselines()
    rows = []
    for M, N, K, r, sets in lora_cells(args.cells):
        x0, w0, a0, b0, _ = sets[0]

        def op_flat(x, w, a, b, bs):
            return lora_gemm.lora_linear(x, w, a, b, SCALE, strategy="flat")

        impls, errs = {"cublas_base": cublas, "auto": auto}, {"auto": rel_err(auto(*sets[0]), x0, w0, a0, b0, SCALE)}

        def add(name, fn):
            """A timed row for ``fn``, or a row saying why it did not run (a config that does not fit, say)."""
            try:
                errs[name] = rel_err(fn(*sets[0]), x0, w0, a0, b0, SCALE)
                impls[name] = fn
            except Exception as e:
                rows.append(dict(M=M, N=N, K=K, r=r, impl=name, error=f"{type(e).__name__}: {str(e)[:200]}"))
        impls["op_flat"], errs["op_flat"] = op_flat, rel_err(op_flat(*sets[0]), x0, w0, a0, b0, SCALE)
        if args.no_auto:
            del impls["auto"]
        if args.tuned_row:      # the tuned table's entry, pinned: what auto ran before flat_plan (session 50)
            from lowrank_gemm.plan.config import KernelConfig
            from lowrank_gemm.plan.planner import load_tuned, tuned_key
            from lowrank_gemm.plan.tuned import tuned_file
            hit = load_tuned(tuned_file("lora", dev)).get(tuned_key(M, N, K, r, torch.bfloat16))
            if hit is not None:
                pin = dict(strategy=hit["strategy"], config=KernelConfig.from_dict(hit["config"]))

                def tuned(x, w, a, b, bs, pin=pin):
                    with pinned(**pin):
                        return lora_gemm.lora_linear(x, w, a, b, SCALE)
                impls["tuned_" + hit["strategy"]] = tuned
                errs["tuned_" + hit["strategy"]] = rel_err(tuned(*sets[0]), x0, w0, a0, b0, SCALE)
                if args.y_tma and hit["strategy"].startswith("persistent"):     # the same entry, Y by TMA

                    def tuned_ys(x, w, a, b, bs, pin=pin):
                        with y_by_tma({pin["strategy"]}), pinned(**pin):
                            return lora_gemm.lora_linear(x, w, a, b, SCALE)
                    add("tuned_" + hit["strategy"] + "_ys", tuned_ys)
        if args.y_tma:
            with pinned(strategy="flat"):
                cfg = plan_lora(M, N, K, r, torch.bfloat16, dev)[1]
            cfg3 = cfg.replace(num_stages=min(cfg.num_stages, 3))
            # (name, Y by TMA, its pieces, config): halves need the stages capped at 3 at r16 (call 1's form),
            # quarters fit the planned 4 (session 52, call 2)
            ys_rows = (("op_flat_s3", False, 2, cfg3), ("op_flat_ys", True, 2, cfg3), ("op_flat_y4", True, 4, cfg))
            for name, on, pieces, cfg_ in ys_rows[args.y_tma_from:]:
                def op_ys(x, w, a, b, bs, cfg=cfg_, on=on, pieces=pieces):
                    with y_by_tma({"flat"} if on else (), pieces), pinned(strategy="flat", config=cfg):
                        return lora_gemm.lora_linear(x, w, a, b, SCALE)
                add(name, op_ys)
        for strat in filter(None, args.strategies.split(",")):
            def op_strat(x, w, a, b, bs, strat=strat):
                with pinned(strategy=strat):
                    return lora_gemm.lora_linear(x, w, a, b, SCALE)
            add("op_" + strat, op_strat)
        for spec in filter(None, args.op_tiles.split(",")):
            bm, bn, bk, warps, stages = map(int, spec.split("x"))
            with pinned(strategy="flat"):
                cfg = plan_lora(M, N, K, r, torch.bfloat16, dev)[1].replace(
                    block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages)

            def op_tiles(x, w, a, b, bs, cfg=cfg):
                with pinned(strategy="flat", config=cfg):
                    return lora_gemm.lora_linear(x, w, a, b, SCALE)
            add(f"op_flat_{spec}", op_tiles)
        for name in filter(None, args.variants.split(",")):
            v = VARIANTS[name]
            fn = flat_fn(v, M, N, K, r, SCALE)
            try:
                y = fn(*sets[0])
                torch.cuda.synchronize()
                errs[name] = rel_err(y, x0, w0, a0, b0, SCALE, v.get("LOWRANK", True))
                impls[name] = fn
            except Exception as e:      # a variant that does not compile or launch here: its row says why
                print(f"{M}x{N}x{K}x{r} {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                rows.append(dict(M=M, N=N, K=K, r=r, impl=name, error=f"{type(e).__name__}: {str(e)[:200]}"))
        strategy = plan_lora(M, N, K, r, torch.bfloat16, dev)[0]
        for row in timed_rows(impls, sets, dict(M=M, N=N, K=K, r=r, strategy=strategy), paired_base=cublas,
                              pair_with=args.pair_with or None):
            row["rel_err"] = errs.get(row["impl"])
            rows.append(row)
    write_tables(args.out, args.stem, rows,
                 {"M": "M", "N": "N", "K": "K", "r": "r", "impl": "impl", "auto strategy": "strategy",
                  "graph µs": "graph_us", "× cuBLAS": "x_cublas", "× cuBLAS (paired)": "x_cublas_paired",
                  **({f"× {args.pair_with} (paired)": "x_pair"} if args.pair_with else {}),
                  "rel err": "rel_err", "error": "error"})


if __name__ == "__main__":
    main()
