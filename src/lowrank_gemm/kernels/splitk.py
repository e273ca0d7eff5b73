"""Deterministic split-K in ONE launch: park partials, take a ticket, the last arriver reduces.

Protocol, per output tile split over ``SPLIT_K`` programs (any arrival order):

1. every program stores its fp32 partial(s) to its own split slot (``splitk_store``);
2. ``splitk_arrive``: a CTA barrier (all threads' partial stores precede the release), then one
   int32 ``atom.add.acq_rel.gpu`` on the tile's ticket; the program that draws ``SPLIT_K - 1`` is
   the last, and its acquire makes every other program's partials visible to it;
3. the last program sums the partials of slots 0 .. SPLIT_K-1 *from zero, in slot order*
   (``splitk_sum``, ``.cg`` loads: L2, never a stale L1 line) — the sum order is fixed, so the
   result bits do not depend on which program arrived last — runs the epilogue and stores;
4. it resets the ticket to 0 (``splitk_reset``), so the counter buffer is zero again when the
   kernel ends: allocate and zero it once, reuse it on every launch on that stream (CUDA-graph
   safe, no memset per call). Launches that share a ticket region must not overlap in time.

The atomic only elects the reducer; no result ever goes through an atomic. Nobody waits on
anybody (no spin, no residency assumption): the other programs simply exit.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["splitk_store", "splitk_arrive", "splitk_sum", "splitk_reset"]


@triton.jit
def splitk_store(base_ptr, offs, split_stride, pid_k, part, mask):
    """Park ``part`` (fp32, any 2-D shape) at ``base_ptr + pid_k·split_stride + offs`` (``offs``:
    int32 element offsets inside a split slot; ``mask``: elements that exist, e.g. rows < M).
    A scalar base plus 32-bit offsets, not a tensor of 64-bit pointers: the latter would hold two
    registers per element across the ticket."""
    tl.store(base_ptr + tl.cast(pid_k, tl.int64) * split_stride + offs, part, mask=mask)


@triton.jit
def splitk_arrive(cnt_ptr, SPLIT_K):
    """Take this program's ticket on the tile counter ``cnt_ptr`` (scalar int32 pointer) after all
    of its partial stores; True for the last of ``SPLIT_K`` arrivals."""
    tl.debug_barrier()      # every thread's partial stores precede the one-thread release
    ticket = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
    return ticket == SPLIT_K - 1


@triton.jit
def splitk_sum(base_ptr, offs, split_stride, mask, SPLIT_K, acc, IN_FLIGHT: tl.constexpr = 1):
    """acc + Σ_{k=0..SPLIT_K-1} partial[k], added in k order (pass ``acc`` = zeros of the tile
    shape); partial k at ``base_ptr + k·split_stride + offs``. Masked-off elements read 0.

    This runs on the last arriver's critical path once everyone else is done: a chain of L2 round
    trips, one per step (a runtime SPLIT_K is not unrolled). ``IN_FLIGHT=2`` issues two partials
    per step (half the chain, twice the registers of one partial); the odd tail adds a masked
    0.0, which is exact, so the sum is the same k-ordered sum either way."""
    if IN_FLIGHT == 2:
        for k in range(0, SPLIT_K, 2):
            p = base_ptr + tl.cast(k, tl.int64) * split_stride
            p0 = tl.load(p + offs, mask=mask, other=0.0, cache_modifier=".cg")
            p1 = tl.load(p + split_stride + offs, mask=mask & (k + 1 < SPLIT_K), other=0.0,
                         cache_modifier=".cg")
            acc += p0
            acc += p1
    else:
        for k in range(SPLIT_K):
            acc += tl.load(base_ptr + tl.cast(k, tl.int64) * split_stride + offs, mask=mask,
                           other=0.0, cache_modifier=".cg")
    return acc


@triton.jit
def splitk_reset(cnt_ptr):
    """Return the tile's ticket to 0 for the next launch (only the last arriver calls this: every
    other program of the tile has already taken its ticket)."""
    tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")

