"""The LoRA probes' shared command line: ``--out DIR`` and ``--points M:K:N:r,...`` (each probe its own defaults)."""

from __future__ import annotations

import argparse
from pathlib import Path


def probe_parser(points_help: str = "M:K:N:r,... (default: the probe's own points)") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--points", default="", help=points_help)
    return ap


def points_and_out(args, default: list[tuple[int, int, int, int]]) -> tuple[list[tuple[int, ...]], Path]:
    """(the points asked for, else ``default``; the output folder, made)."""
    points = default if not args.points else [tuple(int(v) for v in p.split(":")) for p in args.points.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return points, out
