"""One-adapter multi-LoRA batches: bank mode against the multi-LoRA kernel's plan and the single-adapter LoRA op on the
same bytes, cuBLAS beside them, one process (session 21); ``--adapters D`` (session 22): batches of D adapters in
stacked bank mode, ``lora`` then being the op at rank next_pow2(D)·r on the D adapters' concatenated A / B.

    python scripts/probe_ml_bank.py --out DIR [--kn 4096x4096,4096x28672] [--ms 16,64] [--ranks 16,64] [--adapters 1]

Impls per (K, N, r, M), ids random over one bank slot and −1 (a quarter of the rows): ``cublas_base``; ``bank``
(``multi_lora_gemm`` with ``adapters=1``: the route); ``multi`` (the same call with the multi-LoRA plan passed in);
``lora`` (``lora_linear`` on that slot's A / B: what bank mode should cost, minus −1 rows); ``bank_wrong`` (bank mode
with a second adapter in the batch: the exact slow path's cost when the hint is wrong); ``--pins`` adds bank mode
under other LoRA plans (``strategy`` or ``strategy:BMxBNxBK[:stages]``, comma separated), each a ``bank[pin]`` row.
Writes ``probe_ml_bank.json``
(shared schema) and a markdown table; prints ratios to cuBLAS.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from lowrank_gemm.bench.common import device_meta, markdown_table, measure_copy_tbps, time_impl  # noqa: E402
from lowrank_gemm.bench.multilora import make_case  # noqa: E402
from lowrank_gemm.kernels import multilora_gemm as mg  # noqa: E402
from lowrank_gemm.kernels.epilogue import rank_block  # noqa: E402
from lowrank_gemm.kernels.lora_gemm import lora_linear  # noqa: E402


def parse_pin(spec: str):
    """"kloop:64x128x128:4" → (strategy, KernelConfig or None): the planner's config for that strategy unless tiles
    are named (block_r follows the rank)."""
    from lowrank_gemm.plan.config import KernelConfig
    parts = spec.split(":")
    if len(parts) == 1:
        return parts[0], None
    bm, bn, bk = (int(v) for v in parts[1].split("x"))
    cfg = KernelConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=8 if bm * bn >= 128 * 256 else 4,
                       num_stages=int(parts[2]) if len(parts) > 2 else 3)
    return parts[0], cfg


def case_rows(k, N, r, M, dev=None, timer=time_impl, pins=(), adapters=1):
    sets, distinct, _ = make_case(M, N, r, adapters, k, dev)
    dev = sets[0][0].device
    slots = torch.as_tensor(sorted(distinct), device=dev)
    x, w, bk, _ = sets[0]
    sc = float(bk.scales[slots[0]])  # every slot's scale is the bank's fill value: read once, outside any capture
    quarter = torch.arange(M, device=dev) % 4 == 3
    sets = [(x, w, bk, torch.where(quarter, -1, ids)) for x, w, bk, ids in sets]
    other = min(set(range(bk.bank_a.shape[0])) - set(int(v) for v in distinct))
    wrong = [(x, w, bk, torch.where(torch.arange(M, device=dev) == 0, other, ids)) for x, w, bk, ids in sets]
    plan = mg.choose_plan(M, N, k, r, bk.bank_a.shape[0], "gather", x.device, adapters=adapters)
    route = mg.bank_route(M, N, k, x, w, bk.bank_a, sets[0][3], adapters)
    d = len(distinct)

    def fused(**kw):
        return lambda x, w, bk, i: mg.multi_lora_gemm(x, w, bk.bank_a, bk.bank_b, bk.ranks, bk.scales, i,
                                                      mode="gather", validate=False, adapters=adapters,
                                                      b_clean=bk.B_ZERO_PADDED, **kw)

    # the D adapters as one of rank D·r (what stacked mode should cost), concatenated once per set, outside the timing
    lora_sets = [(x, w, (bk.bank_a[slots].reshape(d * r, k).contiguous(),
                         bk.bank_b[slots].permute(1, 0, 2).reshape(N, d * r).contiguous()), i) for x, w, bk, i in sets]
    impls = {
        "cublas_base": (lambda x, w, bk, i: torch.nn.functional.linear(x, w), sets),
        "bank": (fused(), sets),
        "multi": (fused(plan=plan), sets),
        "lora": (lambda x, w, ab, i: lora_linear(x, w, ab[0], ab[1], sc), lora_sets),
        "bank_wrong": (fused(), wrong),
    }
    for spec in pins:
        strategy, cfg = parse_pin(spec)
        if cfg is not None:
            cfg = cfg.replace(block_r=rank_block((1 << (adapters - 1).bit_length()) * r))
        impls[f"bank[{spec}]"] = (pinned_call(fused(), strategy, cfg), sets)
    x, w, bk, i = sets[0]
    ref = mg.multi_lora_gemm(x, w, bk.bank_a, bk.bank_b, bk.ranks, bk.scales, i, plan=plan).double()
    rows = []
    for name, (fn, s) in impls.items():
        if name.startswith("bank[") and route is None:
            continue
        try:
            t = timer(fn, s)
        except ValueError as exc:   # a pin the SMEM ledger rejects at this rank: reported, not fatal
            print(f"{name}: {exc}".splitlines()[0], flush=True)
            continue
        err = None
        if name in ("bank", "multi"):
            y = fn(*s[0]).double()
            err = ((y - ref).norm() / ref.norm()).item()
        rows.append({"suite": "probe_ml_bank", "impl": name, "M": M, "N": N, "K": k, "r": r, "dtype": "bf16",
                     "adapters": d, "route": route[0] if route else None, "rel_err_vs_multi": err, **t})
    base = rows[0]["graph_us"]
    for rw in rows:
        rw["vs_base"] = round(rw["graph_us"] / base, 3) if rw.get("graph_us") and base else None
    return rows


def pinned_call(fn, strategy, cfg):
    from lowrank_gemm.plan.planner import pinned

    def call(*a):
        with pinned(strategy=strategy, config=cfg):
            return fn(*a)
    return call


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--kn", default="4096x4096,4096x28672")
    ap.add_argument("--ms", default="16,64")
    ap.add_argument("--ranks", default="16,64")
    ap.add_argument("--pins", default="", help="extra bank-mode plans, e.g. kloop:64x128x128:4,persistent_static")
    ap.add_argument("--adapters", type=int, default=1, help="distinct adapters per batch (and the hint)")
    ap.add_argument("--dry", action="store_true", help="CPU interpreter, one call per impl, no timing (a smoke test)")
    args = ap.parse_args()
    dev, timer = None, time_impl
    if args.dry:
        dev = torch.device("cpu")
        timer = lambda fn, s: {"graph_us": float(fn(*s[0]).float().abs().mean()) + 1.0}    # noqa: E731
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = device_meta(None if args.dry else measure_copy_tbps())
    rows = []
    for kn in args.kn.split(","):
        k, N = (int(v) for v in kn.split("x"))
        for r in (int(v) for v in args.ranks.split(",")):
            for M in (int(v) for v in args.ms.split(",")):
                rows += case_rows(k, N, r, M, dev, timer, [p for p in args.pins.split(",") if p], args.adapters)
                print({rw["impl"]: rw["vs_base"] for rw in rows if (rw["K"], rw["N"], rw["r"], rw["M"]) == (k, N, r, M)},
                      k, N, r, M, flush=True)
                (out / "probe_ml_bank.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    impls = ["cublas_base", "bank", "multi", "lora", "bank_wrong"]
    table = []
    for key in sorted({(rw["K"], rw["N"], rw["r"], rw["M"]) for rw in rows}):
        by = {rw["impl"]: rw for rw in rows if (rw["K"], rw["N"], rw["r"], rw["M"]) == key}
        table.append([*key, by["bank"]["route"], *[by[i]["graph_us"] for i in impls],
                      *[by[i]["vs_base"] for i in impls[1:]],
                      " ".join(f"{i[5:-1]} {rw['vs_base']}" for i, rw in by.items() if i.startswith("bank["))])
    md = markdown_table(["K", "N", "r", "M", "route", *[f"{i} µs" for i in impls], *[f"{i} ×" for i in impls[1:]],
                         "bank under pins ×"], table)
    (out / "probe_ml_bank.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
