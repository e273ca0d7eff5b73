"""Shared part of the LoRA probes since session 47 (probe_ml_tickets.py, probe_lora_sync.py, probe_lora_flat.py): a
call as it ran before the shared ticket region, with ``lora_gemm._TICKETS`` swapped for a stand-in that zeroes a fresh
buffer per call (a memset node in every captured graph); the cells, the baselines, the timed rows and the tables."""

from __future__ import annotations

import torch


class PerCallTickets:
    """``_Tickets.get``'s signature, a fresh ``torch.zeros`` each time."""

    def get(self, device, tiles):
        return torch.zeros(tiles, dtype=torch.int32, device=device)


def with_per_call_tickets(fn):
    """``fn`` run with a zeroed ticket buffer per call instead of the shared region (the region is put back after)."""
    from lowrank_gemm.kernels import lora_gemm

    def call(*args):
        shared = lora_gemm._TICKETS
        lora_gemm._TICKETS = PerCallTickets()
        try:
            return fn(*args)
        finally:
            lora_gemm._TICKETS = shared
    return call


def timed_rows(impls, sets, fields, paired_base=None, pair_with=None):
    """Rows of graph-replay medians for ``impls`` (name → fn; the first is the ratios' base) over the rotated
    ``sets``, each row ``fields`` plus impl, graph_us and x_cublas (and, with ``paired_base``, the ratio to it timed
    in alternation: ``bench.common.paired_ratio``; with ``pair_with``, the name of another impl, ``x_pair``: the
    ratio to that impl timed in alternation, for two candidates closer than the noise between their cuBLAS
    ratios); printed as they come."""
    from lowrank_gemm.bench.common import paired_ratio, time_impl
    rows, base = [], None
    for name, fn in impls.items():
        t = time_impl(fn, sets)
        us = t.get("graph_us") or t["median_us"]
        base = us if base is None else base
        row = dict(fields, impl=name, graph_us=round(us, 2), x_cublas=round(us / base, 3))
        if paired_base is not None:
            row["x_cublas_paired"] = (paired_ratio(fn, sets, paired_base, sets)["ratio_paired"]
                                      if fn is not paired_base else None)
        if pair_with in impls and name != pair_with:
            row["x_pair"] = paired_ratio(fn, sets, impls[pair_with], sets)["ratio_paired"]
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    return rows


def write_tables(out, stem, rows, columns):
    """``out/stem.json`` (device meta + rows) and ``out/stem.md`` (``columns``: header → row key)."""
    import json
    from pathlib import Path
    from lowrank_gemm.bench.common import device_meta, markdown_table
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": device_meta(), "rows": rows}, indent=1))
    table = markdown_table(list(columns), [[rw.get(k) for k in columns.values()] for rw in rows])
    (out / f"{stem}.md").write_text(table + "\n")
    print(table)


def lora_cells(cells: str):
    """Per ``MxNxKxR`` of the comma-separated ``cells``: (M, N, K, r, the bench's rotated bf16 input sets on the GPU),
    the sets freed after each cell."""
    from lowrank_gemm.bench.lora import make_sets
    for cell in cells.split(","):
        M, N, K, r = (int(v) for v in cell.split("x"))
        sets = make_sets(M, N, K, r, torch.bfloat16, torch.device("cuda"))
        yield M, N, K, r, sets
        del sets
        torch.cuda.empty_cache()


def lora_baselines():
    """(auto, cublas) on a set (x, w, a, b, scale·b): ``lora_linear`` as ``bench lora`` times it, and x·Wᵀ."""
    from lowrank_gemm.bench.lora import SCALE
    from lowrank_gemm.kernels import lora_gemm

    def auto(x, w, a, b, bs):
        return lora_gemm.lora_linear(x, w, a, b, SCALE)

    def cublas(x, w, a, b, bs):
        return x @ w.T
    return auto, cublas
