"""Where tuned tables live and which GPU gets which.

Every kernel family keeps one measured table per GPU kind, ``plan/tuned/<family>_<gpu>.json``, written
by its probe (``scripts/probe_<family>.py``). Tables are only consulted on the GPU they were measured
on; every other device (and the CPU interpreter) takes the family's heuristic.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

__all__ = ["TUNED_DIR", "gpu_table_name", "tuned_file"]

TUNED_DIR = Path(__file__).parent / "tuned"


@functools.lru_cache(maxsize=16)
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device).lower()


def gpu_table_name(device) -> str | None:
    """``"h200"`` on an H100/H200 (same SMs and shared memory; the H100 has less bandwidth, so its
    tables are a good start, not a measurement), else None."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = _device_name(device)
    return "h200" if ("h200" in name or "h100" in name) else None


@functools.lru_cache(maxsize=64)        # called on every eager launch; the answer is fixed per (family, device)
def tuned_file(family: str, device) -> Path | None:
    """``plan/tuned/<family>_<gpu>.json`` for ``device``, or None where no table applies."""
    gpu = gpu_table_name(device)
    return TUNED_DIR / f"{family}_{gpu}.json" if gpu else None
