"""Where does W4A4 v2 int4_g64 leave v1 on the FLUX layer? (session 24: the no-expander route differed from v1 by
2.6e-4 relative at M=4608 in fp32 while it was bit-identical to the expander route on make_operands data at M=1024).

Every v2 route variant on the same act_quant outputs, against v1 and the float64 spec, twice each (determinism), with
the tiles where the difference lives. Run on the device: ``PYTHONPATH=src python3 scripts/diag_w4a4_route.py``.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
from lowrank_gemm.kernels.act_quant import act_quant
from lowrank_gemm.kernels.gluon import w4a4_ws as w4
from lowrank_gemm.kernels.w4a4_gemm import launch_w4a4_v1
from lowrank_gemm.reference import w4a4_gemm_ref

VARIANTS = {
    "e2_paired": dict(expanders=2),
    "e1": dict(expanders=1, paired=False),
    "e0_coop_inflight": dict(expanders=0, coop=True, inflight=True),
    "e0_coop": dict(expanders=0, coop=True, inflight=False),
    "e0_paired": dict(expanders=0, coop=False, paired=True, inflight=False),
    "e0_plain": dict(expanders=0, coop=False, paired=False, inflight=False),
    "e0_plain_inflight": dict(expanders=0, coop=False, paired=False, inflight=True),
    "e0_coop_inflight_wsf32": dict(expanders=0, coop=True, inflight=True, ws_f32=True),
}


def layer(m, n, k, r=32, g=64, seed=0, dev="cuda"):
    torch.manual_seed(seed)
    x = (torch.randn(m, k, device=dev) * torch.exp(torch.randn(k, device=dev) * 0.5)).bfloat16()
    smooth = (torch.rand(k, device=dev) + 0.5).bfloat16()
    w = torch.randn(n, k, device=dev) * 0.02
    qw, sw = quantize_weight_int4(w, g)
    return x, dict(smooth=smooth, lora_down=(torch.randn(r, k, device=dev) * 0.02).bfloat16(),
                   lora_up=(torch.randn(n, r, device=dev) * 0.02).bfloat16(), bias=torch.randn(n, device=dev).bfloat16(),
                   qweight=pack_int4(qw), wscales=sw)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def where(a, b, tile=128):
    """Tiles (tile x tile) whose max |a-b| exceeds 1e-3·max|b|: count, first few, and row/col spans."""
    d = (a.double() - b.double()).abs()
    thr = 1e-3 * b.double().abs().max().item()
    m, n = d.shape
    tm, tn = -(-m // tile), -(-n // tile)
    dp = torch.nn.functional.pad(d, (0, tn * tile - n, 0, tm * tile - m))
    tmax = dp.view(tm, tile, tn, tile).amax(dim=(1, 3))
    bad = (tmax > thr).nonzero().tolist()
    rows = (d > thr).any(dim=1).nonzero().flatten()
    cols = (d > thr).any(dim=0).nonzero().flatten()
    return dict(bad_tiles=len(bad), of=tm * tn, first=bad[:12], bad_elems=int((d > thr).sum()),
                rows=[int(rows.min()), int(rows.max()), int(rows.numel())] if rows.numel() else None,
                cols=[int(cols.min()), int(cols.max()), int(cols.numel())] if cols.numel() else None,
                max_abs=d.max().item())


def run(m, n, k, out_dtype, rank):
    x, p = layer(m, n, k, r=max(rank, 1))
    lora_down, lora_up = p["lora_down"][:rank], p["lora_up"][:, :rank]
    xq, xs, s = act_quant(x, p["smooth"], lora_down, 64, "int4_g64", p["wscales"].dtype)
    x8, xab, s8 = act_quant(x, p["smooth"], lora_down, 64, "int4_g64", p["wscales"].dtype, out="f8")
    lr = (s if rank else None, lora_up if rank else None)
    ref = w4a4_gemm_ref(xq, xs, p["qweight"], p["wscales"], *lr, p["bias"], group_size=64)
    o1 = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
    y1 = launch_w4a4_v1(xq, xs, p["qweight"], p["wscales"], None, *lr, p["bias"], o1, "int4_g64", 64).clone()
    res = dict(M=m, N=n, K=k, out=str(out_dtype), rank=rank, wscales=str(p["wscales"].dtype),
               v1_vs_ref=rel(y1, ref), s_equal=bool(torch.equal(s, s8)) if rank else None)
    outs = {}
    for name, kw in VARIANTS.items():
        for xin, sc, tag in ((xq, xs, ""), (x8, xab, "+f8in")):
            if tag and name != "e0_coop_inflight":
                continue
            ys = []
            for _ in range(2):
                o = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
                try:
                    ys.append(w4.launch_w4a4_v2(xin, sc, p["qweight"], p["wscales"], None, *lr, p["bias"], o,
                                                "int4_g64", 64, **kw).clone())
                except Exception as e:      # noqa: BLE001 — a diagnostic reports every variant
                    res[name + tag] = f"error: {type(e).__name__}: {e}"[:300]
                    break
            if len(ys) < 2:
                continue
            torch.cuda.synchronize()
            outs[name + tag] = ys[0]
            res[name + tag] = dict(repeat_equal=bool(torch.equal(ys[0], ys[1])), nan=int(ys[0].isnan().sum()),
                                   vs_v1=rel(ys[0], y1), vs_ref=rel(ys[0], ref),
                                   eq_e2=bool(torch.equal(ys[0], outs["e2_paired"])) if "e2_paired" in outs else None,
                                   where_vs_e2=where(ys[0], outs["e2_paired"]) if "e2_paired" in outs else None,
                                   where_vs_v1=where(ys[0], y1))
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    results = []
    for m, n, k, od, rank in [(4608, 3072, 3072, torch.float32, 32), (4608, 3072, 3072, torch.bfloat16, 32),
                              (4608, 3072, 3072, torch.float32, 0), (1024, 3072, 3072, torch.float32, 32),
                              (4608, 12288, 3072, torch.float32, 32)]:
        r = run(m, n, k, od, rank)
        print(json.dumps(r, indent=1), flush=True)
        results.append(r)
    with open(os.path.join(a.out, "diag_w4a4_route.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
