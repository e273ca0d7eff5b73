"""Shared parts of the W4A4 decode-size probes (probe_gemv.py, probe_skinny.py, probe_decode_f16.py, …): the operand
sets and their float64 reference, the same-process baselines (cuBLAS bf16, fp8 ``_scaled_mm``, the decode GEMM on
pre-expanded e4m3 operands), a checked timing of one candidate, a random SVDQuant layer, and the JSON / Markdown
tables."""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path


class Probe:
    def __init__(self, out: str, name: str):
        self.out, self.name, self.rows, self.t0 = Path(out), name, [], time.time()
        self.out.mkdir(parents=True, exist_ok=True)

    def emit(self, **row):
        self.rows.append(row)
        print("ROW " + json.dumps(row), flush=True)

    def operands(self, m: int, n: int, k: int):
        """(two rotated int4_g64 operand sets, rank 32 + bias, the first set's float64 reference, row base)."""
        from lowrank_gemm.kernels.gluon import w4a4_ws as w4
        from lowrank_gemm.reference import lowrank_epilogue_ref, w4a4_gemm_ref
        sets = [w4.make_operands_v2("int4_g64", m, n, k, 32, 64, device="cuda", bias=True, seed=s) for s in range(2)]
        o = sets[0]
        ref = lowrank_epilogue_ref(w4a4_gemm_ref(o["x_q"], o["x_scale"], o["w_q"], o["w_scale"], group_size=64,
                                                 fmt="int4_g64"),
                                   o["lowrank_act"].to(o["lora_up"].dtype), o["lora_up"], bias=o["bias"])
        return sets, ref, dict(M=m, N=n, K=k, r=32)

    def baselines(self, base: dict, sets, ref, extra=None):
        """cuBLAS bf16 and fp8 ``_scaled_mm`` (no branch), ``extra(x_bf16_sets, w_bf16_sets)`` while the bf16
        operands exist, then the decode GEMM on pre-expanded e4m3 operands (as the layer feeds it)."""
        import torch
        from lowrank_gemm.bench.common import time_impl
        from lowrank_gemm.kernels.gluon.w4a4_decode import launch_w4a4_decode
        from lowrank_gemm.kernels.w4_expand import expand_act_f8
        m, n, k = base["M"], base["N"], base["K"]
        x = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        self.emit(**base, impl="cublas_bf16", **time_impl(lambda a, b: a @ b.T, list(zip(x, wb))))
        x8 = [a.to(torch.float8_e4m3fn) for a in x]
        w8 = [b.to(torch.float8_e4m3fn) for b in wb]
        one = torch.ones((), device="cuda")
        try:
            self.emit(**base, impl="fp8_scaled_mm", **time_impl(
                lambda a, b: torch._scaled_mm(a, b.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                list(zip(x8, w8))))
        except Exception as exc:
            self.emit(**base, impl="fp8_scaled_mm", error=str(exc)[:200])
        if extra is not None:
            extra(x, wb)
        del x, wb, x8, w8
        pre = []
        for s in sets:
            xe, xab = expand_act_f8(s["x_q"], s["x_scale"], 64)
            pre.append(({**s, "x_q": xe, "x_scale": xab}, ))
        y = launch_w4a4_decode(**pre[0][0]).double()
        err = float((y - ref).abs().max() / ref.abs().max())
        self.emit(**base, impl="decode_gemm", err=err, **time_impl(lambda p: launch_w4a4_decode(**p), pre))

    def checked(self, base: dict, name: str, launch, sets, ref):
        """NaN-poisoned output vs the float64 reference (< 1e-2) and a bit-identical repeat, then (if both hold) the
        graph timing of ``launch(**operands)`` over the rotated sets. Returns the first set's output (None if the
        launch raised), for comparisons between variants."""
        import torch
        from lowrank_gemm.bench.common import time_impl
        o = sets[0]
        try:
            o["out"].fill_(float("nan"))
            y = launch(**o).clone()
            torch.cuda.synchronize()
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            same = bool(torch.equal(launch(**o), y))
            ok = bool(torch.isfinite(y).all()) and err < 1e-2 and same
            self.emit(**base, impl=name, err=err, same=same, ok=ok,
                      **(time_impl(lambda p: launch(**p), [(s, ) for s in sets]) if ok else {}))
            return y
        except Exception as exc:
            traceback.print_exc()
            self.emit(**base, impl=name, error=f"{type(exc).__name__}: {exc}"[:300])
            return None

    def write(self):
        """<name>.json (device meta + rows) and <name>.md (graph µs, eager µs, speed-up over cuBLAS bf16)."""
        from lowrank_gemm.bench.common import device_meta
        meta = device_meta()
        (self.out / f"{self.name}.json").write_text(json.dumps(dict(meta=meta, rows=self.rows), indent=1))
        lines = [f"# {self.name}\n\n{meta} · wall {time.time() - self.t0:.0f} s\n",
                 "| M | N | K | impl | graph µs | eager µs | ÷ cuBLAS bf16 | err |", "|---|---|---|---|---|---|---|---|"]
        cub = {(r["M"], r["N"], r["K"]): r.get("graph_us") for r in self.rows if r["impl"] == "cublas_bf16"}
        for r in self.rows:
            g, c = r.get("graph_us"), cub.get((r["M"], r["N"], r["K"]))
            lines.append(f"| {r['M']} | {r['N']} | {r['K']} | {r['impl']} | {g} | {r.get('median_us')} | "
                         f"{round(c / g, 2) if g and c else '—'} | {r.get('err', r.get('error', ''))} |")
        (self.out / f"{self.name}.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))


def svdq_layer(m: int, n: int, k: int, r: int = 32, sets: int = 3):
    """A random int4_g64 SVDQuant layer at decode size (weights ~N(0, 0.02²) quantized, λ ∈ [0.5, 1.5), rank-r
    branch) → (``w4a4_linear`` keyword arguments, a bf16 bias, ``sets`` bf16 token batches [m, k] as 1-tuples for
    ``time_graph``); seeded by m + n, so every probe builds the same layer for a shape."""
    import torch
    from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
    g = torch.Generator(device="cuda").manual_seed(m + n)
    qw, sw = quantize_weight_int4(torch.randn(n, k, device="cuda", generator=g) * 0.02, 64)
    p = dict(qweight=pack_int4(qw), wscales=sw, smooth=(torch.rand(k, device="cuda", generator=g) + 0.5).bfloat16(),
             lora_down=(torch.randn(r, k, device="cuda", generator=g) * 0.02).bfloat16(),
             lora_up=(torch.randn(n, r, device="cuda", generator=g) * 0.02).bfloat16())
    bias = torch.randn(n, device="cuda", generator=g).bfloat16()
    return p, bias, [(torch.randn(m, k, device="cuda", generator=g).bfloat16(), ) for _ in range(sets)]


def graph_row(rows: list[dict], M: int, K: int, N: int, impl: str, fn, sets, err: float | None = None) -> None:
    """Append (and print as ``ROW {...}``) one row of :func:`write_err_table`'s table: ``fn``'s CUDA-graph median over
    the rotated input ``sets`` (``bench.common.time_graph``), and its error against the spec if given."""
    from lowrank_gemm.bench.common import time_graph
    t = time_graph(fn, sets).median_us
    x = dict(M=M, K=K, N=N, impl=impl, graph_us=round(t, 2), err=None if err is None else float(f"{err:.3g}"))
    rows.append(x)
    print("ROW", x, flush=True)


def write_err_table(name: str, meta: dict, rows: list[dict], out: str) -> None:
    """rows of (M, K, N, impl, graph_us, err) → OUT/<name>.{json,md} (bench.common's header and table), printed."""
    from lowrank_gemm.bench.common import markdown_table, meta_header, write_results
    md = meta_header(meta) + markdown_table(["M", "K", "N", "impl", "graph µs", "rel. err vs spec"],
                                            [[x["M"], x["K"], x["N"], x["impl"], x["graph_us"], x["err"]]
                                             for x in rows])
    write_results(name, meta, rows, out, md=md)
    print(md)


def timed_row(rows: list[dict], fields: dict, fn, sets) -> dict:
    """Append one row: ``fields`` plus ``bench.common.time_impl``'s eager and graph medians of ``fn`` over the rotated
    ``sets`` (or the error, which does not stop a sweep); printed as ``ROW``."""
    from lowrank_gemm.bench.common import time_impl
    try:
        r = {**fields, **time_impl(fn, sets)}
    except Exception as exc:
        r = {**fields, "error": f"{type(exc).__name__}: {exc}"[:200]}
    rows.append(r)
    print("ROW", " ".join(f"{k}={v}" for k, v in fields.items()), f"graph {r.get('graph_us')} µs",
          r.get("error", ""), flush=True)
    return r


def dump_rows(out: str | None, name: str, rows: list[dict]) -> None:
    """OUT/<name>.json with the device meta (no-op without ``out``)."""
    if out:
        import json
        from pathlib import Path
        from lowrank_gemm.bench.common import device_meta
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(json.dumps({"meta": device_meta(None), "rows": rows}, indent=1))
