"""GPU probe (≈ 4 min): does the SHAPE of each TMA box decide how fast a memory-bound kernel streams its weights?

    PYTHONPATH=src python scripts/probe_box.py --out $OUT [--parts stream,gemm]

Why: every small-M kernel we have streams weights in boxes of [rows, 128 bytes] per K step (LoRA kloop at M ≤ 64:
[256, 64] bf16; W4A4 decode: [128, 128] packed bytes), i.e. 128 bytes from each of hundreds of rows that lie
K·bytes apart, and the next 128 bytes of the same rows a whole step later. cuBLAS bf16 gets 79 % of the copy
bandwidth at M=1 (N=28672, K=4096), our LoRA kloop 72 %, the decode GEMM ~60 %, while a plain linear read of the
decode weights reaches 3.6 TB/s (probe_stream). Hypothesis: short per-row runs cost DRAM efficiency, and a
TILED weight layout — each (row tile, K step) box stored contiguously, ``[N/BN, K/BK, BN, BK]`` — or longer rows
per box recover it.

1. ``stream``: a TMA box reader (xor-reduce, no MMA) over 235 MB (bf16 [28672, 4096]) and 58.7 MB ([28672, 2048]
   bytes, the int4 decode weights) with box [BN, BK] ∈ {64, 128, 256}² (int16 elements: rows of 128–512 B), split
   into 1, 2 or 4 programs per row tile, in the row-major and in the tiled layout.
2. ``gemm``: a swap-AB bf16 GEMM (acc[BN, BT] = W_tile · X_tileᵀ, tokens as the wgmma N) with the same two
   layouts, BN ∈ {64, 128}, BK ∈ {64, 128, 256}, split-K ∈ {1, 2, 4} (fp32 partials to a workspace, summed by
   torch for the check only — the time excludes a split-K fixup), at M ∈ {1, 16, 64} for (K, N) ∈ {(4096, 28672),
   (4096, 4096), (8192, 8192)}; cuBLAS bf16 (F.linear) in the same process. Every row is checked against an fp32
   matmul (NaN-poisoned workspace) before it is timed.
Writes probe_box.json / probe_box.md.
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
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from lowrank_gemm.bench.common import device_meta, measure_copy_tbps, rotation_count, time_graph  # noqa: E402

SMEM_BUDGET = 220 * 1024


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _box_stream_kernel(desc, out_ptr, steps, SPLIT: tl.constexpr, TILED: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    tile = pid // SPLIT
    per = steps // SPLIT
    lo = (pid % SPLIT) * per
    acc = tl.zeros([BN], tl.int32)
    for s in tl.range(lo, lo + per, num_stages=STAGES):
        if TILED:
            t = desc.load([(tile * steps + s) * BN, 0])
        else:
            t = desc.load([tile * BN, s * BK])
        acc ^= tl.reduce(t.to(tl.int32), 1, _xor)
    tl.store(out_ptr + pid * BN + tl.arange(0, BN), acc)


@triton.jit
def _swap_gemm_kernel(w_desc, x_desc, ws_ptr, M, N, steps, SPLIT, TILED: tl.constexpr, BN: tl.constexpr,
                      BT: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_t = tl.program_id(2)
    per = tl.cdiv(steps, SPLIT)
    lo = pid_k * per
    hi = tl.minimum(lo + per, steps)
    acc = tl.zeros([BN, BT], tl.float32)
    for s in tl.range(lo, hi, num_stages=STAGES):
        if TILED:
            w = w_desc.load([(pid_n * steps + s) * BN, 0])
        else:
            w = w_desc.load([pid_n * BN, s * BK])
        x = x_desc.load([pid_t * BT, s * BK])
        acc = tl.dot(w, x.T, acc)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_t = pid_t * BT + tl.arange(0, BT)
    ptrs = ws_ptr + pid_k * M * N + offs_t[None, :] * N + offs_n[:, None]
    tl.store(ptrs, acc, mask=(offs_t[None, :] < M) & (offs_n[:, None] < N))


def tiled(w: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    """[N, K] → [N/BN · K/BK · BN, BK]: box (tile, step) is rows (tile·steps + step)·BN .. +BN, contiguous."""
    n, k = w.shape
    return w.view(n // bn, bn, k // bk, bk).permute(0, 2, 1, 3).contiguous().view(-1, bk)


def part_stream(rows, sms):
    for label, (n, k) in (("bf16 28672x4096 (235 MB)", (28672, 4096)), ("int4 28672x4096 (58.7 MB)", (28672, 1024))):
        base = torch.randint(-2**15, 2**15 - 1, (n, k), device="cuda", dtype=torch.int16)
        reps = rotation_count(base.numel() * 2)
        for bn in (64, 128, 256):
            for bk in (64, 128, 256):
                box = bn * bk * 2
                stages = min(4, SMEM_BUDGET // box)
                if stages < 2:
                    continue
                steps = k // bk
                layouts = {"rowmajor": [base] + [base.clone() for _ in range(reps - 1)]}
                layouts["tiled"] = [tiled(w, bn, bk) for w in layouts["rowmajor"]]
                for split in (1, 2, 4):
                    if steps % split:
                        continue
                    for lay, ws in layouts.items():
                        progs = (n // bn) * split
                        out = torch.empty(progs * bn, device="cuda", dtype=torch.int32)
                        descs = [TensorDescriptor.from_tensor(w, [bn, bk]) for w in ws]

                        def run(d):
                            _box_stream_kernel[(progs,)](d, out, steps, SPLIT=split, TILED=lay == "tiled", BN=bn,
                                                         BK=bk, STAGES=stages, num_warps=4)
                        row = dict(part="stream", data=label, layout=lay, BN=bn, BK_bytes=bk * 2, split=split,
                                   stages=stages, programs=progs, progs_per_sm=round(progs / sms, 2))
                        try:
                            t = time_graph(run, [(d,) for d in descs])
                            row.update(us=round(t.median_us, 2), tbps=round(n * k * 2 / t.median_us / 1e6, 3))
                        except Exception as exc:   # reported, not hidden
                            row.update(us=None, error=f"{type(exc).__name__}: {exc}"[:200])
                        rows.append(row)
                        print(row, flush=True)
                del layouts
        del base
        torch.cuda.empty_cache()


GEMM_CFGS = ((128, 64), (128, 128), (128, 256), (64, 128), (64, 256))   # (BN, BK)


def part_gemm(rows):
    for (k, n) in ((4096, 28672), (4096, 4096), (8192, 8192)):
        w0 = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
        reps = rotation_count(w0.numel() * 2)
        ws = [w0] + [w0.clone() for _ in range(reps - 1)]
        for m in (1, 16, 64):
            bt = 16 if m <= 16 else 64
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            ref = x.float() @ w0.float().t()
            t = time_graph(lambda w: torch.nn.functional.linear(x, w), [(w,) for w in ws])
            cub = t.median_us
            rows.append(dict(part="gemm", M=m, N=n, K=k, impl="cublas", us=round(cub, 2),
                             tbps=round(n * k * 2 / cub / 1e6, 3)))
            print(rows[-1], flush=True)
            for bn, bk in GEMM_CFGS:
                per_stage = (bn + bt) * bk * 2
                stages = min(6, SMEM_BUDGET // per_stage)
                steps = k // bk
                tws = [tiled(w, bn, bk) for w in ws]
                for lay, mats in (("rowmajor", ws), ("tiled", tws)):
                    wd = [TensorDescriptor.from_tensor(w, [bn, bk]) for w in mats]
                    xd = TensorDescriptor.from_tensor(x, [bt, bk])
                    for split in (1, 2, 4):
                        part = torch.full((split, m, n), float("nan"), device="cuda")
                        grid = (n // bn, split, triton.cdiv(m, bt))

                        def run(d):
                            _swap_gemm_kernel[grid](d, xd, part, m, n, steps, split, TILED=lay == "tiled", BN=bn,
                                                    BT=bt, BK=bk, STAGES=stages, num_warps=4)
                        row = dict(part="gemm", M=m, N=n, K=k, impl=f"swapab {bn}x{bk}x{stages} split{split}",
                                   layout=lay, BN=bn, BK=bk, stages=stages, split=split, programs=grid[0] * split)
                        try:
                            run(wd[0])
                            torch.cuda.synchronize()
                            err = ((part.sum(0) - ref).norm() / ref.norm()).item()
                            row["rel_err"] = float(f"{err:.2e}")
                            if not err < 1e-2:
                                raise RuntimeError(f"wrong result: rel err {err}")
                            t = time_graph(run, [(d,) for d in wd])
                            row.update(us=round(t.median_us, 2), x_cublas=round(t.median_us / cub, 3),
                                       tbps=round(n * k * 2 / t.median_us / 1e6, 3))
                        except Exception as exc:   # reported, not hidden
                            row.update(us=None, error=f"{type(exc).__name__}: {exc}"[:200])
                        rows.append(row)
                        print(row, flush=True)
                del tws
        del ws, w0
        torch.cuda.empty_cache()


def write_md(path: Path, meta: dict, rows: list):
    lines = [f"# TMA box shape / weight layout probe\n", f"{meta}\n"]
    lines.append("## stream (xor-read of the weights through TMA boxes)\n")
    lines.append("| data | layout | BN | row bytes | split | stages | progs/SM | µs | TB/s |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["part"] == "stream":
            lines.append(f"| {r['data']} | {r['layout']} | {r['BN']} | {r['BK_bytes']} | {r['split']} | {r['stages']} | "
                         f"{r['progs_per_sm']} | {r.get('us')} | {r.get('tbps', r.get('error'))} |")
    lines.append("\n## swap-AB bf16 GEMM (no split-K fixup) vs cuBLAS\n")
    lines.append("| M | N | K | impl | layout | µs | × cuBLAS | TB/s | rel err |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["part"] == "gemm":
            lines.append(f"| {r['M']} | {r['N']} | {r['K']} | {r['impl']} | {r.get('layout', '')} | {r.get('us')} | "
                         f"{r.get('x_cublas', '')} | {r.get('tbps', r.get('error'))} | {r.get('rel_err', '')} |")
    path.write_text("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--parts", default="stream,gemm")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    meta = device_meta(measure_copy_tbps())
    rows: list = []
    try:
        if "stream" in a.parts:
            part_stream(rows, sms)
        if "gemm" in a.parts:
            part_gemm(rows)
    finally:
        (out / "probe_box.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        write_md(out / "probe_box.md", meta, rows)


if __name__ == "__main__":
    main()
