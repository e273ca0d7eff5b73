"""Probe: the one-launch per-row fp8 quantizer (``kernels.row_quant.fp8_rows``) against its five-op PyTorch spec.

    PYTHONPATH=src python scripts/probe_row_quant.py --out DIR [--shapes 1x4096,64x4096,...]

Per [M, K] bf16 shape (rotated input sets, one process): CUDA-graph medians of the kernel and of the spec, the
kernel's bytes (2 read + 1 written per element, 4 per row) over its time as a share of the measured copy bandwidth,
and a bit-identity check first. Writes DIR/probe_row_quant.{json,md}.
"""

from __future__ import annotations

import argparse

import torch

DEFAULT_SHAPES = "1x4096,16x4096,64x4096,256x4096,1024x4096,4096x4096,1024x14336,4096x8192,4096x14336"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    args = ap.parse_args()
    from lowrank_gemm.bench.common import (device_meta, markdown_table, measure_copy_tbps, meta_header,
                                           parse_shapes, rotation_count, time_graph, write_results)
    from lowrank_gemm.kernels.row_quant import fp8_rows, fp8_rows_torch

    copy = measure_copy_tbps()
    meta = device_meta(copy)
    rows = []
    for M, K in parse_shapes(args.shapes):
        n = rotation_count(M * K * 3)
        sets = [(torch.randn(M, K, device="cuda").bfloat16() * (i + 1),) for i in range(n)]
        q, s = fp8_rows(*sets[0])
        q0, s0 = fp8_rows_torch(*sets[0])
        same = torch.equal(q.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(s, s0)
        t_kernel = time_graph(fp8_rows, sets).median_us
        t_torch = time_graph(fp8_rows_torch, sets).median_us
        floor_us = (3 * M * K + 4 * M) / (copy * 1e12) * 1e6
        rows.append(dict(M=M, K=K, bit_identical=same, kernel_us=round(t_kernel, 3), torch_us=round(t_torch, 3),
                         speedup=round(t_torch / t_kernel, 2), pct_copy_bw=round(100 * floor_us / t_kernel, 1)))
        print("ROW", rows[-1], flush=True)
    write_results("probe_row_quant", meta, rows, args.out, md=meta_header(meta) + "\n" + markdown_table(
        list(rows[0]), [list(r_.values()) for r_ in rows]))

if __name__ == "__main__":
    main()
