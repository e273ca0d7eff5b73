"""A/B of ``LoraOptions.s_words`` (S handed over as stamped words in the in-grid S-producer launches) on the op's
tuned decode plans, in one process: cuBLAS, ``auto`` with the option off and on, each checked against the float64
reference and for bit-identity between the two, then timed as CUDA-graph replays and paired against cuBLAS.

    PYTHONPATH=src python scripts/probe_s_words.py --out DIR [--points M:K:N:r,...] [--producers 2,4]

``--edits NAME:field=v,…;…``: the same for any KernelConfig fields (tile depth, stages) and LoraOptions fields
(``prefetch=true``).
``--producers``: also time, with the option on, the point's plan with that many in-grid S producers (as ``split``
where the plan is another strategy; skipped where the planner's feasibility check rejects it) — whether cells
tuned without producers under the counter protocol want them now.

Default points: the tuned S-producer plans (4096² and 8192², M = 1 / 16, r16) plus r8 / r64 at 4096² (whatever
their plans are: where a plan has no producers both rows run the same launches). Session 29 measured the handover
in the probe kernel only (probes/s29/call16): 14.7 → 13.8 / 13.9 µs at 4096², M = 1 / 16.
"""

from __future__ import annotations

import json

import torch
from _points import points_and_out, probe_parser   # scripts/_points.py (this script's folder is on sys.path)

from lowrank_gemm.bench.common import device_meta, paired_ratio, time_graph
from lowrank_gemm.bench.lora import SCALE, make_sets
from lowrank_gemm.kernels.lora_gemm import _OPTION_NAMES as LORA_OPTION_NAMES, _s_words_ok, lora_linear, lora_options
from lowrank_gemm.plan.planner import can_implement, pinned, plan_lora
from lowrank_gemm.reference import lora_linear_ref

DEFAULT_POINTS = [(M, K, K, r) for K in (4096, 8192) for M in (1, 16) for r in (16,)] + \
                 [(M, 4096, 4096, r) for M in (1, 16) for r in (8, 64)]


def parse_edits(spec: str) -> list[tuple[str, dict]]:
    """``NAME:field=v,field=v;…`` → [(NAME, {field: int or bool})]."""
    out = []
    for item in filter(None, spec.split(";")):
        name, _, fields = item.partition(":")
        vals = {}
        for f in filter(None, fields.split(",")):
            key, _, v = f.partition("=")
            vals[key.strip()] = {"true": True, "false": False}.get(v.strip().lower(), None)
            if vals[key.strip()] is None:
                vals[key.strip()] = int(v)
        out.append((name.strip(), vals))
    return out


def main():
    ap = probe_parser()
    ap.add_argument("--producers", default="")
    ap.add_argument("--edits", default="", help="NAME:field=v,field=v;… — the point's plan with those KernelConfig "
                                                "(or LoraOptions) fields set, run as split with s_words")
    args = ap.parse_args()
    points, out = points_and_out(args, DEFAULT_POINTS)
    rows = []
    for M, K, N, r in points:
        sets = make_sets(M, N, K, r, torch.bfloat16, "cuda")
        x, w, a, b, _ = sets[0]
        ref = lora_linear_ref(x, w, a, b, SCALE)
        cublas = lambda x, w, a, b, bs: x @ w.T  # noqa: E731
        base = dict(M=M, K=K, N=N, r=r)
        ys = {}
        fns = {}
        for words in (False, True):
            def fn(x, w, a, b, bs, words=words):
                with lora_options(s_words=words):
                    return lora_linear(x, w, a, b, SCALE)
            fns[words] = fn
            ys[words] = [fn(*sets[0]) for _ in range(2)]
        torch.cuda.synchronize()
        err = float((ys[True][0].double() - ref).norm() / ref.norm())
        same = all(torch.equal(ys[False][0], y) for y in ys[True] + ys[False])
        rows.append(dict(base, impl="cublas", graph_us=round(time_graph(cublas, sets).median_us, 3)))
        for words in (False, True):
            p = paired_ratio(fns[words], sets, cublas, sets)
            rows.append(dict(base, impl="auto s_words" if words else "auto", rel_err=round(err, 6),
                             bit_identical=same, graph_us=round(time_graph(fns[words], sets).median_us, 3), **p))
        start = len(rows) - 3
        variants = [(f"producers {n}", {"s_producers": n}) for n in [int(v) for v in args.producers.split(",") if v]]
        variants += parse_edits(args.edits)
        for name, fields in variants:
            strategy, cfg = plan_lora(M, N, K, r, torch.bfloat16, "cuda")
            opts = {k: v for k, v in fields.items() if k in LORA_OPTION_NAMES}
            cfg = cfg.replace(split_k=1, **{k: v for k, v in fields.items() if k not in opts})
            ok = can_implement("split", (M, N, K, r), cfg)
            if not ok:
                rows.append(dict(base, impl=name, skipped=str(ok.reason)))
                continue

            def fn(x, w, a, b, bs, cfg=cfg, opts=opts):
                with lora_options(**{"s_words": True, **opts}), pinned(strategy="split", config=cfg):
                    return lora_linear(x, w, a, b, SCALE)
            try:
                y = fn(*sets[0])
                torch.cuda.synchronize()
                with lora_options(**{"s_words": True, **opts}):
                    words = cfg.s_producers > 0 and _s_words_ok(cfg, x, r, False, None)
                rows.append(dict(base, impl=name, plan_was=strategy, words=words,
                                 rel_err=round(float((y.double() - ref).norm() / ref.norm()), 6),
                                 bit_identical=torch.equal(y, fn(*sets[0])),
                                 graph_us=round(time_graph(fn, sets).median_us, 3),
                                 **paired_ratio(fn, sets, cublas, sets)))
            except Exception as e:  # noqa: BLE001 — a variant that fails to compile or launch is a row, not the end
                rows.append(dict(base, impl=name, error=f"{type(e).__name__}: {e}"[:300]))
        for row in rows[start:]:
            print(json.dumps(row), flush=True)
        (out / "s_words.json").write_text(json.dumps({"meta": device_meta(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
