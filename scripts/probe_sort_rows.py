"""GPU probe (≈ 20 s): segment mode's row sort — the one-launch rank count (``multilora_gemm.sort_rows``) against
``torch.sort(stable=True)`` (what it replaced: 11 / 22 µs at M = 64 / 256 on the H200, session 27), per batch size,
CUDA-graph replay and eager, permutations checked identical on every input set.

    PYTHONPATH=src python scripts/probe_sort_rows.py --out DIR [--ms 16,64,…] [--adapters 64]

Writes DIR/probe_sort_rows.{json,md}; ``SORT_KERNEL_MAX_M`` should sit where the kernel stops winning.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ms", default="16,64,256,1024,4096,8192,16384,32768")
    ap.add_argument("--adapters", type=int, default=64)
    a = ap.parse_args()
    from lowrank_gemm.bench.common import device_meta, markdown_table, time_impl
    from lowrank_gemm.kernels import multilora_gemm as mg
    mg.SORT_KERNEL_MAX_M = 1 << 30          # time the kernel at every M, whatever the shipped limit
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for M in (int(v) for v in a.ms.split(",")):
        sets = [(torch.randint(-1, a.adapters, (M,), generator=gen, device="cuda", dtype=torch.int32),)
                for _ in range(8)]
        same = all(torch.equal(mg.sort_rows(i), torch.sort(i, stable=True).indices.to(torch.int32)) for (i,) in sets)
        for name, fn in (("torch_sort", lambda i: torch.sort(i, stable=True).indices.to(torch.int32)),
                         ("rank_kernel", mg.sort_rows)):
            t = time_impl(fn, sets)
            rows.append({"M": M, "impl": name, "graph_us": t.get("graph_us"), "eager_us": t["median_us"],
                         "identical": same})
            print(f"ROW M={M} {name} graph {t.get('graph_us')} µs eager {t['median_us']} µs identical={same}",
                  flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe_sort_rows.json").write_text(json.dumps({"meta": device_meta(), "rows": rows}, indent=1))
    (out / "probe_sort_rows.md").write_text(markdown_table(
        ["M", "impl", "graph µs", "eager µs", "identical to torch.sort"],
        [[r["M"], r["impl"], r["graph_us"], r["eager_us"], r["identical"]] for r in rows]) + "\n")
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
