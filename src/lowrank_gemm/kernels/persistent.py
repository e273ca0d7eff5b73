"""Device buffers our launches keep from one call to the next (split-K tickets, the S words' spare, placeholders).

They must come from the caching allocator's ordinary pool, never from a CUDA-graph pool. ``torch.compile(mode=
"reduce-overhead")`` runs a function's first calls (warm-up) with every allocation of the calling thread routed
into the graph's private pool, and afterwards insists that everything alive in that pool is one of the graph's
outputs ("Detected 3 tensor(s) in the cudagraph pool not tracked as outputs", session 31, ``probes/s31/s31_first``).
A buffer made on the first call would land there. The routing is per thread
(``_cuda_beginAllocateCurrentThreadToPool``), so :func:`outside_graph_pools` makes such buffers on a short-lived
helper thread that launches on the caller's stream.

:func:`persistent_zeros` is never called while a stream is being captured: its callers hand out what they made before
the capture, or make a per-call buffer the graph owns.
"""

from __future__ import annotations

import threading

import torch

from .schedule import device_index

__all__ = ["persistent_zeros", "outside_graph_pools", "on_helper_thread", "capturing", "stream_key"]


def capturing(device: torch.device) -> bool:
    """Whether the current stream of ``device`` is being captured into a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def stream_key(device: torch.device) -> int:
    """The raw handle of ``device``'s current stream (0 off CUDA): the key of buffers kept per stream."""
    return torch._C._cuda_getCurrentRawStream(device_index(device)) if device.type == "cuda" else 0


def outside_graph_pools(make, device):
    """``make()`` with its allocations in the caching allocator's ordinary pool, for results kept past the call.

    On a CUDA device ``make`` runs on a short-lived helper thread that uses the caller's current stream, so its
    kernels stay in the caller's stream order and its memory is booked to that stream. Grad mode is off there and
    inference mode is the caller's (both are per thread). While the stream is being captured it runs here, as
    before: a capture routes by stream, not by thread, so the helper would change nothing."""
    device = torch.device(device)
    if device.type != "cuda" or capturing(device):
        return make()
    stream = torch.cuda.current_stream(device)
    inference = torch.is_inference_mode_enabled()

    def make_there():
        # inference_mode(False) turns grad mode on, so no_grad goes inside it
        with torch.cuda.device(device), torch.cuda.stream(stream), torch.inference_mode(inference), torch.no_grad():
            return make()
    return on_helper_thread(make_there)


def on_helper_thread(fn):
    """``fn()`` run on a new thread, joined; its result returned, or its exception raised here."""
    made: list = []

    def run():
        try:
            made.append(fn())
        except BaseException as exc:    # re-raised on the caller's thread
            made.append(exc)

    worker = threading.Thread(target=run, name="lowrank_gemm-helper")
    worker.start()
    worker.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


def persistent_zeros(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """A zeroed tensor meant to outlive the call that makes it (:func:`outside_graph_pools`)."""
    device = torch.device(device)
    if capturing(device):
        raise RuntimeError("persistent_zeros: called while capturing a CUDA graph; make persistent buffers before "
                           "the capture (a graph-owned per-call buffer is the fallback)")
    return outside_graph_pools(lambda: torch.zeros(shape, dtype=dtype, device=device), device)
