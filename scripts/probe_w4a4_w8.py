"""GPU probe (≤ ~3 min): the int4_g64 v2 GEMM without expander warps — weights expanded once per call into e4m3
offset nibbles that the loader TMAs into MAIN (``expanders=0``), with and without a second fp32 partial in flight
per consumer (``inflight``), with the consumers sharing each slot's weight tile (``coop``) — next to today's default (two expanders, paired), fp8 ``_scaled_mm`` and bf16 cuBLAS,
in one process at the FLUX shapes.

    PYTHONPATH=src python scripts/probe_w4a4_w8.py --out $OUT [--shapes fc1,fc2,sq,fc1b] [--quick] [--variants a,b]

Every row is the GEMM alone (activations pre-expanded once by ``expand_act_f8``; for the ``w8`` rows the weights
too, with the per-call expansion timed on its own row and in ``w8+expand``), CUDA-graph replay medians
(``bench.common.time_graph``). Before timing, each variant's output is compared with the default's: the same
exact partials and the same FMA order per element, so they must be bit-identical (``same`` column); the default's
normalized error against float64 is checked on the fc1 rows' first 256 tokens. Writes probe_w4a4_w8.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
RANK = 32
SHAPES = {"fc1": (4608, 12288, 3072), "fc2": (4608, 3072, 12288), "sq": (4608, 3072, 3072),
          "fc1b": (4608, 9216, 3072),       # name: M, N, K (issue 4's FLUX shapes)
          "dec16": (16, 28672, 4096), "dec64": (64, 28672, 4096), "dec256": (256, 28672, 4096)}   # decode (two expanders)
VARIANTS = {   # name: launch_w4a4_v2 options (f8 on for all; ws32 = fp32 w_scale rows, the no-expander default)
    "v2_default": dict(),
    "v2_ws_apart": dict(fuse_ws=False),      # the fp32 w_scale rows by a conversion launch of their own
    "v2_expanders2": dict(expanders=2),
    "w8_paired": dict(expanders=0, paired=True, inflight=False, ws_f32=False),
    "w8_paired_inflight": dict(expanders=0, paired=True, inflight=True, ws_f32=False),
    "w8_inflight": dict(expanders=0, paired=False, inflight=True, ws_f32=False),
    "w8_coop": dict(expanders=0, paired=False, inflight=False, coop=True, ws_f32=False),
    "w8_coop_inflight": dict(expanders=0, paired=False, inflight=True, coop=True, ws_f32=False),
    "w8_coop_ws32": dict(expanders=0, paired=False, inflight=False, coop=True, ws_f32=True),
    "w8_coop_inflight_ws32": dict(expanders=0, paired=False, inflight=True, coop=True, ws_f32=True),
    "w8_coop_inflight2_ws32": dict(expanders=0, paired=False, inflight=2, coop=True, ws_f32=True, ws_perm=False),
    "w8_coop_inflight2_ws32_perm": dict(expanders=0, paired=False, inflight=2, coop=True, ws_f32=True, ws_perm=True),
    "w8_coop_inflight4_ws32_perm": dict(expanders=0, paired=False, inflight=4, coop=True, ws_f32=True, ws_perm=True),
    "w8_coop_inflight4_ws32": dict(expanders=0, paired=False, inflight=4, coop=True, ws_f32=True, ws_perm=False),
    "w8_coop_inflight8_ws32": dict(expanders=0, paired=False, inflight=8, coop=True, ws_f32=True, ws_perm=False),
    # session 26, decode M (two expanders, paired): bytes in flight (RAW slots), narrower tiles (twice the tiles),
    # one expander
    "v2_raw8": dict(raw_stages=8),
    "v2_raw12": dict(raw_stages=12),
    "v2_raw16": dict(raw_stages=16),
    "v2_bn64": dict(config="bn64"),                  # "bn64": the default config with block_n = 64 (resolved in main)
    "v2_bn64_raw12": dict(config="bn64", raw_stages=12),
    "v2_ex1": dict(expanders=1),
    # session 28: four 64×64 consumer warpgroups sharing each slot (gluon/w4a4_quad.py)
    "w8_quad": dict(expanders=0, quad=True),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="fc1,fc2,sq,fc1b")
    ap.add_argument("--quick", action="store_true", help="fewer graph calls")
    ap.add_argument("--msweep", default="", help="M values at fc1's N, K: the default against the no-expander "
                                                 "variants with their per-call weight expansion (the routing rule)")
    ap.add_argument("--variants", default="", help="comma list of VARIANTS names to run (v2_default always runs)")
    args = ap.parse_args()
    if args.variants:
        keep = {"v2_default", *args.variants.split(",")}
        unknown = keep - set(VARIANTS)
        if unknown:
            ap.error(f"unknown variants {sorted(unknown)}; known: {sorted(VARIANTS)}")
        for v in list(VARIANTS):
            if v not in keep:
                del VARIANTS[v]
    import torch

    from lowrank_gemm.bench.common import device_meta, time_graph
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    from lowrank_gemm.kernels.gluon.smoke import normalized_error
    from lowrank_gemm.kernels.w4_expand import expand_act_f8, expand_w4
    for kw in VARIANTS.values():
        if kw.get("config") == "bn64":
            kw["config"] = w4.default_config_v2("int4_g64").replace(block_n=64)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    calls = 2 if args.quick else None
    for name in args.shapes.split(","):
        M, N, K = SHAPES[name]
        ops = w4.make_operands_v2("int4_g64", M, N, K, RANK, 64, device="cuda", bias=True)
        x8, xab = expand_act_f8(ops["x_q"], ops["x_scale"], 64)
        w8 = expand_w4(ops["w_q"], None, 64, "int4_g64", torch.float8_e4m3fn, offset=True)
        base = dict(ops, x_q=x8, x_scale=xab)
        outs = {}
        for v, kw in VARIANTS.items():
            o = torch.empty_like(ops["out"])
            extra = dict(w_f8=w8) if kw.get("expanders") == 0 else {}
            try:
                w4.launch_w4a4_v2(**dict(base, out=o), f8=True, **kw, **extra)
            except Exception as e:           # a variant the ledger / checks reject: say so, run the rest
                print(f"{name} {v}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            outs[v] = (o, extra)
        torch.cuda.synchronize()
        ref_o = outs["v2_default"][0]
        err = None
        if name == "fc1":
            sub = {k: (v[:256] if k in ("lowrank_act", "out") else v) for k, v in ops.items()}
            sub["x_q"] = ops["x_q"][:256]
            sub["x_scale"] = ops["x_scale"][:, :256].contiguous()
            err = normalized_error(ref_o[:256], w4.reference_v2(sub))
        fp8_x = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
        fp8_w = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        bx = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        bw = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        timed = {
            "fp8_scaled_mm": lambda: torch._scaled_mm(fp8_x, fp8_w.t(), one, one, out_dtype=torch.bfloat16),
            "cublas_bf16": lambda: bx @ bw.t(),
            "expand_w4_offset": lambda: expand_w4(ops["w_q"], None, 64, "int4_g64", torch.float8_e4m3fn,
                                                  out=w8, offset=True),
        }
        for v, kw in VARIANTS.items():
            if v not in outs:
                continue
            o, extra = outs[v]
            timed[v] = (lambda kw=kw, o=o, extra=extra:
                        w4.launch_w4a4_v2(**dict(base, out=o), f8=True, **kw, **extra))
        if "w8_quad" in outs:       # with its per-call weight expansion (fp32 w_scale rows from the same launch)
            timed["w8_quad+expand"] = (lambda o=outs["w8_quad"][0]:
                                       w4.launch_w4a4_v2(**dict(base, out=o), f8=True, expanders=0, quad=True))
        if "w8_coop" in outs:
            timed["w8_coop+expand"] = (lambda o=outs["w8_coop"][0]:
                                       w4.launch_w4a4_v2(**dict(base, out=o), f8=True, expanders=0, paired=False,
                                                         inflight=False, coop=True))
        res = {}
        for impl, fn in timed.items():
            t = time_graph(lambda fn=fn: fn(), [()], calls=calls)
            res[impl] = t.median_us
            same = None
            if impl in outs:
                same = bool(torch.equal(outs[impl][0], ref_o))
            row = dict(shape=name, M=M, N=N, K=K, impl=impl, graph_us=round(t.median_us, 2),
                       tops=round(2 * M * N * K / t.median_us / 1e6, 1), same_as_default=same,
                       err_default=None if err is None else round(err, 5))
            rows.append(row)
            print(row, flush=True)
    for m in [int(v) for v in args.msweep.split(",") if v]:
        _, N, K = SHAPES["fc1"]
        ops = w4.make_operands_v2("int4_g64", m, N, K, RANK, 64, device="cuda", bias=True)
        x8, xab = expand_act_f8(ops["x_q"], ops["x_scale"], 64)
        base = dict(ops, x_q=x8, x_scale=xab)
        for v, kw in VARIANTS.items():
            if v in ("w8_inflight", "w8_paired"):
                continue
            t = time_graph(lambda kw=kw: w4.launch_w4a4_v2(**base, f8=True, **kw), [()], calls=calls)
            row = dict(shape=f"fc1_m{m}", M=m, N=N, K=K, impl=v + ("+expand" if kw.get("expanders") == 0 else ""),
                       graph_us=round(t.median_us, 2), tops=round(2 * m * N * K / t.median_us / 1e6, 1),
                       same_as_default=None, err_default=None)
            rows.append(row)
            print(row, flush=True)
        fx = torch.randn(m, K, device="cuda").to(torch.float8_e4m3fn)
        fw = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        t = time_graph(lambda: torch._scaled_mm(fx, fw.t(), one, one, out_dtype=torch.bfloat16), [()], calls=calls)
        rows.append(dict(shape=f"fc1_m{m}", M=m, N=N, K=K, impl="fp8_scaled_mm", graph_us=round(t.median_us, 2),
                         tops=round(2 * m * N * K / t.median_us / 1e6, 1), same_as_default=None, err_default=None))
    meta = device_meta()
    (out_dir / "probe_w4a4_w8.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    lines = [f"# probe_w4a4_w8 — {meta.get('device')} · torch {meta.get('torch')} · triton {meta.get('triton')} · "
             f"{meta.get('date')} · commit {meta.get('commit')}", "",
             "| shape | impl | graph µs | TOPS | × fp8 | same as default |", "|---|---|---|---|---|---|"]
    fp8 = {r["shape"]: r["graph_us"] for r in rows if r["impl"] == "fp8_scaled_mm"}
    for r in rows:
        lines.append(f"| {r['shape']} | {r['impl']} | {r['graph_us']} | {r['tops']} | "
                     f"{round(r['graph_us'] / fp8[r['shape']], 3)} | {'' if r['same_as_default'] is None else r['same_as_default']} |")
    errs = [r for r in rows if r["err_default"] is not None]
    if errs:
        lines += ["", f"default's normalized error vs float64 (fc1, first 256 tokens): {errs[0]['err_default']}"]
    (out_dir / "probe_w4a4_w8.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
