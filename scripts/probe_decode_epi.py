"""Session 32, same process, CUDA-graph replays over rotated operand sets, cuBLAS bf16 beside:
- the W4A4 decode kernel's low-rank term as one wgmma (``epi_mma``) against the per-rank loop;
- the f8 path's a/b rows from a shared-memory table (``xab_smem``) against L2 loads in the K loop;
- the rows' 2-D box (``row_box``);
- the skinny GEMM's rank term as mma.sync.
Every timed variant is first checked against the float64 reference (NaN-poisoned output, a bit-identical repeat:
``_decode_probe.Probe.checked``).

    PYTHONPATH=src python3 scripts/probe_decode_epi.py [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _decode_probe import Probe  # noqa: E402
from lowrank_gemm.bench.common import rotation_count, time_graph  # noqa: E402
from lowrank_gemm.bench.w4a4 import _providers  # noqa: E402
from lowrank_gemm.kernels.gluon import w4a4_decode as d  # noqa: E402
from lowrank_gemm.kernels.gluon import w4a4_ws as w4  # noqa: E402
from lowrank_gemm.kernels.w4_expand import expand_act_f8  # noqa: E402
from lowrank_gemm.kernels.w4a4_skinny import launch_w4a4_skinny  # noqa: E402


def rotated(nbytes: int) -> int:
    """Operand sets to rotate so one pass is ≥ 3× the L2 (2 … 8)."""
    return min(8, max(2, rotation_count(nbytes)))


def cublas_us(m: int, n: int, k: int) -> float:
    """cuBLAS bf16 [m, k] × [n, k]ᵀ, no branch, over rotated weights."""
    x = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(rotated(2 * n * k))]
    return time_graph(lambda a, b: a @ b.T, [(x[i % 2], w) for i, w in enumerate(wb)]).median_us


def same(a, b) -> bool:
    return a is not None and b is not None and bool(torch.equal(a, b))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/out/decode_epi")
    ap.add_argument("--shapes", default="16x28672x4096,4x28672x4096,16x4096x4096,64x28672x4096,16x4096x14336")
    ap.add_argument("--layer", default="16x28672x4096,4x28672x4096,64x28672x4096")
    ap.add_argument("--skinny", default="16x4096x4096,4x4096x4096,16x4096x14336,64x4096x4096")
    args = ap.parse_args()
    probe = Probe(args.out, "probe_decode_epi")
    emit = probe.emit

    for shape in args.shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        emit(M=m, N=n, K=k, impl="cublas_bf16", graph_us=cublas_us(m, n, k))
        for fmt in ("int4_g64", "int4_2l"):
            if fmt == "int4_g64" and m > 16:
                continue        # auto takes v2 there; the decode kernel's f8 path keeps the loop at M > 16
            sets = [w4.make_operands_v2(fmt, m, n, k, 32, 64, device="cuda", bias=True, seed=s)
                    for s in range(rotated(n * k // 2))]
            ref = w4.reference_v2(sets[0]).cuda()
            if fmt == "int4_g64":     # as the layer feeds it: act_quant's e4m3 tokens and xab rows
                pre = []
                for s in sets:
                    xe, xab = expand_act_f8(s["x_q"], s["x_scale"], 64)
                    pre.append({**s, "x_q": xe, "x_scale": xab})
                sets = pre
            # (epilogue wgmma, xab table, row box): session 32's two changes and session 5's row box, which sm_90
            # AOT puts at 608 → 476 → 417 SASS per K step for int4_g64 at M = 16 (2l: 500 → 444 with the box)
            variants = ([(False, False, False), (True, False, False), (True, True, False), (True, True, True),
                         (True, False, True)] if fmt == "int4_g64"
                        else [(False, None, False), (True, None, False), (True, None, True)])
            outs = {}
            for epi, xs, rb in variants:
                def run(epi=epi, xs=xs, rb=rb, **s):
                    return d.launch_w4a4_decode(**s, epi_mma=epi, xab_smem=xs, row_box=rb)
                tag = f"epi_{'mma' if epi else 'loop'}" + ("" if xs is None else f":xab_{'smem' if xs else 'l2'}") \
                    + (":row_box" if rb else "")
                outs[(epi, xs, rb)] = probe.checked(dict(M=m, N=n, K=k, fmt=fmt), f"decode_gemm:{tag}", run, sets, ref)
            if fmt == "int4_g64":
                emit(M=m, N=n, K=k, fmt=fmt, impl="xab_smem_vs_l2_equal",
                     value=same(outs[(True, True, False)], outs[(True, False, False)]))
            xs_on = True if fmt == "int4_g64" else None
            emit(M=m, N=n, K=k, fmt=fmt, impl="row_box_equal", value=same(outs[(True, xs_on, True)],
                                                                           outs[(True, xs_on, False)]))

    # the skinny GEMM (int4_g64, 3 ≤ M ≤ 64 at N < 12288): its rank term as mma.sync (EPI_MMA) against the loop
    for shape in args.skinny.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        emit(M=m, N=n, K=k, impl="cublas_bf16", graph_us=cublas_us(m, n, k))
        sets = [w4.make_operands_v2("int4_g64", m, n, k, 32, 64, device="cuda", bias=True, seed=s)
                for s in range(rotated(n * k // 2))]
        ref = w4.reference_v2(sets[0]).cuda()
        outs = {}
        for epi in (False, True):
            def run(epi=epi, **s):
                return launch_w4a4_skinny(**s, epi_mma=epi)
            name = f"skinny_gemm:epi_{'mma' if epi else 'loop'}"
            outs[epi] = probe.checked(dict(M=m, N=n, K=k, fmt="int4_g64"), name, run, sets, ref)
        if outs[True] is not None and outs[False] is not None:
            mma, loop = outs[True].float(), outs[False].float()
            emit(M=m, N=n, K=k, impl="skinny_mma_vs_loop_rel", value=float((mma - loop).norm() / loop.norm()))
        del sets

    # the layer (act_quant + GEMM, impl="auto") as bench w4a4 times it, with the epilogue switched by env
    for shape in args.layer.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        prov = _providers(m, n, k, "cuda", impls=("auto", ))
        envs = {"cublas_bf16": [("1", "0", "0")],
                "w4a4_layer:int4_g64:auto": [("0", "0", "0"), ("1", "0", "0"), ("1", "1", "0"), ("1", "1", "1")],
                "w4a4_layer:int4_2l:auto": [("0", "0", "0"), ("1", "0", "0"), ("1", "0", "1")]}
        for name, combos in envs.items():
            fn, make, nbytes = prov[name]
            sets = [make() for _ in range(min(rotation_count(nbytes), 4))]
            for epi, xs, rb in combos:
                os.environ.update(LOWRANK_GEMM_DECODE_EPI_MMA=epi, LOWRANK_GEMM_DECODE_XAB_SMEM=xs,
                                  LOWRANK_GEMM_DECODE_ROW_BOX=rb)
                emit(M=m, N=n, K=k, impl=name + ("" if name.startswith("cublas") else f":epi{epi}:xab{xs}:box{rb}"),
                     graph_us=time_graph(fn, sets).median_us)
            del sets
    for var in ("EPI_MMA", "XAB_SMEM", "ROW_BOX"):
        os.environ.pop(f"LOWRANK_GEMM_DECODE_{var}", None)
    for shape in args.skinny.split(","):       # the int4_g64 layer where auto routes the skinny GEMM
        m, n, k = (int(v) for v in shape.split("x"))
        fn, make, nbytes = _providers(m, n, k, "cuda", impls=("auto", ))["w4a4_layer:int4_g64:auto"]
        sets = [make() for _ in range(min(rotation_count(nbytes), 4))]
        for epi in ("0", "1"):
            os.environ["LOWRANK_GEMM_SKINNY_EPI_MMA"] = epi
            emit(M=m, N=n, K=k, impl=f"w4a4_layer:int4_g64:auto:skinny_epi{epi}",
                 graph_us=time_graph(fn, sets).median_us)
        del sets
    os.environ.pop("LOWRANK_GEMM_SKINNY_EPI_MMA", None)
    probe.write()


if __name__ == "__main__":
    main()
