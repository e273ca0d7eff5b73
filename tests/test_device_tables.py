"""Which GPU's files a machine reads and writes: the tuned plan tables (an H100's own first, else the H200's that
ship) and the benchmarks' default results folder (named by the device that ran, so an H100's numbers never land
among the H200's). The device is faked: CPU only."""

from pathlib import Path

import pytest
import torch

from lowrank_gemm.bench import common
from lowrank_gemm.plan import tuned


@pytest.fixture
def fake_gpu(monkeypatch):
    """fake_gpu(name): CUDA looks available with one device of that name."""
    def set_name(name):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        tuned._device_name.cache_clear()
        tuned.tuned_file.cache_clear()
    yield set_name
    tuned._device_name.cache_clear()
    tuned.tuned_file.cache_clear()


@pytest.mark.parametrize("name,kind,folder", [("NVIDIA H200", "h200", "h200"), ("NVIDIA H100 80GB HBM3", "h100", "h100"),
                                              ("NVIDIA A100-SXM4-80GB", None, "nvidia_a100_sxm4_80gb")])
def test_kind_and_results_folder_follow_the_device(fake_gpu, name, kind, folder):
    fake_gpu(name)
    assert tuned.gpu_kind("cuda:0") == kind
    assert tuned.gpu_table_name("cuda:0") == ("h200" if kind else None)
    assert common.results_dir() == Path("benchmarks/results") / folder
    assert common.results_dir(suffix="x2") == Path("benchmarks/results") / f"{folder}x2"


def test_results_folder_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert common.results_dir() == Path("benchmarks/results/cpu")
    assert tuned.gpu_kind("cpu") is None and tuned.tuned_file("lora", "cpu") is None


def test_h100_reads_its_own_table_first(fake_gpu, monkeypatch, tmp_path):
    (tmp_path / "lora_h200.json").write_text("{}")
    monkeypatch.setattr(tuned, "TUNED_DIR", tmp_path)
    fake_gpu("NVIDIA H100 80GB HBM3")
    assert tuned.tuned_file("lora", "cuda:0") == tmp_path / "lora_h200.json"     # none of its own: the H200's
    (tmp_path / "lora_h100.json").write_text("{}")
    tuned.tuned_file.cache_clear()
    assert tuned.tuned_file("lora", "cuda:0") == tmp_path / "lora_h100.json"
    fake_gpu("NVIDIA H200")
    assert tuned.tuned_file("lora", "cuda:0") == tmp_path / "lora_h200.json"     # an H200 never reads the H100's
    fake_gpu("NVIDIA A100-SXM4-80GB")
    assert tuned.tuned_file("lora", "cuda:0") is None


def test_write_results_defaults_to_the_device_folder(fake_gpu, monkeypatch, tmp_path):
    fake_gpu("NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(common, "RESULTS_ROOT", tmp_path)
    path = common.write_results("demo", {"device": "x"}, [{"impl": "a"}], md="# t\n")
    assert path == tmp_path / "h100" / "demo.json" and (tmp_path / "h100" / "demo.md").exists()


def test_the_h100_lora_table_extends_the_h200s():
    """``lora_h100.json``: the H100's own entries over the H200's (plan.tuned.table_entries); every entry a valid plan
    the ledger fits, each naming where it was measured."""
    import json

    from lowrank_gemm.kernels._lora_kernels import smem_ledger
    from lowrank_gemm.plan.config import KernelConfig
    from lowrank_gemm.plan.planner import load_tuned
    h100, h200 = tuned.TUNED_DIR / "lora_h100.json", tuned.TUNED_DIR / "lora_h200.json"
    own = json.loads(h100.read_text())
    assert own["extends"] == h200.name and own["lora"]
    assert load_tuned(h100) == {**load_tuned(h200), **own["lora"]}
    for key, entry in own["lora"].items():
        cfg = KernelConfig.from_dict(entry["config"])
        assert smem_ledger(cfg, 16, entry["strategy"]).fits(), key
        assert "h100" in entry["source"] and entry["us"] < entry["replaces_us"], key


def test_table_entries_refuses_another_version(tmp_path):
    import json
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"version": 2, "lora": {}}))
    with pytest.raises(ValueError, match="unsupported tuned-table version 2"):
        tuned.table_entries(str(p), "lora")


@pytest.mark.parametrize("path", sorted(tuned.TUNED_DIR.glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_table_is_version_1(path):
    """Every table that ships passes the one reader every family uses (``read_table``); an ``extends`` names a
    table beside it."""
    data = tuned.read_table(path)
    assert not data.get("extends") or (path.parent / data["extends"]).exists(), data["extends"]


def test_w4a4_table_refuses_another_version(tmp_path):
    import json
    from lowrank_gemm.kernels import w4a4_gemm
    p = tmp_path / "w4a4_test.json"
    p.write_text(json.dumps({"entries": []}))
    with pytest.raises(ValueError, match="unsupported tuned-table version None"):
        w4a4_gemm.load_tuned(str(p))
