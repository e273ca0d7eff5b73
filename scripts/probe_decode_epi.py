"""Session 32: the W4A4 decode kernel's low-rank term as one wgmma (``epi_mma``) against the per-rank loop, the f8
path's a/b rows from a shared-memory table (``xab_smem``) against L2 loads in the K loop, and the rows' 2-D box
(``row_box``), and the skinny GEMM's rank term as mma.sync; same process, CUDA-graph replays over rotated operand sets, cuBLAS bf16 beside. Every timed variant is
first checked against the float64 reference (NaN-poisoned output, repeat bit-identical).

    PYTHONPATH=src python3 scripts/probe_decode_epi.py [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from lowrank_gemm.bench.common import device_meta, time_graph  # noqa: E402
from lowrank_gemm.kernels.gluon import w4a4_decode as d  # noqa: E402
from lowrank_gemm.kernels.gluon import w4a4_ws as w4  # noqa: E402
from lowrank_gemm.kernels.w4_expand import expand_act_f8  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/out/decode_epi")
    ap.add_argument("--shapes", default="16x28672x4096,4x28672x4096,16x4096x4096,64x28672x4096,16x4096x14336")
    ap.add_argument("--layer", default="16x28672x4096,4x28672x4096,64x28672x4096")
    ap.add_argument("--skinny", default="16x4096x4096,4x4096x4096,16x4096x14336,64x4096x4096")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []

    def emit(**row):
        rows.append(row)
        print("ROW " + json.dumps(row), flush=True)

    for shape in args.shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        x = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        emit(M=m, N=n, K=k, impl="cublas_bf16", us=time_graph(lambda a, b: a @ b.T, list(zip(x, wb))).median_us)
        del x, wb
        for fmt in ("int4_g64", "int4_2l"):
            if fmt == "int4_g64" and m > 16:
                continue        # auto takes v2 there; the decode kernel's f8 path keeps the loop at M > 16
            from lowrank_gemm.bench.common import rotation_count
            n_sets = min(8, max(2, rotation_count(n * k // 2)))     # one pass over the sets ≥ 3× the L2
            sets = [w4.make_operands_v2(fmt, m, n, k, 32, 64, device="cuda", bias=True, seed=s) for s in range(n_sets)]
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
                def run(s, epi=epi, xs=xs, rb=rb):
                    return d.launch_w4a4_decode(**s, epi_mma=epi, xab_smem=xs, row_box=rb)
                s0 = sets[0]
                s0["out"].fill_(float("nan"))
                y1 = run(s0).clone()
                y2 = run(s0).clone()
                err = ((y1.double() - ref).norm() / ref.norm()).item()
                ok = bool(torch.isfinite(y1).all()) and torch.equal(y1, y2) and err < 1e-2
                outs[(epi, xs, rb)] = y1
                us = time_graph(lambda s: run(s), [(s, ) for s in sets]).median_us if ok else None
                tag = f"epi_{'mma' if epi else 'loop'}" + ("" if xs is None else f":xab_{'smem' if xs else 'l2'}") \
                    + (":row_box" if rb else "")
                emit(M=m, N=n, K=k, fmt=fmt, impl=f"decode_gemm:{tag}", us=us, rel_err=err, ok=ok)
            if fmt == "int4_g64":
                emit(M=m, N=n, K=k, fmt=fmt, impl="xab_smem_vs_l2_equal",
                     value=bool(torch.equal(outs[(True, True, False)], outs[(True, False, False)])))
            xs_on = True if fmt == "int4_g64" else None
            emit(M=m, N=n, K=k, fmt=fmt, impl="row_box_equal",
                 value=bool(torch.equal(outs[(True, xs_on, True)], outs[(True, xs_on, False)])))

    # the skinny GEMM (int4_g64, 3 ≤ M ≤ 64 at N < 12288): its rank term as mma.sync (EPI_MMA) against the loop
    from lowrank_gemm.kernels.w4a4_skinny import launch_w4a4_skinny
    from lowrank_gemm.bench.common import rotation_count as _rc
    for shape in args.skinny.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        x = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(max(2, min(8, _rc(2 * n * k))))]
        emit(M=m, N=n, K=k, impl="cublas_bf16", us=time_graph(lambda a, b: a @ b.T, list(zip(x * 4, wb))).median_us)
        del x, wb
        sets = [w4.make_operands_v2("int4_g64", m, n, k, 32, 64, device="cuda", bias=True, seed=s)
                for s in range(min(8, max(2, _rc(n * k // 2))))]
        ref = w4.reference_v2(sets[0]).cuda()
        outs = {}
        for epi in (False, True):
            def run(s, epi=epi):
                return launch_w4a4_skinny(**s, epi_mma=epi)
            sets[0]["out"].fill_(float("nan"))
            y1 = run(sets[0]).clone()
            y2 = run(sets[0]).clone()
            err = ((y1.double() - ref).norm() / ref.norm()).item()
            ok = bool(torch.isfinite(y1).all()) and torch.equal(y1, y2) and err < 1e-2
            outs[epi] = y1.float()
            emit(M=m, N=n, K=k, fmt="int4_g64", impl=f"skinny_gemm:epi_{'mma' if epi else 'loop'}",
                 us=time_graph(lambda s: run(s), [(s, ) for s in sets]).median_us if ok else None, rel_err=err, ok=ok)
        emit(M=m, N=n, K=k, impl="skinny_mma_vs_loop_rel",
             value=float((outs[True] - outs[False]).norm() / outs[False].norm()))
        del sets

    # the layer (act_quant + GEMM, impl="auto") as bench w4a4 times it, with the epilogue switched by env
    import os
    from lowrank_gemm.bench.common import rotation_count
    from lowrank_gemm.bench.w4a4 import _providers
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
                     us=time_graph(fn, sets).median_us)
            del sets
    for var in ("EPI_MMA", "XAB_SMEM", "ROW_BOX"):
        os.environ.pop(f"LOWRANK_GEMM_DECODE_{var}", None)
    for shape in args.skinny.split(","):       # the int4_g64 layer where auto routes the skinny GEMM
        m, n, k = (int(v) for v in shape.split("x"))
        fn, make, nbytes = _providers(m, n, k, "cuda", impls=("auto", ))["w4a4_layer:int4_g64:auto"]
        sets = [make() for _ in range(min(rotation_count(nbytes), 4))]
        for epi in ("0", "1"):
            os.environ["LOWRANK_GEMM_SKINNY_EPI_MMA"] = epi
            emit(M=m, N=n, K=k, impl=f"w4a4_layer:int4_g64:auto:skinny_epi{epi}", us=time_graph(fn, sets).median_us)
        del sets
    os.environ.pop("LOWRANK_GEMM_SKINNY_EPI_MMA", None)
    (out / "probe_decode_epi.json").write_text(json.dumps({"meta": device_meta(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
