"""Buffers kept between calls (kernels/persistent.py). What they are for — staying out of torch.compile's CUDA-graph
pools — is checked on the GPU (``test_torch_compile_reduce_overhead`` in the LoRA, multi-LoRA and W4A4 GPU tests)."""

import threading

import pytest
import torch

from lowrank_gemm.kernels import persistent


def test_helper_thread_returns_and_raises():
    here = threading.get_ident()
    assert persistent.on_helper_thread(threading.get_ident) != here
    assert persistent.on_helper_thread(lambda: 7) == 7
    with pytest.raises(KeyError, match="nope"):
        persistent.on_helper_thread(lambda: {}["nope"])


def test_persistent_zeros_cpu():
    t = persistent.persistent_zeros((3, 5), torch.int64, "cpu")
    assert t.shape == (3, 5) and t.dtype == torch.int64 and not t.any()


def test_persistent_zeros_refuses_a_capture(monkeypatch):
    monkeypatch.setattr(persistent, "capturing", lambda device: True)
    with pytest.raises(RuntimeError, match="while capturing a CUDA graph"):
        persistent.persistent_zeros((4,), torch.int32, "cpu")


@pytest.mark.gpu
def test_outside_graph_pools_keeps_stream_order_and_grad_mode():
    """The helper thread launches on the caller's stream (a side stream here): what it makes is ready for the next
    kernel on that stream, and it runs with grad off whatever the caller's mode."""
    w = torch.randn(64, 64, device="cuda", requires_grad=True)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        made = persistent.outside_graph_pools(lambda: (w * 2).sum(1), w.device)
        assert not made.requires_grad
        doubled = made * 1
    torch.cuda.synchronize()
    assert torch.equal(doubled, (w.detach() * 2).sum(1))
