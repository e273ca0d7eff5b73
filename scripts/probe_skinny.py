"""GPU probe (≤ ~3 min): the W4A4 skinny GEMM (kernels/w4a4_skinny.py, mma.sync from registers) at decode sizes —
correctness first (float64 reference, NaN-poisoned output, bit-identical repeat), then, in ONE process, CUDA-graph
medians next to cuBLAS bf16, fp8 ``_scaled_mm``, today's decode GEMM (e4m3 path, operands pre-expanded as the layer
feeds it) and the GEMV, two rotated operand sets.

    PYTHONPATH=src python scripts/probe_skinny.py --out $OUT [--cfgs "1,4,4;1,8,2/8"] [--ms 1,4,16,64]

A config is "rw,ks,kb[/block_t]". Writes probe_skinny.json / .md to --out.
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
SHAPES = [(28672, 4096), (4096, 4096)]      # (N, K): Llama-3-8B gate_up, o/qkv
CFGS = "1,4,2;4,1,4;4,1,2;2,1,4;8,1,2;2,2,2;1,2,4;4,1,4/8;8,1,2/8"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".")
    ap.add_argument("--cfgs", default=CFGS)
    ap.add_argument("--ms", default="1,2,3,4,8,16,32,64")
    ap.add_argument("--small-ms", default="4,16", help="M values for the shapes after the first")
    ap.add_argument("--layer", action="store_true", help="also time the layer op (act_quant + GEMM) per impl")
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES), help="NxK,NxK,…")
    args = ap.parse_args()
    import torch
    from lowrank_gemm.bench.common import device_meta, time_impl
    from lowrank_gemm.kernels import w4a4_gemv as gv
    from lowrank_gemm.kernels import w4a4_skinny as sk
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    from lowrank_gemm.kernels.gluon.w4a4_decode import launch_w4a4_decode
    from lowrank_gemm.kernels.w4_expand import expand_act_f8
    from lowrank_gemm.reference import lowrank_epilogue_ref, w4a4_gemm_ref

    cfgs = []
    for c in args.cfgs.split(";"):
        if c:
            cfg, _, bt = c.partition("/")
            cfgs.append((int(bt) if bt else None, sk.SkinnyConfig(*(int(v) for v in cfg.split(",")))))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, t0 = [], time.time()

    def emit(**row):
        rows.append(row)
        print("ROW " + json.dumps(row), flush=True)

    shapes = [tuple(int(v) for v in sh.split("x")) for sh in args.shapes.split(",")]
    for n, k in shapes:
        for m in (int(v) for v in args.ms.split(",")):
            if (n, k) != shapes[0] and str(m) not in args.small_ms.split(","):
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
            if args.layer:
                from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
                from lowrank_gemm.kernels.w4a4_gemm import w4a4_linear
                qw, sw = quantize_weight_int4(wb[0].float() * 0.02, 64)
                lw = (pack_int4(qw), sw, (torch.rand(k, device="cuda") + 0.5).to(torch.bfloat16),
                      (torch.randn(32, k, device="cuda") * 0.02).to(torch.bfloat16),
                      (torch.randn(n, 32, device="cuda") * 0.02).to(torch.bfloat16))
                for impl in ("auto", "decode", "skinny") + (("gemv", ) if m <= 4 else ()):
                    emit(**base, impl=f"layer:{impl}", **time_impl(
                        lambda a, i=impl: w4a4_linear(a, *lw, impl=i), [(a, ) for a in x]))
                del qw, sw, lw
            del x, wb, x8, w8
            pre = []
            for s in sets:
                xe, xab = expand_act_f8(s["x_q"], s["x_scale"], 64)
                pre.append(({**s, "x_q": xe, "x_scale": xab}, ))
            y = launch_w4a4_decode(**pre[0][0]).double()
            err = float((y - ref).abs().max() / ref.abs().max())
            emit(**base, impl="decode_gemm", err=err, **time_impl(lambda p: launch_w4a4_decode(**p), pre))
            if m <= 4:
                emit(**base, impl="gemv", **time_impl(lambda p: gv.launch_w4a4_gemv(**p), [(s, ) for s in sets]))
            for bt, cfg in cfgs:
                if bt is not None and m > bt:
                    continue
                name = "skinny:" + ",".join(map(str, cfg)) + (f"/{bt}" if bt else "")
                try:
                    o["out"].fill_(float("nan"))
                    y = sk.launch_w4a4_skinny(**o, config=cfg, block_t=bt).clone()
                    torch.cuda.synchronize()
                    err = float((y.double() - ref).abs().max() / ref.abs().max())
                    same = bool(torch.equal(sk.launch_w4a4_skinny(**o, config=cfg, block_t=bt), y))
                    ok = bool(torch.isfinite(y).all()) and err < 1e-2 and same
                    emit(**base, impl=name, err=err, same=same, ok=ok,
                         **(time_impl(lambda p, c=cfg, b=bt: sk.launch_w4a4_skinny(**p, config=c, block_t=b),
                                      [(s, ) for s in sets]) if ok else {}))
                except Exception as exc:
                    traceback.print_exc()
                    emit(**base, impl=name, error=f"{type(exc).__name__}: {exc}"[:300])
            del sets, pre
            torch.cuda.empty_cache()
    meta = device_meta()
    (out / "probe_skinny.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    lines = [f"# probe_skinny\n\n{meta} · wall {time.time() - t0:.0f} s\n",
             "| M | N | K | impl | graph µs | eager µs | ÷ cuBLAS bf16 | err |", "|---|---|---|---|---|---|---|---|"]
    cub = {(r["M"], r["N"], r["K"]): r.get("graph_us") for r in rows if r["impl"] == "cublas_bf16"}
    for r in rows:
        g, c = r.get("graph_us"), cub.get((r["M"], r["N"], r["K"]))
        lines.append(f"| {r['M']} | {r['N']} | {r['K']} | {r['impl']} | {g} | {r.get('median_us')} | "
                     f"{round(c / g, 2) if g and c else '—'} | {r.get('err', r.get('error', ''))} |")
    (out / "probe_skinny.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
