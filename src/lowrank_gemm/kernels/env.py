"""Environment knobs of the kernels: on/off switches and config overrides for probes (read per call)."""

from __future__ import annotations

import os

__all__ = ["getenv", "env_on", "env_ints", "pinned_config", "interpreting"]

# os.environ.get of an unset variable raises and catches a KeyError inside the mapping (~2 µs), and our switches are
# unset almost always and read on every call (a dozen per W4A4 layer call). On POSIX os.environ keeps its values in
# a bytes → bytes dict that its own setters (monkeypatch.setenv included) update; reading it directly costs ~0.1 µs.
_RAW = os.environ._data if os.name == "posix" and isinstance(getattr(os.environ, "_data", None), dict) else None


def getenv(var: str, default=None):
    """``os.environ.get(var, default)``, without the exception path for unset variables."""
    if _RAW is None:
        return os.environ.get(var, default)
    raw = _RAW.get(var.encode())
    return default if raw is None else os.fsdecode(raw)


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels (``TRITON_INTERPRET`` set and not 0: the CPU tests)."""
    return getenv("TRITON_INTERPRET", "0") not in ("", "0")


def env_on(var: str, default: bool = True) -> bool:
    """A switch: ``var=0`` off, any other value on, unset ``default`` (on: instant fallback to the previous kernel;
    off: an opt-in kept for A/B probes)."""
    val = getenv(var)
    return default if val is None or val == "" else val != "0"


def env_switch(var: str, default) -> bool:
    """An on/off knob read per call: ``var`` = 0 / 1, any other value (or none) leaves ``default``."""
    env = getenv(var, "")
    return env == "1" if env in ("0", "1") else bool(default)


def env_ints(var: str, lengths: tuple[int, ...], usage: str) -> tuple[int, ...] | None:
    """``var`` as comma-separated non-negative ints of one of ``lengths`` (None when unset); anything else is an
    error naming the expected ``usage``."""
    env = getenv(var, "")
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
