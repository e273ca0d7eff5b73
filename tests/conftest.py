"""Test setup shared by the whole suite.

On a machine without CUDA the Triton kernels run under the interpreter: ``TRITON_INTERPRET`` must
be set before any ``@triton.jit`` is decorated, i.e. before the package is imported, hence here.
GPU tests carry ``@pytest.mark.gpu`` and run on the device machine with ``pytest -m gpu``.
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# One intra-op thread per core across all xdist workers: OpenMP threads spin while they wait, so two workers with two
# threads each on two cores ran the MiniLM test 5.4x slower than with one thread each (147 s against 27 s, session 50).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def fresh_kernel_buffers(monkeypatch):
    """Empty caches of the buffers our launches keep from one call to the next (split-K tickets, the S words and
    their spare, placeholders, derived weights), as in a fresh process: the first call in the test makes them.
    torch.compile's CUDA-graph trees catch such a buffer made inside their warm-up (session 31), which an earlier
    test in the same worker would otherwise hide."""
    from lowrank_gemm.kernels import act_quant, lora_gemm
    from lowrank_gemm.kernels.gluon import host
    monkeypatch.setattr(lora_gemm, "_TICKETS", lora_gemm._Tickets())
    monkeypatch.setattr(lora_gemm, "_S_WORDS", lora_gemm._SWords())
    monkeypatch.setattr(lora_gemm, "_DUMMIES", {})
    monkeypatch.setattr(lora_gemm, "_WEIGHT_CACHE", lora_gemm._WeightCache())
    monkeypatch.setattr(act_quant, "_TICKETS", {})
    monkeypatch.setattr(host, "_DUMMIES", {})
