"""Run one launch of a possibly-hanging kernel in a child process (stdlib only: the parent never imports
torch/triton). A warp-specialized kernel that deadlocks never returns control to its process, so the only
safe watchdog is outside it: a timeout, then SIGKILL of the child's whole process group."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess


def run_child(cmd: list[str], env: dict, limit: float, *, row_prefix: str | None = None):
    """→ (status, out, result, rows): status "HANG" after ``limit`` seconds, else None (the caller decides PASS/
    FAIL from ``result``, the JSON after the child's last ``RESULT `` line); ``rows``: the JSON of every line
    starting with ``row_prefix`` (if given)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit)
        status = None
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)    # the whole group: the hung kernel's process
        out, _ = proc.communicate()
        status = "HANG"
    result, rows = {}, []
    for line in (out or "").splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
        elif row_prefix and line.startswith(row_prefix):
            rows.append(json.loads(line[len(row_prefix):]))
    return status, out or "", result, rows


def ladder_parser(doc: str, timeout: float, rung_example: str) -> argparse.ArgumentParser:
    """The options every child-process ladder shares (--child is the internal re-entry of one rung)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--timeout", type=float, default=timeout, help="seconds per correctness rung")
    ap.add_argument("--budget", type=float, default=150.0, help="seconds for the whole ladder")
    ap.add_argument("--rungs", default="", help=f"comma-separated subset, e.g. {rung_example}")
    ap.add_argument("--no-time", action="store_true", help="skip the timing rung")
    return ap
