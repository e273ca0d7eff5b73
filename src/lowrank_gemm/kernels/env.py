"""Environment knobs of the kernels: on/off switches and config overrides for probes (read per call)."""

from __future__ import annotations

import os

__all__ = ["env_on", "env_ints"]


def env_on(var: str) -> bool:
    """A switch that is on unless ``var=0`` (instant fallback to the previous kernel)."""
    return os.environ.get(var, "1") != "0"


def env_ints(var: str, lengths: tuple[int, ...], usage: str) -> tuple[int, ...] | None:
    """``var`` as comma-separated non-negative ints of one of ``lengths`` (None when unset); anything else is an
    error naming the expected ``usage``."""
    env = os.environ.get(var, "")
    if not env:
        return None
    parts = env.split(",")
    if len(parts) not in lengths or not all(p.isdigit() for p in parts):
        raise ValueError(f"{var} must be '{usage}', got {env!r}")
    return tuple(int(p) for p in parts)
