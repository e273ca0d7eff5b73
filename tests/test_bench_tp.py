"""The tensor-parallel bench's plumbing on the CPU (gloo, tiny widths, nothing timed): sharded block vs unsharded,
the rows and the markdown table it writes; and the refusal on a machine without the GPUs."""

import json

import pytest
import torch

from lowrank_gemm.bench import tp


def test_tp_bench_plumbing_over_gloo(tmp_path):
    rows = tp.main(["--backend", "gloo", "--device", "cpu", "--world", "2", "--ms", "1,5", "--hidden", "64",
                    "--ffn", "96", "--rank", "4", "--out", str(tmp_path), "--timeout-s", "120"])
    impls = {(r["impl"], r["M"]) for r in rows}
    for M in (1, 5):
        assert {("tp1_lora", M), ("tp2_lora", M), ("tp1_base", M), ("tp2_base", M), ("allreduce", M)} <= impls
    sharded = [r for r in rows if r["impl"].startswith("tp2")]
    assert sharded and all(r["rel_err_vs_tp1"] < 1e-2 for r in sharded)   # bf16: the shards round apart
    data = json.loads((tmp_path / "tp.json").read_text())
    assert data["meta"]["world"] == 2 and len(data["rows"]) == len(rows)
    md = (tmp_path / "tp.md").read_text()
    assert "LoRA 2 GPUs µs" in md and md.count("\n| ") >= 3


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="the refusal is for machines without two GPUs")
def test_tp_bench_refuses_without_the_gpus():
    with pytest.raises(SystemExit, match="needs 2 CUDA devices"):
        tp.main(["--world", "2"])
