"""GPU probe (≤ ~2 min): the W4A4 GEMV (kernels/w4a4_gemv.py) at decode sizes — correctness first, then, in ONE
process, CUDA-graph medians next to cuBLAS bf16, fp8 ``_scaled_mm`` and today's decode GEMM (e4m3 path, operands
pre-expanded as the layer feeds it), two rotated operand sets.

    PYTHONPATH=src python scripts/probe_gemv.py --out $OUT [--cfgs 32,64,4,1;16,64,2,1] [--ms 1,2,4]

Writes probe_gemv.json / .md to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
SHAPES = [(28672, 4096), (4096, 4096), (14336, 4096), (4096, 14336)]      # (N, K): Llama-3-8B gate_up, o/qkv, …
CFGS = ("t:16,64,2,1;g:16,64,2,1;g:32,64,4,1;g:16,128,4,1;g:32,128,4,1;g:64,64,8,1;g:16,32,1,1;g:32,32,2,1;"
        "g:64,128,4,1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".")
    ap.add_argument("--cfgs", default=CFGS)
    ap.add_argument("--ms", default="1,2,4")
    args = ap.parse_args()
    import torch
    from lowrank_gemm.bench.common import device_meta, time_impl
    from lowrank_gemm.kernels import w4a4_gemv as gv
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    from lowrank_gemm.kernels.gluon.w4a4_decode import launch_w4a4_decode
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    from lowrank_gemm.reference import lowrank_epilogue_ref, w4a4_gemm_ref

    kernels = {"g": "gluon", "t": "triton"}
    cfgs = [(kernels[c.split(":")[0]], gv.GemvConfig(*(int(v) for v in c.split(":")[1].split(","))))
            for c in args.cfgs.split(";") if c]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, t0 = [], time.time()

    def emit(**row):
        rows.append(row)
        print("ROW " + json.dumps(row), flush=True)

    for n, k in SHAPES:
        for m in (int(v) for v in args.ms.split(",")):
            if n != 28672 and m != 1:
                continue
            sets = [w4.make_operands_v2("int4_g64", m, n, k, 32, 64, device="cuda", bias=True, seed=s)
                    for s in range(2)]
            o = sets[0]
            ref = lowrank_epilogue_ref(w4a4_gemm_ref(o["x_q"], o["x_scale"], o["w_q"], o["w_scale"], group_size=64,
                                                     fmt="int4_g64"),
                                       o["lowrank_act"].to(o["lora_up"].dtype), o["lora_up"], bias=o["bias"])
            base = dict(M=m, N=n, K=k, r=32)
            x = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
            wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
            emit(**base, impl="cublas_bf16", **time_impl(lambda a, b: a @ b.T, list(zip(x, wb))))
            x8 = [a.to(torch.float8_e4m3fn) for a in x]
            w8 = [b.to(torch.float8_e4m3fn) for b in wb]
            one = torch.ones((), device="cuda")
            try:
                emit(**base, impl="fp8_scaled_mm", **time_impl(
                    lambda a, b: torch._scaled_mm(a, b.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                    list(zip(x8, w8))))
            except Exception as exc:
                emit(**base, impl="fp8_scaled_mm", error=str(exc)[:200])
            del x, wb, x8, w8
            pre = []
            for s in sets:
                xe, xab = expand_act_f8(s["x_q"], s["x_scale"], 64)
                pre.append(({**s, "x_q": xe, "x_scale": xab}, ))
            y = launch_w4a4_decode(**pre[0][0]).double()
            err = float((y - ref).abs().max() / ref.abs().max())
            emit(**base, impl="decode_gemm", err=err, **time_impl(lambda p: launch_w4a4_decode(**p), pre))
            for kern, cfg in cfgs:
                name = f"gemv:{kern}:" + ",".join(map(str, cfg))
                try:
                    o["out"].fill_(float("nan"))
                    y = gv.launch_w4a4_gemv(**o, config=cfg, kernel=kern).clone()
                    torch.cuda.synchronize()
                    err = float((y.double() - ref).abs().max() / ref.abs().max())
                    same = bool(torch.equal(gv.launch_w4a4_gemv(**o, config=cfg, kernel=kern), y))
                    ok = bool(torch.isfinite(y).all()) and err < 1e-2 and same
                    emit(**base, impl=name, err=err, same=same, ok=ok,
                         **(time_impl(lambda p, c=cfg, k=kern: gv.launch_w4a4_gemv(**p, config=c, kernel=k),
                                      [(s, ) for s in sets]) if ok else {}))
                except Exception as exc:
                    traceback.print_exc()
                    emit(**base, impl=name, error=f"{type(exc).__name__}: {exc}"[:300])
            del sets, pre
            torch.cuda.empty_cache()
    meta = device_meta()
    (out / "probe_gemv.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    lines = [f"# probe_gemv\n\n{meta} · wall {time.time() - t0:.0f} s\n",
             "| M | N | K | impl | graph µs | eager µs | ÷ cuBLAS bf16 | err |", "|---|---|---|---|---|---|---|---|"]
    cub = {(r["M"], r["N"], r["K"]): r.get("graph_us") for r in rows if r["impl"] == "cublas_bf16"}
    for r in rows:
        g, c = r.get("graph_us"), cub.get((r["M"], r["N"], r["K"]))
        lines.append(f"| {r['M']} | {r['N']} | {r['K']} | {r['impl']} | {g} | {r.get('median_us')} | "
                     f"{round(c / g, 2) if g and c else '—'} | {r.get('err', r.get('error', ''))} |")
    (out / "probe_gemv.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
