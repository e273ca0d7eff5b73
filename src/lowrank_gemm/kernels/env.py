"""Environment knobs of the kernels: on/off switches and config overrides for probes (read per call)."""

from __future__ import annotations

import os

__all__ = ["env_on", "env_ints", "pinned_config"]


def env_on(var: str, default: bool = True) -> bool:
    """A switch: ``var=0`` off, any other value on, unset ``default`` (on: instant fallback to the previous kernel;
    off: an opt-in kept for A/B probes)."""
    val = os.environ.get(var)
    return default if val is None or val == "" else val != "0"


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


def pinned_config(config, var: str, lengths: tuple[int, ...], usage: str, cls):
    """A kernel config pinned by the caller (``config``, as ``cls``) or by env ``var`` (:func:`env_ints`); None when
    neither pins one, so the kernel picks its own default."""
    if config is not None:
        return cls(*config)
    env = env_ints(var, lengths, usage)
    return None if env is None else cls(*env)
