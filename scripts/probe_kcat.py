"""Probe: the ``kcat`` LoRA strategy ([x | scale·x·Aᵀ]·[W | B]ᵀ by cuBLAS) against cuBLAS base and ``auto``.

    PYTHONPATH=src python scripts/probe_kcat.py --out DIR [--cases 4096x28672x4096x16,...] [--xcat 64x8,16x8]

Per case (MxNxKxr, bf16, the bench's rotated input sets, one process), CUDA-graph replay medians of:
``cublas_base`` (x @ Wᵀ) and ``auto`` (lora_linear today), both also on the packed layout (``_packed``: W and B as
views of one [N, K + r_pad] buffer); ``kcat`` (the x-concat kernel + one cuBLAS GEMM over K + r_pad, on [W | B]
built once per set outside the timing); ``kcat_gemm`` (the GEMM alone on a prebuilt concat) and ``xcat`` (the
concat kernel alone: its default plan and the --xcat configs, rows x K slices). Every kcat result is checked
against the float64 reference first, and for a bit-identical repeat. Writes DIR/probe_kcat.{json,md}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

DEFAULT_CASES = ",".join(f"{M}x{N}x{K}x{r}" for (K, N) in ((4096, 28672), (8192, 8192), (4096, 4096))
                         for M in (256, 1024, 4096) for r in (8, 16, 64)) + \
    ",1x28672x4096x16,16x28672x4096x16,64x28672x4096x16,16x4096x4096x16,64x8192x8192x64"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--xcat", default="16x8,32x4,64x8", help="extra x-concat configs, rows x K slices")
    args = ap.parse_args()
    from lowrank_gemm.bench import lora as bl
    from lowrank_gemm.bench.common import device_meta, markdown_table, measure_copy_tbps, meta_header, time_graph
    from lowrank_gemm.kernels.lora_gemm import lora_linear
    from lowrank_gemm.kernels.lora_kcat import build_xcat, kcat_gemm, kcat_weight, r_padded

    meta = device_meta(measure_copy_tbps())
    rows = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for case in args.cases.split(","):
        M, N, K, r = map(int, case.split("x"))
        sets = bl.make_sets(M, N, K, r, torch.bfloat16, "cuda")
        rp = r_padded(r)
        wcats = [kcat_weight(w, b, rp) for (_, w, _, b, _) in sets]
        ksets = [(x, a, wc) for (x, _, a, _, _), wc in zip(sets, wcats)]
        x0, w0, a0, b0, _ = sets[0]
        ref = (x0.double() @ w0.double().T + bl.SCALE * (x0.double() @ a0.double().T) @ b0.double().T)
        # the packed layout ([W | B] in one buffer, W and B as views): what a module holding wcat passes
        psets = [(x, wc[:, :K], a, wc[:, K:K + r], bs) for (x, _, a, _, bs), wc in zip(sets, wcats)]
        impls = {"cublas_base": (lambda x, w, a, b, bs: x @ w.T, sets),
                 "cublas_base_packed": (lambda x, w, a, b, bs: x @ w.T, psets),
                 "auto": (lambda x, w, a, b, bs: lora_linear(x, w, a, b, bl.SCALE), sets),
                 "auto_packed": (lambda x, w, a, b, bs: lora_linear(x, w, a, b, bl.SCALE), psets)}
        def kcat(x, a, wc):
            xc = build_xcat(x, a, bl.SCALE, rp)
            return kcat_gemm(xc, wc, None, torch.empty(x.shape[0], wc.shape[0], dtype=x.dtype, device=x.device))
        y = kcat(*ksets[0])
        err = float((y.double() - ref).norm() / ref.norm())
        assert err < 1e-2, (case, err)
        assert torch.equal(y, kcat(*ksets[0])), (case, "kcat repeat not bit-identical")
        impls["kcat"] = (kcat, ksets)
        impls["xcat"] = (lambda x, a, wc: build_xcat(x, a, bl.SCALE, rp), ksets)
        for v in filter(None, args.xcat.split(",")):
            bm, sp = map(int, v.split("x"))
            impls[f"xcat_{v}"] = (lambda x, a, wc, bm=bm, sp=sp: build_xcat(x, a, bl.SCALE, rp, block_m=bm, split=sp),
                                  ksets)
        xcs = [(build_xcat(x, a, bl.SCALE, rp), wc) for (x, a, wc) in ksets]
        impls["kcat_gemm"] = (lambda xc, wc: xc @ wc.T, xcs)
        line = []
        for name, (fn, s) in impls.items():
            t = time_graph(fn, s).median_us
            rows.append({"M": M, "N": N, "K": K, "r": r, "impl": name, "graph_us": round(t, 2)})
            line.append(f"{name}={t:.1f}")
        base = next(rw["graph_us"] for rw in rows if rw["M"] == M and rw["N"] == N and rw["K"] == K and rw["r"] == r
                    and rw["impl"] == "cublas_base")
        for rw in rows:
            if (rw["M"], rw["N"], rw["K"], rw["r"]) == (M, N, K, r):
                rw["x_base"] = round(rw["graph_us"] / base, 3)
        print(f"M={M} N={N} K={K} r={r}  " + "  ".join(line), flush=True)
        del sets, wcats, ksets, xcs, psets
        torch.cuda.empty_cache()
    (out / "probe_kcat.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = "# probe_kcat\n\n" + meta_header(meta) + markdown_table(
        ["M", "N", "K", "r", "impl", "graph µs", "× cuBLAS base"],
        [[rw["M"], rw["N"], rw["K"], rw["r"], rw["impl"], rw["graph_us"], rw["x_base"]] for rw in rows])
    (out / "probe_kcat.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
