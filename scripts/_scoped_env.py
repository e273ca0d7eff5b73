"""Environment variables set for the duration of a ``with`` block (the probes A/B env knobs that the package reads
per call inside one process)."""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def scoped_env(**kv):
    """Set each ``name=value`` (``None``: unset it) for the block; restore every previous value afterwards."""
    old = {k: os.environ.get(k) for k in kv}
    for k, v in kv.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
