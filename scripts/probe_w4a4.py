"""GPU probe (≤ ~120 s): W4A4 v1 candidates side by side with the cuBLAS baselines, one process.

    PYTHONPATH=src python scripts/probe_w4a4.py --out $OUT [--write-tuned]

Shapes: FLUX fc1 (M=4608, N=12288, K=3072) and decode M=1 / M=64 (N=28672, K=4096), rank 32.
Rows: cublas_bf16, fp8_scaled_mm, int8_int_mm; act_quant per format (auto split vs split=1, the old
one-program-per-row-block behaviour); GEMM candidates per format (W4A4Plan variants). Every candidate
is checked first against reference.w4a4_gemm_ref in float64 (first ≤ 256 rows; rel err < 2e-2 with bf16
out) and skipped if it fails, raises, or the time budget is spent. Writes probe_w4a4.json / .md and
w4a4_tuned.json (winners per format and M bucket: m_max 16 ← M=1, 64 ← M=64, null ← fc1) to --out;
--write-tuned also merges it into src/lowrank_gemm/plan/tuned/w4a4_h200.json (entries of other
(fmt, m_max) buckets are kept), which plan_w4a4_full reads.

    PYTHONPATH=src python scripts/probe_w4a4.py --decode-only --out $OUT [--write-tuned]     (≤ 60 s)
        decode M=1 / 64 only: cublas_bf16, fp8_scaled_mm, act_quant (auto), ≤ 6 SWAP-AB candidates per
        format (bn128 = current default; block_k = 128/256/512: several groups per K step; bn64).
    PYTHONPATH=src python scripts/probe_w4a4.py --mainloop-only --out $OUT                 (≤ 120 s)
        GEMM main loops alone (issues 4/6): fc1, fc2, decode M=1/16/64, both formats, r=32: today's plan
        vs scale_tma vs expand (M > 64) vs fp8 _scaled_mm / cuBLAS bf16; then a decode scale_tma sweep
        (block_n 64/128 × num_stages 6/10/14). Priority order; whatever the budget does not reach is
        reported as skipped. Winners (total µs over the bucket's shapes) → w4a4_mainloop_tuned.json.
    PYTHONPATH=src python scripts/probe_w4a4.py --fc1-actquant --out $OUT                  (≤ 20 s)
        act_quant alone at M=4608, K=3072 and 12288, both formats, plan candidates (block_m, block_k,
        num_warps); bit-identity vs the torch quantizer on the first rows checked first. Winners go to
        act_quant_tuned.json (pin them as plan_act_quant's large-M defaults).
    PYTHONPATH=src python scripts/probe_w4a4.py --actquant-only --out $OUT                 (≤ 90 s)
        act_quant at decode: old split path (v1, 2–3 launches) vs fused with the ticketed K-split S
        (`fused_ticket`, session 3) vs fused default (rank-split S at M ≤ 16) at M ∈ {1, 16, 64} ×
        K ∈ {4096, 3072}, both formats, r = 32, next to a one-launch floor (torch.neg on X); then rank-split
        variants at K = 4096 (8 warps, 2 ranks / program, quant chunk 1024, rows per S program 1/4/8);
        then M = 4608 on the (unchanged) large-M path. Every candidate first checked on ALL rows: bytes and
        scales equal to the torch quantizer, S vs float64 (fails above 1e-4), a second call bit-identical,
        tickets back at 0. Writes probe_w4a4.json / .md, act_quant_ab.json (per fmt × M × K: µs per
        candidate, the winner) and act_quant_ab.md. Pin with LOWRANK_GEMM_ACT_QUANT_SMALL=v1|fused (M ≤ 64)
        and LOWRANK_GEMM_ACT_QUANT_FUSED_S=rank|ticket (fused S mode, every M).
    PYTHONPATH=src python scripts/probe_w4a4.py --actquant-large --out $OUT                (≤ 90 s)
        act_quant at M = 4608 (FLUX prefill), K ∈ {3072, 12288}, both formats, r = 32: v2 (today's default)
        vs v3 (fast path only in the loop, exact redo after it) at its default split and split 4/8/12/16, next
        to the byte floor (X read + q write at 4.27 TB/s). Every candidate first checked on ALL rows: bytes and
        scales == the torch quantizer, S == v2's S bit for bit (v3) and vs float64 (< 1e-4), a second call
        bit-identical. Writes probe_w4a4.json / .md, act_quant_large.json ({fmt:K: {label: µs, winner}}) and
        act_quant_large.md. Pin: LOWRANK_GEMM_ACT_QUANT_LARGE=v3 (+ LOWRANK_GEMM_ACT_QUANT_V3_WAVES=n, split
        = ceil(n·SMs / row blocks)).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from lowrank_gemm.bench.common import device_meta, markdown_table, time_impl
from lowrank_gemm.formats.int4 import pack_int4, quantize_act_int4, quantize_weight_int4
from lowrank_gemm.formats.int4_twolevel import pack_weight_2l, quantize_act_2l
from lowrank_gemm.kernels.act_quant import act_quant, plan_act_quant
from lowrank_gemm.kernels.w4a4_gemm import TUNED_PATH, W4A4Plan, launch_w4a4_v1, plan_w4a4, swap_config
from lowrank_gemm.plan.tuned import read_table
from lowrank_gemm.reference import w4a4_gemm_ref

RANK, G = 32, 64
SHAPES = [("fc1", 4608, 12288, 3072), ("decode", 1, 28672, 4096), ("decode", 64, 28672, 4096)]
BUDGET_S = 110.0
CHECK_ROWS = 256


DECODE_SHAPES = [("decode", 1, 28672, 4096), ("decode", 64, 28672, 4096)]
FC1_ACTQUANT_SHAPES = [("fc1_aq", 4608, 12288, 3072), ("fc2_aq", 4608, 3072, 12288)]
# act_quant candidates (block_m, block_k, num_warps); None = plan_act_quant's choice
ACTQUANT_CANDIDATES = {"auto": None, "bm32_bk64(v1 tiles)": (32, 64, 4), "bm64_bk64": (64, 64, 4),
                       "bm32_bk128": (32, 128, 4), "bm64_bk128_w8": (64, 128, 8), "bm64_bk256_w8": (64, 256, 8)}


def decode_candidates(m: int, fmt: str) -> dict[str, W4A4Plan]:
    """≤ 6 SWAP-AB plans: the current default (bn128, one group per K step) and wide K steps."""
    c = {}
    for name, bn, bk in (("swap_bn128", 128, None), ("swap_bn128_bk128", 128, 128), ("swap_bn128_bk256", 128, 256),
                         ("swap_bn128_bk512", 128, 512), ("swap_bn64_bk256", 64, 256), ("swap_bn64_bk512", 64, 512)):
        if m > 16 and bn == 64:
            continue  # M=64: 4 candidates keep the decode probe inside 60 s
        try:
            c[name] = W4A4Plan("swap_ab", swap_config(m, RANK, fmt, G, block_n=bn, block_k=bk))
        except Exception as exc:  # ledger refuses: reported by the caller as missing
            print(f"skip {fmt} {name}: {exc}", flush=True)
    return c


def candidates(m: int, n: int, k: int, fmt: str) -> dict[str, W4A4Plan]:
    std = plan_w4a4(m, n, k, RANK, fmt, G)
    c = {"std_noprefetch(old)": W4A4Plan("standard", std, prefetch=False),
         "std_prefetch": W4A4Plan("standard", std)}
    if m <= 64:
        c["swap_bn128"] = W4A4Plan("swap_ab", swap_config(m, RANK, fmt, G, block_n=128))
        c["swap_bn128_bk256"] = W4A4Plan("swap_ab", swap_config(m, RANK, fmt, G, block_n=128, block_k=256))
    else:
        c["swap_bm64_bn128"] = W4A4Plan("swap_ab", swap_config(64, RANK, fmt, G, block_n=128))
        c["std_128x256_w8"] = W4A4Plan("standard", std.replace(block_n=256, num_stages=3))
        if fmt == "int4_g64":
            c["std_fp8mma"] = W4A4Plan("standard", std, mma_fp8=True)
    return c


def _operands(m, n, k, fmt, dev):
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev) * 0.02
    smooth = (torch.rand(k, device=dev) + 0.5).to(torch.bfloat16)
    down = (torch.randn(RANK, k, device=dev) * 0.02).to(torch.bfloat16)
    up = (torch.randn(n, RANK, device=dev) * 0.02).to(torch.bfloat16)
    if fmt == "int4_g64":
        qw, sw = quantize_weight_int4(w, G)
        wq, wsc, wmul = pack_int4(qw), sw, None
    else:
        wq, wmul, wsc = pack_weight_2l(w, G)
    xq, xsc, s = act_quant(x, smooth, down, G, fmt)
    return dict(x=x, smooth=smooth, down=down, up=up, wq=wq, wsc=wsc, wmul=wmul, xq=xq, xsc=xsc, s=s)


def _rows_ref(o, fmt, rows):
    xq = o["xq"][:rows]
    xsc = o["xsc"][:, :rows].contiguous() if fmt == "int4_g64" else o["xsc"][:rows]
    return w4a4_gemm_ref(xq, xsc, o["wq"], o["wsc"], o["s"][:rows], o["up"], None, w_mul=o["wmul"],
                         group_size=G, fmt=fmt)


def _v1_candidate(o, m, n, fmt, plan, rr, ref, dev):
    """(fn, inputs, check) of one v1 GEMM plan on the quantized operands ``o``: ``check`` poisons the output,
    runs once and returns the first ``rr`` rows' error vs ``ref`` (NaN if any output is not finite)."""
    def fn(xq, xsc, wq, wsc, wmul, s, up, out):
        return launch_w4a4_v1(xq, xsc, wq, wsc, wmul, s, up, None, out, fmt, G, plan=plan)

    inputs = (o["xq"], o["xsc"], o["wq"], o["wsc"], o["wmul"], o["s"], o["up"],
              torch.empty(m, n, device=dev, dtype=torch.bfloat16))

    def check():
        inputs[-1].fill_(float("nan"))
        y = fn(*inputs)
        torch.cuda.synchronize()
        return float("nan") if not torch.isfinite(y).all() else _rel(y[:rr], ref)
    return fn, inputs, check


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _merge_tuned(tuned: dict) -> dict:
    """New entries replace the table's entries of the same (fmt, group_size, m_max); the others stay
    (a --decode-only run must not drop the prefill bucket)."""
    key = lambda e: (e["fmt"], e.get("group_size", 64), e.get("m_max"))  # noqa: E731
    old = read_table(TUNED_PATH).get("entries", []) if TUNED_PATH.exists() else []
    new_keys = {key(e) for e in tuned["entries"]}
    return {**tuned, "entries": [e for e in old if key(e) not in new_keys] + tuned["entries"]}


def _probe_actquant(record, dev) -> dict:
    """act_quant alone (FLUX fc1 / fc2 activations, both formats): bit-identity of the first rows vs the
    torch quantizer and S vs float64 first, then CUDA-graph time. Returns the winners per (fmt, K)."""
    best = {}
    for shape, m, n, k in FC1_ACTQUANT_SHAPES:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        smooth = (torch.rand(k, device=dev) + 0.5).to(torch.bfloat16)
        down = (torch.randn(RANK, k, device=dev) * 0.02).to(torch.bfloat16)
        rr = CHECK_ROWS
        xs = x[:rr].float() / smooth.float()
        s_ref = xs.double() @ down.double().T
        for fmt in ("int4_g64", "int4_2l"):
            q_ref = quantize_act_int4(xs, G) if fmt == "int4_g64" else quantize_act_2l(xs, G)
            for name, c in ACTQUANT_CANDIDATES.items():
                kw = {} if c is None else dict(block_m=c[0], block_k=c[1], num_warps=c[2])
                plan = plan_act_quant(m, k, G, dev, **{a: b for a, b in kw.items()})

                def fn(x, sm, d, kw=kw, fmt=fmt):
                    return act_quant(x, sm, d, G, fmt, **kw)

                def check(fn=fn, fmt=fmt, q_ref=q_ref):
                    xq, xsc, s = fn(x, smooth, down)
                    torch.cuda.synchronize()
                    if fmt == "int4_g64":
                        same = torch.equal(xq[:rr], pack_int4(q_ref[0])) and torch.equal(xsc[:, :rr], q_ref[1])
                    else:
                        same = torch.equal(xq[:rr], q_ref[0]) and torch.equal(xsc[:rr], q_ref[1])
                    if not same:
                        raise AssertionError("quantized activations differ from the torch quantizer")
                    rel = _rel(s[:rr], s_ref)
                    if not rel < 1e-5:
                        raise AssertionError(f"S rel err {rel:.3g} vs float64")
                    return rel

                row = record(shape, m, n, k, f"act_quant:{fmt}:{name}", fn, (x, smooth, down), check,
                             plan=plan._asdict())
                t = row.get("graph_us")
                bk = f"{fmt}:K={k}"
                if t and "error" not in row and (bk not in best or t < best[bk]["graph_us"]):
                    best[bk] = {"candidate": name, "graph_us": t, "plan": plan._asdict(),
                                "floor_us": round((m * k * 2 + m * k // (2 if fmt == "int4_g64" else 1)) / 4.27e6, 1)}
        del x, smooth, down
        torch.cuda.empty_cache()
    return best


MAINLOOP_SHAPES = [("decode", 1, 28672, 4096), ("decode", 64, 28672, 4096), ("fc1", 4608, 12288, 3072),
                   ("decode", 16, 28672, 4096), ("fc2", 4608, 3072, 12288)]


def _mainloop_candidates(m, n, k, fmt):
    from lowrank_gemm.kernels.w4a4_gemm import can_implement, expand_config, plan_w4a4_full
    today = plan_w4a4_full(m, n, k, RANK, fmt, G, torch.device("cuda"))
    c = {"today": today}
    tma = W4A4Plan(today.variant, today.config, today.mma_fp8, today.prefetch, True)
    if can_implement(tma.config, fmt, G, tma.variant, True):
        c["today_scale_tma"] = tma
    if m > 64:
        for name, kw in (("expand", {}), ("expand_bn128", {"block_n": 128}) if fmt == "int4_2l" else
                         ("expand_fp8", {"mma_fp8": True})):
            fp8 = kw.pop("mma_fp8", False)
            try:
                c[name] = W4A4Plan("expand", expand_config(RANK, fmt, G, **kw), mma_fp8=fp8)
            except Exception as exc:
                print(f"skip {fmt} {name}: {exc}", flush=True)
        if fmt == "int4_g64":
            c["expand_scale_tma"] = W4A4Plan("expand", expand_config(RANK, fmt, G, scale_tma=True), scale_tma=True)
    return c


def _decode_sweep(m, fmt):
    from lowrank_gemm.kernels.w4a4_gemm import can_implement
    c = {}
    for bn in (64, 128):
        for st in (6, 10, 14):
            cfg = swap_config(m, RANK, fmt, G, block_n=bn, max_stages=st, scale_tma=True)
            if cfg.num_stages == st and can_implement(cfg, fmt, G, "swap_ab", True):
                c[f"swap_tma_bn{bn}_s{st}"] = W4A4Plan("swap_ab", cfg, scale_tma=True)
    return c


def _recorder(rows: list, t0: float, budget: float):
    """``record(shape, m, n, k, impl, fn, inputs, check=None, **extra)``: check the candidate's error against
    the float64 reference (``check``), time it (CUDA-graph medians), append the row to ``rows`` and print it.
    A failure or an exhausted budget becomes the row's ``error``; it never stops the probe."""
    def record(shape, m, n, k, impl, fn, inputs, check=None, **extra):
        row = {"suite": shape, "M": m, "N": n, "K": k, "r": RANK, "impl": impl, **extra}
        if time.time() - t0 > budget:
            row["error"] = "skipped: probe time budget spent"
        else:
            try:
                if check is not None:
                    row["rel_err"] = check()
                    if not row["rel_err"] < 2e-2:
                        raise AssertionError(f"rel err {row['rel_err']:.3g} vs float64 reference")
                row.update(time_impl(fn, [inputs]))
            except Exception as exc:  # reported, never stops the rest
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                traceback.print_exc(limit=2)
        t = row.get("graph_us") or row.get("median_us")
        row["tops"] = round(2 * m * n * k / (t * 1e-6) / 1e12, 1) if t and "error" not in row else None
        rows.append(row)
        print(f"{shape:6s} M={m:5d} {impl:44s} graph {row.get('graph_us')} µs rel {row.get('rel_err')} "
              f"{row.get('error', '')}", flush=True)
        return row
    return record


def mainloop_only(out: Path, budget: float = 112.0) -> int:
    """--mainloop-only (see the module docstring). Self-contained: own rows, own files."""
    from lowrank_gemm.kernels.w4_expand import expand_w4
    dev = torch.device("cuda")
    torch.manual_seed(0)
    t0 = time.time()
    rows, per = [], {}  # per[(fmt, bucket)][name] = {shape: (µs, plan)}

    record = _recorder(rows, t0, budget)

    work = [(s, fmt, False) for s in MAINLOOP_SHAPES for fmt in ("int4_2l", "int4_g64")]
    work += [(s, fmt, True) for s in (MAINLOOP_SHAPES[1], MAINLOOP_SHAPES[0]) for fmt in ("int4_2l", "int4_g64")]
    baselined = set()
    for (shape, m, n, k), fmt, sweep in work:
        if time.time() - t0 > budget:
            rows.append({"suite": shape, "M": m, "impl": f"{fmt}:{'sweep' if sweep else 'main'}",
                         "error": "skipped: probe time budget spent"})
            continue
        if (shape, m) not in baselined:
            baselined.add((shape, m))
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
            record(shape, m, n, k, "cublas_bf16", lambda a, b: torch.nn.functional.linear(a, b), (x, w))
            one_m, one_n = torch.ones(m, 1, device=dev), torch.ones(1, n, device=dev)
            record(shape, m, n, k, "fp8_scaled_mm",
                   lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16),
                   (x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t(), one_m, one_n))
            del x, w
        try:
            o = _operands(m, n, k, fmt, dev)
            rr = min(m, CHECK_ROWS)
            ref = _rows_ref(o, fmt, rr)
            cands = _decode_sweep(m, fmt) if sweep else _mainloop_candidates(m, n, k, fmt)
        except Exception as exc:
            rows.append({"suite": shape, "M": m, "impl": f"operands:{fmt}", "error": repr(exc)[:300]})
            continue
        if m > 64 and not sweep:
            ed = torch.int8
            record(shape, m, n, k, f"expand_w4:{fmt}", lambda q, u: expand_w4(q, u, G, fmt, ed), (o["wq"], o["wmul"]),
                   floor_us=round(n * k * 1.5 / 4.27e6, 1))
        bucket = 16 if m <= 16 else 64 if m <= 64 else None
        for name, plan in cands.items():
            fn, inputs, check = _v1_candidate(o, m, n, fmt, plan, rr, ref, dev)
            row = record(shape, m, n, k, f"gemm:{fmt}:{name}", fn, inputs, check, plan=plan.to_dict())
            if row.get("graph_us") and "error" not in row:
                per.setdefault((fmt, bucket), {}).setdefault(name, {})[(shape, m)] = (row["graph_us"], plan)
        del o, ref
        torch.cuda.empty_cache()

    entries = []
    for (fmt, bucket), by_name in sorted(per.items(), key=lambda kv: (kv[0][0], kv[0][1] or 1 << 30)):
        shapes = set().union(*(set(v) for v in by_name.values()))
        full = {nm: v for nm, v in by_name.items() if set(v) == shapes} or by_name  # ran on every shape
        name = min(full, key=lambda nm: sum(t for t, _ in full[nm].values()))
        plan = next(iter(full[name].values()))[1]
        entries.append({"fmt": fmt, "group_size": G, "m_max": bucket, "probe_winner": name,
                        "graph_us": {f"{s}:M={mm}": t for (s, mm), (t, _) in full[name].items()},
                        "plan": plan.to_dict()})
    tuned = {"device": torch.cuda.get_device_name(0), "source": "scripts/probe_w4a4.py --mainloop-only",
             "entries": entries}
    out.mkdir(parents=True, exist_ok=True)
    (out / "w4a4_mainloop_tuned.json").write_text(json.dumps(tuned, indent=1))
    meta = device_meta()
    meta.update(wall_s=round(time.time() - t0, 1))
    (out / "probe_w4a4_mainloop.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    table = markdown_table(["suite", "M", "impl", "graph µs", "eager µs", "TOPS", "rel err", "error"],
                           [[r["suite"], r["M"], r["impl"], r.get("graph_us"), r.get("median_us"), r.get("tops"),
                             r.get("rel_err"), r.get("error", "")[:80]] for r in rows])
    (out / "probe_w4a4_mainloop.md").write_text(f"# probe_w4a4 --mainloop-only\n\n{meta}\n\n{table}\n")
    print(table)
    print("winners:", [(e["fmt"], e["m_max"], e["probe_winner"]) for e in entries])
    print(f"wall {time.time() - t0:.1f} s")
    return 0


# --actquant-only: the fused single launch (M ≤ 64 default) vs the old split path, priority order so
# that whatever the budget cuts is the least important: (1) at every decode shape: old v1 split path,
# the session-3 fused (ticketed K-split S, `fused_ticket`), today's default fused (rank-split S at M ≤ 16,
# ticket above) + the harness's one-launch floor; (2) fused variants at K = 4096 (per M); (3) M = 4608 on
# the large-M path (unchanged: shows no regression).
AB_DECODE_MS, AB_KS, AB_LARGE_M = (1, 16, 64), (4096, 3072), 4608
AB_MAIN = [("v1(old)", dict(variant="v1")), ("fused_ticket", dict(variant="fused", s_ranks=0)),
           ("fused", dict(variant="fused"))]
AB_VARIANTS = {
    1: [("fused_rank_w8", dict(variant="fused", s_ranks=1, num_warps=8)),
        ("fused_rank_rb2", dict(variant="fused", s_ranks=2)),
        ("fused_rank_qk1024", dict(variant="fused", s_ranks=1, quant_cols=1024))],
    16: [("fused_rank_sr1", dict(variant="fused", s_rows=1, s_ranks=1)),
         ("fused_rank_sr4", dict(variant="fused", s_rows=4, s_ranks=1)),
         ("fused_rank_w8", dict(variant="fused", s_ranks=1, num_warps=8))],
    64: [("fused_rank_sr4", dict(variant="fused", s_rows=4, s_ranks=1)),
         ("fused_rank_sr2", dict(variant="fused", s_rows=2, s_ranks=1)),
         ("fused_rank_sr8_w8", dict(variant="fused", s_rows=8, s_ranks=1, num_warps=8))],
}


def _probe_actquant_ab(record, dev) -> dict:
    """act_quant old (v1 split, 2–3 launches) vs fused (one launch). Every candidate first: all rows'
    bytes/scales == the torch quantizer, S vs float64 (< 1e-4), a second call bit-identical, the ticket
    buffer back at zero; then CUDA-graph time. Returns {"fmt:M=..:K=..": {label: graph_us, "winner": ..}}."""
    from lowrank_gemm.kernels.act_quant import _TICKETS
    table, cache = {}, {}

    def operands(m, k):
        if (m, k) not in cache:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            smooth = (torch.rand(k, device=dev) + 0.5).to(torch.bfloat16)
            down = (torch.randn(RANK, k, device=dev) * 0.02).to(torch.bfloat16)
            xs = x.float() / smooth.float()
            refs = {"s": xs.double() @ down.double().T}
            refs["int4_g64"] = (lambda q: (pack_int4(q[0]), q[1]))(quantize_act_int4(xs, G))
            refs["int4_2l"] = quantize_act_2l(xs, G)
            cache.clear()  # one shape's operands at a time
            cache[(m, k)] = (x, smooth, down, refs)
        return cache[(m, k)]

    def one(m, k, fmt, label, kw, rank0=False):
        x, smooth, down, refs = operands(m, k)
        if rank0:  # diagnostic: no low-rank branch → the quant units alone (how long is the S-free part?)
            down = down[:0]

        def fn(x, sm, d, kw=kw, fmt=fmt):
            return act_quant(x, sm, d, G, fmt, **kw)

        def check():
            xq, xsc, s = fn(x, smooth, down)
            s2 = fn(x, smooth, down)[2]
            torch.cuda.synchronize()
            q_ref = refs[fmt]
            if not (torch.equal(xq, q_ref[0]) and torch.equal(xsc, q_ref[1])):
                raise AssertionError(f"bytes differ from the torch quantizer ({(xq != q_ref[0]).sum().item()} elements)")
            if rank0:
                return 0.0
            if not torch.equal(s, s2):
                raise AssertionError("S differs between two calls")
            if any(int(t.abs().sum()) for t in _TICKETS.values()):
                raise AssertionError("ticket buffer not back at zero")
            rel = _rel(s, refs["s"])
            if not rel < 1e-4:
                raise AssertionError(f"S rel err {rel:.3g} vs float64")
            return rel

        try:
            plan = plan_act_quant(m, k, G, dev, fmt=fmt, rank=0 if rank0 else RANK, **kw)._asdict()
        except Exception as exc:
            plan = {"error": repr(exc)}
        row = record(f"aq_K{k}", m, RANK, k, f"act_quant:{fmt}:{label}", fn, (x, smooth, down), check, plan=plan)
        if row.get("graph_us") and "error" not in row:
            key = f"{'diag:' if rank0 else ''}{fmt}:M={m}:K={k}"
            table.setdefault(key, {})[label] = row["graph_us"]

    for k in AB_KS:
        for m in AB_DECODE_MS:
            x = operands(m, k)[0]
            row = record(f"aq_K{k}", m, RANK, k, "floor:one_launch(torch.neg)", lambda x: torch.neg(x), (x,))
            if row.get("graph_us"):
                table.setdefault(f"floor:M={m}:K={k}", {})["one_launch"] = row["graph_us"]
            for fmt in ("int4_2l", "int4_g64"):  # 2l first: the decode layer's format
                for label, kw in AB_MAIN:
                    one(m, k, fmt, label, kw)
    for m in AB_DECODE_MS:
        for fmt in ("int4_2l", "int4_g64"):
            for label, kw in AB_VARIANTS.get(m, []):
                one(m, 4096, fmt, label, kw)
    for m in (1, 16):
        for fmt in ("int4_2l", "int4_g64"):
            one(m, 4096, fmt, "fused_quant_only(r=0)", dict(variant="fused"), rank0=True)
    for k in AB_KS:
        for fmt in ("int4_g64", "int4_2l"):
            one(AB_LARGE_M, k, fmt, "auto(v2, unchanged)", {})
    for key, v in table.items():
        if v and not key.startswith(("floor", "diag")):
            v["winner"] = min(v, key=v.get)
    return table


def _ab_markdown(table: dict) -> str:
    """old v1 → session-3 fused (ticket S) → today's default fused per (fmt, K, M), the best fused
    variant, and the harness's one-launch floor."""
    lines = ["| fmt | K | M | old (v1) µs | fused_ticket µs | fused (default) µs | best variant | best µs | "
             "ticket/best | one-launch floor µs |", "|---|---|---|---|---|---|---|---|---|---|"]
    for fmt in ("int4_2l", "int4_g64"):
        for k in AB_KS:
            for m in AB_DECODE_MS:
                v = table.get(f"{fmt}:M={m}:K={k}", {})
                fused = {n: t for n, t in v.items() if n.startswith("fused")}
                best = min(fused, key=fused.get) if fused else None
                tk = v.get("fused_ticket")
                ratio = f"{tk / fused[best]:.2f}×" if tk and best else ""
                fl = table.get(f"floor:M={m}:K={k}", {}).get("one_launch")
                lines.append(f"| {fmt} | {k} | {m} | {v.get('v1(old)')} | {tk} | {v.get('fused')} | {best} | "
                             f"{fused.get(best) if best else None} | {ratio} | {fl} |")
    diag = [f"- {key[5:]}: quant units alone (r = 0, fused) {v.get('fused_quant_only(r=0)')} µs"
            for key, v in table.items() if key.startswith("diag:")]
    return "\n".join(lines) + "\n" + ("\n" + "\n".join(diag) + "\n" if diag else "")


# --actquant-large: v2 vs v3 at FLUX prefill (priority order: the default of each first, then v3 splits)
AQL_M, AQL_KS = 4608, (3072, 12288)
AQL_CANDS = [("v2", dict(variant="v2")), ("v3", dict(variant="v3"))] + [
    (f"v3_split{sp}", dict(variant="v3", split=sp)) for sp in (4, 6, 12, 16)]


def _probe_actquant_large(record, dev) -> dict:
    """act_quant v2 vs v3 at M=4608. Returns {"fmt:K=..": {label: graph_us, "floor": µs, "winner": label}}."""
    table = {}
    for k in AQL_KS:
        m = AQL_M
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        smooth = (torch.rand(k, device=dev) + 0.5).to(torch.bfloat16)
        down = (torch.randn(RANK, k, device=dev) * 0.02).to(torch.bfloat16)
        xs = x.float() / smooth.float()
        s_ref = xs.double() @ down.double().T
        for fmt in ("int4_g64", "int4_2l"):
            q_ref = quantize_act_int4(xs, G) if fmt == "int4_g64" else quantize_act_2l(xs, G)
            q_ref = (pack_int4(q_ref[0]), q_ref[1]) if fmt == "int4_g64" else q_ref
            key = f"{fmt}:K={k}"
            floor = round((m * k * 2 + m * k // (2 if fmt == "int4_g64" else 1)) / 4.27e6, 1)
            table[key] = {"floor": floor}
            v2_s = {}
            for label, kw in AQL_CANDS:
                def fn(x, sm, d, kw=kw, fmt=fmt):
                    return act_quant(x, sm, d, G, fmt, **kw)

                def check(fn=fn, fmt=fmt, q_ref=q_ref, label=label):
                    xq, xsc, s = fn(x, smooth, down)
                    s2 = fn(x, smooth, down)
                    torch.cuda.synchronize()
                    if not (torch.equal(xq, q_ref[0]) and torch.equal(xsc, q_ref[1])):
                        raise AssertionError(f"bytes differ from the torch quantizer "
                                             f"({(xq != q_ref[0]).sum().item()} elements)")
                    if not all(torch.equal(a, b) for a, b in zip((xq, xsc, s), s2)):
                        raise AssertionError("second call differs")
                    if label == "v2":
                        v2_s["s"], v2_s["split"] = s, plan_act_quant(m, k, G, dev, variant="v2").split
                    elif "s" in v2_s and plan_act_quant(m, k, G, dev, **kw).split == v2_s["split"] \
                            and not torch.equal(s, v2_s["s"]):
                        raise AssertionError("S differs from v2's at the same split")
                    rel = _rel(s, s_ref)
                    if not rel < 1e-4:
                        raise AssertionError(f"S rel err {rel:.3g} vs float64")
                    return rel

                try:
                    plan = plan_act_quant(m, k, G, dev, fmt=fmt, rank=RANK, **kw)._asdict()
                except Exception as exc:
                    plan = {"error": repr(exc)}
                row = record(f"aql_K{k}", m, RANK, k, f"act_quant:{fmt}:{label}", fn, (x, smooth, down), check,
                             plan=plan, floor_us=floor)
                if row.get("graph_us") and "error" not in row:
                    table[key][label] = row["graph_us"]
            v = {n: t for n, t in table[key].items() if n != "floor"}
            if v:
                table[key]["winner"] = min(v, key=v.get)
        del x, smooth, down, xs, s_ref
        torch.cuda.empty_cache()
    return table


def _aql_markdown(table: dict) -> str:
    labels = [lb for lb, _ in AQL_CANDS]
    lines = ["| fmt | K | byte floor µs | " + " | ".join(f"{lb} µs" for lb in labels) + " | winner | v2/winner |",
             "|---|---|---|" + "---|" * len(labels) + "---|---|"]
    for key, v in table.items():
        fmt, k = key.split(":K=")
        w = v.get("winner")
        ratio = f"{v['v2'] / v[w]:.2f}×" if w and v.get("v2") else ""
        lines.append(f"| {fmt} | {k} | {v.get('floor')} | " + " | ".join(str(v.get(lb)) for lb in labels)
                     + f" | {w} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--write-tuned", action="store_true", help=f"also merge winners into {TUNED_PATH}")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--decode-only", action="store_true", help="decode M=1/64 baselines + SWAP-AB candidates (≤ 60 s)")
    mode.add_argument("--fc1-actquant", action="store_true", help="act_quant alone at M=4608, K=3072/12288 (≤ 20 s)")
    mode.add_argument("--actquant-only", action="store_true",
                      help="act_quant old (v1) vs fused at M∈{1,16,64} × K∈{4096,3072}, both formats, + M=4608 "
                           "and fused variants (≤ 90 s)")
    mode.add_argument("--actquant-large", action="store_true",
                      help="act_quant v2 vs v3 (+ v3 splits) at M=4608, K∈{3072,12288}, both formats (≤ 90 s)")
    mode.add_argument("--mainloop-only", action="store_true",
                      help="GEMM main loops: today vs scale_tma vs expand vs fp8/bf16, + decode sweep (≤ 120 s)")
    args = ap.parse_args(argv)
    if args.mainloop_only:
        return mainloop_only(args.out)
    budget = (55.0 if args.decode_only else 18.0 if args.fc1_actquant else 78.0 if args.actquant_only
              else 75.0 if args.actquant_large else BUDGET_S)
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    t0 = time.time()
    rows, best = [], {}

    record = _recorder(rows, t0, budget)

    if args.actquant_only:
        ab = _probe_actquant_ab(record, dev)
        (args.out / "act_quant_ab.json").write_text(json.dumps(ab, indent=1))
        summary = _ab_markdown(ab)
        (args.out / "act_quant_ab.md").write_text("# act_quant: old (v1 split) vs fused (one launch: ticket S "
                                                  "vs rank-split S)\n\n" + summary)
        print(summary)
    if args.actquant_large:
        aql = _probe_actquant_large(record, dev)
        (args.out / "act_quant_large.json").write_text(json.dumps(aql, indent=1))
        summary = _aql_markdown(aql)
        (args.out / "act_quant_large.md").write_text("# act_quant at M=4608: v2 vs v3 (graph µs)\n\n" + summary)
        print(summary)
    if args.fc1_actquant:
        aq_best = _probe_actquant(record, dev)
        (args.out / "act_quant_tuned.json").write_text(json.dumps(aq_best, indent=1))
        print("act_quant winners:", aq_best)
    for shape, m, n, k in ([] if (args.fc1_actquant or args.actquant_only or args.actquant_large) else DECODE_SHAPES if args.decode_only else SHAPES):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        record(shape, m, n, k, "cublas_bf16", lambda a, b: torch.nn.functional.linear(a, b), (x, w))
        x8 = x.to(torch.float8_e4m3fn)
        w8 = w.to(torch.float8_e4m3fn).t()
        one_m, one_n = torch.ones(m, 1, device=dev), torch.ones(1, n, device=dev)
        record(shape, m, n, k, "fp8_scaled_mm",
               lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16), (x8, w8, one_m, one_n))
        if m > 16 and not args.decode_only:
            xi = torch.randint(-8, 8, (m, k), device=dev, dtype=torch.int8)
            wi = torch.randint(-8, 8, (n, k), device=dev, dtype=torch.int8).t()
            record(shape, m, n, k, "int8_int_mm", lambda a, b: torch._int_mm(a, b), (xi, wi))
        del x, w, x8, w8
        for fmt in ("int4_g64", "int4_2l"):
            try:
                o = _operands(m, n, k, fmt, dev)
            except Exception as exc:
                rows.append({"suite": shape, "M": m, "impl": f"operands:{fmt}", "error": repr(exc)[:300]})
                continue
            for tag, split in (("auto", None),) if args.decode_only else (("auto", None), ("split1(old)", 1)):
                record(shape, m, n, k, f"act_quant:{fmt}:{tag}",
                       lambda x, sm, d, split=split, fmt=fmt: act_quant(x, sm, d, G, fmt, split=split),
                       (o["x"], o["smooth"], o["down"]))
            rr = min(m, CHECK_ROWS)
            ref = _rows_ref(o, fmt, rr)
            cands = decode_candidates(m, fmt) if args.decode_only else candidates(m, n, k, fmt)
            for name, plan in cands.items():
                fn, inputs, check = _v1_candidate(o, m, n, fmt, plan, rr, ref, dev)
                row = record(shape, m, n, k, f"gemm:{fmt}:{name}", fn, inputs, check, plan=plan.to_dict())
                t = row.get("graph_us")
                key = (fmt, 16 if m == 1 else 64 if m <= 64 else None)
                if t and "error" not in row and (key not in best or t < best[key][0]):
                    best[key] = (t, name, plan)
            del o, ref
            torch.cuda.empty_cache()

    tuned = {"version": 1, "device": torch.cuda.get_device_name(0), "source": "scripts/probe_w4a4.py",
             "entries": [{"fmt": f, "group_size": G, "m_max": mm, "probe_winner": name, "graph_us": t,
                          "plan": plan.to_dict()} for (f, mm), (t, name, plan) in sorted(
                              best.items(), key=lambda kv: (kv[0][0], float("inf") if kv[0][1] is None else kv[0][1]))]}
    (args.out / "w4a4_tuned.json").write_text(json.dumps(tuned, indent=1))
    if args.write_tuned and tuned["entries"]:
        TUNED_PATH.write_text(json.dumps(_merge_tuned(tuned), indent=1))
    meta = device_meta()
    meta.update(wall_s=round(time.time() - t0, 1))
    (args.out / "probe_w4a4.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    table = markdown_table(["suite", "M", "impl", "graph µs", "eager µs", "TOPS", "rel err", "error"],
                           [[r["suite"], r["M"], r["impl"], r.get("graph_us"), r.get("median_us"), r.get("tops"),
                             r.get("rel_err"), r.get("error", "")[:80]] for r in rows])
    (args.out / "probe_w4a4.md").write_text(f"# probe_w4a4\n\n{meta}\n\n{table}\n")
    print(table)
    print("winners:", {f"{k[0]}:m_max={k[1]}": (v[1], v[0]) for k, v in best.items()})
    print(f"wall {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
