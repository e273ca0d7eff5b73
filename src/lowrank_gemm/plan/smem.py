"""The SMEM ledger: the only place shared-memory bytes are counted.

A kernel that plans shared memory wrongly does not crash, it crawls (a per-CTA term counted once
per consumer pushes the pipeline to its minimum depth). So every byte is an itemized, named term
with an explicit scope, the planner and ``can_implement`` read only these terms, and CI checks the
total against the compiler's ``metadata.shared``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable

__all__ = ["SM90_SMEM_LIMIT", "Scope", "SmemTerm", "SmemLedger", "SmemError", "tile_bytes",
           "barrier_bytes", "solve_stages"]

# Dynamic shared memory one CTA can opt into on sm_90 (H100/H200): 227 KiB.
SM90_SMEM_LIMIT = 232_448
MBARRIER_BYTES = 8


class Scope(str, Enum):
    """How many copies of a term a CTA holds."""

    CTA = "cta"
    """One copy for the whole CTA (pipeline buffers every warp reads, barriers)."""
    PER_CONSUMER = "per_consumer"
    """One copy per consumer warpgroup (e.g. each ping-pong consumer's own epilogue buffer)."""


class SmemError(ValueError):
    """A configuration does not fit; the message carries the itemized table."""


@dataclass(frozen=True)
class SmemTerm:
    name: str
    bytes_each: int          # one copy of one stage
    stages: int = 1
    scope: Scope = Scope.CTA

    def copies(self, consumers: int) -> int:
        return self.stages * (consumers if self.scope is Scope.PER_CONSUMER else 1)

    def total(self, consumers: int) -> int:
        return self.bytes_each * self.copies(consumers)


@dataclass(frozen=True)
class SmemLedger:
    terms: tuple[SmemTerm, ...]
    consumers: int = 1
    limit: int = SM90_SMEM_LIMIT
    label: str = ""

    def total(self) -> int:
        return sum(t.total(self.consumers) for t in self.terms)

    def term(self, name: str) -> SmemTerm:
        for t in self.terms:
            if t.name == name:
                return t
        raise KeyError(name)

    def fits(self) -> bool:
        return self.total() <= self.limit

    def table(self) -> str:
        rows = [f"SMEM ledger{(' — ' + self.label) if self.label else ''} (consumers={self.consumers})",
                f"  {'term':<28}{'bytes':>10}{'×':>4}{'scope':>14}{'total':>10}"]
        for t in self.terms:
            rows.append(f"  {t.name:<28}{t.bytes_each:>10}{t.copies(self.consumers):>4}"
                        f"{t.scope.value:>14}{t.total(self.consumers):>10}")
        rows.append(f"  {'TOTAL':<56}{self.total():>10}  (limit {self.limit})")
        return "\n".join(rows)

    def check(self) -> "SmemLedger":
        if not self.fits():
            raise SmemError(f"configuration needs {self.total()} B of shared memory, over the "
                            f"{self.limit} B limit:\n{self.table()}")
        return self


def tile_bytes(rows: int, cols: int, bits: int) -> int:
    """Bytes of a [rows, cols] tile of ``bits``-bit elements."""
    return rows * cols * bits // 8


def barrier_bytes(count: int) -> int:
    return count * MBARRIER_BYTES


def solve_stages(build: Callable[[int, int], SmemLedger], *, min_main: int = 2, max_main: int = 6,
                 min_lowrank: int = 0, max_lowrank: int = 0) -> tuple[int, int, SmemLedger]:
    """Deepest main pipeline first, then the deepest low-rank pipeline that still fits.

    ``build(main_stages, lowrank_stages)`` returns the ledger of that configuration. Raises
    :class:`SmemError` (with the table of the smallest configuration) if even the minimum fails.
    """
    smallest = build(min_main, min_lowrank)
    if not smallest.fits():
        smallest.check()
    main = max(s for s in range(min_main, max_main + 1) if build(s, min_lowrank).fits())
    lowrank = max(s for s in range(min_lowrank, max_lowrank + 1) if build(main, s).fits())
    return main, lowrank, build(main, lowrank)
