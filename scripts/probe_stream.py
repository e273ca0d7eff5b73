"""GPU probe (≤ ~90 s): what the decode layer could reach — the weight-streaming floor and PDL under CUDA graphs.

    PYTHONPATH=src python scripts/probe_stream.py --out $OUT

1. ``stream``: a plain Triton kernel that reads the decode GEMM's 58.7 MB of packed weights ([28672, 2048] uint8,
   K=4096 int4) once and writes one int32 per program, for several grid sizes / loads per step; next to torch's
   copy of the same bytes (read + write) and a 2 GiB copy (the bench's ``copy_tbps``). The fastest read is the
   floor the decode GEMM (issue 4: layer ≤ 23.6 µs) competes with.
2. ``pdl``: a small producer kernel P (~5 µs serial chain, writes v) and the streaming consumer C (reads the
   weights, then ``griddepcontrol.wait``, then adds v): graph replays of P, C, P→C, and P→C with PDL (P calls
   launch_dependents first, C launched with launch_pdl=True). C's output must include the fresh v of the same
   replay (v changes between replays: checked), and P→C with PDL should approach max(P, C) + a little.
Writes probe_stream.json / .md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from lowrank_gemm.bench.common import _bench, capture_graph, device_meta, measure_copy_tbps  # noqa: E402
from lowrank_gemm.kernels.pdl import gdc_launch_dependents, gdc_wait  # noqa: E402

N_ROWS, ROW_BYTES = 28672, 2048          # int4 weights of K=4096, N=28672


@triton.jit
def _stream_kernel(w_ptr, v_ptr, out_ptr, n_words, WORDS_PER_PROG, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    base = pid * WORDS_PER_PROG
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(0, WORDS_PER_PROG, BLOCK):
        idx = base + i + offs
        acc ^= tl.load(w_ptr + idx, mask=(idx < n_words) & (i + offs < WORDS_PER_PROG), other=0,
                       cache_modifier=".cg")
    total = tl.reduce(acc, 0, _xor)
    if PDL:
        gdc_wait()
    tl.store(out_ptr + pid, total + tl.load(v_ptr))


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _producer_kernel(src_ptr, v_ptr, STEPS: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    # a serial chain of dependent loads (~act_quant's shape: a few µs of latency, no bandwidth)
    i = tl.load(src_ptr)
    for _ in range(STEPS):
        i = tl.load(src_ptr + 1 + (i & 1023))
    tl.store(v_ptr, i + tl.load(src_ptr + 1100))


def _graph_time(calls, n=8):
    def run(times):
        for _ in range(times):
            for c in calls:
                c()
    _, g, _ = capture_graph(lambda: run(2), lambda: run(n))
    t = _bench(g.replay)
    return t.median_us / n, g


def _decode_at_flux():
    """3. Is a register-A kernel any good at FLUX sizes? The decode kernel (register-A e4m3, no warp
    specialization) at M=4608 with its largest token tile, beside v2 (checked against v2's output)."""
    from lowrank_gemm.kernels.gluon.w4a4_decode import launch_w4a4_decode
    from lowrank_gemm.kernels.gluon.w4a4_ws import launch_w4a4_v2, make_operands_v2
    from lowrank_gemm.plan.config import KernelConfig
    rows = []
    for (m, n, k) in ((4608, 12288, 3072), (4608, 3072, 12288)):
        ops = make_operands_v2("int4_g64", m, n, k, 32, device="cuda")
        pre = ops      # packed operands: both kernels run expand_act_f8 inside (~6 µs at fc1, in every row)
        ref = ops["out"].clone()
        launch_w4a4_v2(**dict(pre, out=ref))
        cands = [("v2", lambda o: launch_w4a4_v2(**dict(pre, out=o)))]
        for bn, bk, st, nw in ((64, 128, 4, 4), (64, 128, 3, 4), (128, 128, 4, 8), (64, 256, 2, 4)):
            cfg = KernelConfig(block_m=64, block_n=bn, block_k=bk, block_r=16, group_m=1, num_warps=nw,
                               num_stages=st, lowrank_stages=0, persistent=False)
            tag = f"decode 64x{bn}x{bk}x{st}w{nw}"
            cands.append((tag, lambda o, cfg=cfg: launch_w4a4_decode(
                pre["x_q"], pre["x_scale"], pre["w_q"], pre["w_scale"], None, pre["lowrank_act"], pre["lora_up"],
                pre["bias"], o, "int4_g64", 64, cfg, f8=True)))
        a8 = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b8 = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        cands.append(("fp8_scaled_mm", lambda o: torch._scaled_mm(a8, b8.t(), one, one, out_dtype=torch.bfloat16)))
        for tag, fn in cands:
            row = dict(test="flux_gemm", variant=tag, M=m, N=n, K=k)
            try:
                o = torch.full_like(ref, float("nan"))
                fn(o)
                torch.cuda.synchronize()
                if not tag.startswith("fp8"):
                    err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
                    row["rel_vs_v2"] = err
                    if not err < 1e-2:
                        raise RuntimeError(f"wrong: rel {err}")
                us, _ = _graph_time([lambda: fn(o)], n=3)
                row["us"] = round(us, 1)
            except Exception as exc:   # reported, not hidden
                row["error"] = f"{type(exc).__name__}: {exc}"[:200]
                row["us"] = None
            rows.append(row)
            print(row, flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--only-flux", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows = []
    if a.only_flux:
        rows = _decode_at_flux()
        (out / "probe_flux_decode.json").write_text(json.dumps({"meta": device_meta(), "rows": rows}, indent=1))
        return
    copy_tbps = measure_copy_tbps()
    nbytes = N_ROWS * ROW_BYTES
    ws = [torch.randint(-2**31, 2**31 - 1, (nbytes // 4,), device=dev, dtype=torch.int32) for _ in range(3)]
    v = torch.zeros(1, device=dev, dtype=torch.int32)
    n_words = nbytes // 4
    # 1. streaming floor
    for progs_per_sm in (1, 2, 4, 8, 16):
        for block in (1024, 2048, 4096):
            progs = sms * progs_per_sm
            wpp = triton.cdiv(triton.cdiv(n_words, progs), block) * block
            progs = triton.cdiv(n_words, wpp)
            outs = torch.empty(progs, device=dev, dtype=torch.int32)
            calls = [lambda w=w: _stream_kernel[(progs,)](w, v, outs, n_words, wpp, BLOCK=block, PDL=False,
                                                          num_warps=8 if block >= 2048 else 4) for w in ws]
            us, _ = _graph_time(calls, n=4)
            us /= len(ws)
            rows.append(dict(test="stream", progs=progs, block=block, us=round(us, 2),
                             tbps=round(nbytes / us / 1e6, 3)))
            print(rows[-1], flush=True)
    dst = torch.empty_like(ws[0])
    us, _ = _graph_time([lambda w=w: dst.copy_(w) for w in ws], n=4)
    us /= len(ws)
    rows.append(dict(test="torch_copy", us=round(us, 2), tbps=round(2 * nbytes / us / 1e6, 3)))
    print(rows[-1], flush=True)
    best = min((r for r in rows if r["test"] == "stream"), key=lambda r: r["us"])
    # 2. PDL: producer → streaming consumer
    src = torch.randint(0, 1024, (2048,), device=dev, dtype=torch.int32)
    progs, block = best["progs"], best["block"]
    wpp = triton.cdiv(triton.cdiv(n_words, progs), block) * block
    outs = torch.empty(progs, device=dev, dtype=torch.int32)

    def prod(pdl):
        _producer_kernel[(1,)](src, v, STEPS=24, PDL=pdl, num_warps=1, launch_pdl=pdl)

    def cons(pdl, w=ws[-1]):
        _stream_kernel[(progs,)](w, v, outs, n_words, wpp, BLOCK=block, PDL=pdl,
                                 num_warps=8 if block >= 2048 else 4, launch_pdl=pdl)

    def rot(pieces):             # one call per weight copy (rotation: 3 × 58.7 MB > L2)
        return [c for w in ws for c in pieces(w)]

    for name, calls in (("producer", rot(lambda w: [lambda: prod(False)])),
                        ("consumer", rot(lambda w: [lambda w=w: cons(False, w)])),
                        ("chain", rot(lambda w: [lambda: prod(False), lambda w=w: cons(False, w)])),
                        ("chain_pdl", rot(lambda w: [lambda: prod(True), lambda w=w: cons(True, w)]))):
        us, g = _graph_time(calls, n=4)
        us /= len(ws)
        row = dict(test="pdl", variant=name, us=round(us, 2))
        if name.startswith("chain"):
            # correctness: the consumer must add THIS replay's v (src changes between replays → v changes)
            ok = True
            for trial in range(3):
                src[1100] = 1000 * (trial + 1)
                g.replay()
                torch.cuda.synchronize()
                got = outs.clone()
                prod(False)                      # the value this replay's producer must have written
                cons(False)
                torch.cuda.synchronize()
                ok &= bool(torch.equal(got, outs))
            row["correct"] = ok
        rows.append(row)
        print(row, flush=True)
    rows += _decode_at_flux()
    meta = device_meta(copy_tbps)
    (out / "probe_stream.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# streaming floor + PDL probe ({meta.get('device')}, {meta.get('date')}, copy {copy_tbps:.3f} TB/s)",
             "", "| test | variant / progs×block | µs | TB/s | correct |", "|---|---|---|---|---|"]
    for r in rows:
        if r["test"] == "flux_gemm":
            lines.append(f"| flux {r['M']}x{r['N']}x{r['K']} | {r['variant']} | {r['us']} | | "
                         f"{r.get('rel_vs_v2', r.get('error', ''))} |")
            continue
        lines.append(f"| {r['test']} | {r.get('variant', '')}{r.get('progs', '')}{'×' + str(r['block']) if 'block' in r else ''}"
                     f" | {r['us']} | {r.get('tbps', '')} | {r.get('correct', '')} |")
    (out / "probe_stream.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
