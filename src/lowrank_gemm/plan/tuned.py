"""Where tuned tables live and which GPU gets which.

Every kernel family keeps one measured table per GPU kind, ``plan/tuned/<family>_<gpu>.json``, written
by its probe (``scripts/probe_<family>.py``). The shipped tables are the H200's; an H100 reads its own
``<family>_h100.json`` where one exists (``multilora_h100.json``, ``lora_h100.json``: the H200's plus entries
measured on an H100, by ``extends``: :func:`table_entries`), else the H200's (same SMs and shared memory, less
bandwidth: a good start, not a measurement). Every other device (and the CPU interpreter) takes the family's
heuristic.

A user's own measurements come first: ``python -m lowrank_gemm tune lora`` (:mod:`.autotune`) times candidate plans
for the user's shapes on the user's GPU and writes ``<family>_<gpu>.json`` into :func:`user_tuned_dir` (any GPU:
named by :func:`device_slug`); the planner reads that file before the shipped tables (:func:`user_tuned_file`).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import torch

__all__ = ["TUNED_DIR", "USER_DIR_ENV", "device_slug", "gpu_kind", "gpu_table_name", "read_table", "table_entries",
           "tuned_file", "user_tuned_dir", "user_tuned_file"]

TUNED_DIR = Path(__file__).parent / "tuned"
# where a user's own tuned tables live (default: $XDG_CACHE_HOME or ~/.cache, then lowrank_gemm/tuned)
USER_DIR_ENV = "LOWRANK_GEMM_TUNED_DIR"


@functools.lru_cache(maxsize=16)
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device).lower()


def gpu_kind(device) -> str | None:
    """``"h100"`` / ``"h200"`` for those GPUs (by device name), else None (other GPUs, CPU)."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = _device_name(device)
    return "h200" if "h200" in name else "h100" if "h100" in name else None


def gpu_table_name(device) -> str | None:
    """``"h200"`` on an H100/H200 — the kind whose tables ship (module doc) — else None."""
    return "h200" if gpu_kind(device) else None


@functools.lru_cache(maxsize=64)        # called on every eager launch; the answer is fixed per (family, device)
def tuned_file(family: str, device) -> Path | None:
    """``plan/tuned/<family>_<gpu>.json`` for ``device`` (an H100's own table first, where one exists), or None
    where no table applies."""
    kind = gpu_kind(device)
    if kind is None:
        return None
    own = TUNED_DIR / f"{family}_{kind}.json"
    return own if own.exists() else TUNED_DIR / f"{family}_{gpu_table_name(device)}.json"


def device_slug(device) -> str:
    """A GPU's name for file names: ``h100`` / ``h200``, another GPU's name in lower case with ``_`` for anything
    else (``nvidia_a100_sxm4_80gb``); ``cpu`` for a CPU device."""
    device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    return gpu_kind(device) or "".join(c if c.isalnum() else "_" for c in _device_name(device))


def user_tuned_dir() -> Path:
    """``$LOWRANK_GEMM_TUNED_DIR``, else ``$XDG_CACHE_HOME/lowrank_gemm/tuned`` (``~/.cache`` without it)."""
    if os.environ.get(USER_DIR_ENV):
        return Path(os.environ[USER_DIR_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "lowrank_gemm" / "tuned"


def user_tuned_file(family: str, device) -> Path | None:
    """The user's own table for ``family`` on ``device`` (``<user_tuned_dir>/<family>_<device_slug>.json``), or
    None where there is none (or no GPU). Read on every plan that is not yet memoized: after writing one, call
    :func:`~lowrank_gemm.plan.planner.clear_plan_cache`."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return None
    path = user_tuned_dir() / f"{family}_{device_slug(device)}.json"
    return path if path.exists() else None


def read_table(path: Path) -> dict:
    """A tuned table's JSON, refused (ValueError naming the file) unless it is a JSON object of version 1 — never
    misread."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a tuned table (invalid JSON: {exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a tuned table (a JSON object is expected, got {type(data).__name__})")
    if data.get("version") != 1:
        raise ValueError(f"{path}: unsupported tuned-table version {data.get('version')!r} (expected 1)")
    return data


@functools.lru_cache(maxsize=16)
def table_entries(path: str, section: str) -> dict:
    """The entries under ``section`` of the tuned table at ``path`` ({} where there is no file). A table that
    ``extends`` another (a file name beside it: an H100's own entries over the H200's) has that table's entries
    beneath its own. Tables are version 1; another version is refused, not misread. Cached: drop with
    ``table_entries.cache_clear()`` after writing a table."""
    p = Path(path)
    if not p.exists():
        return {}
    data = read_table(p)
    base = table_entries(str(p.parent / data["extends"]), section) if data.get("extends") else {}
    return {**base, **data.get(section, {})}
