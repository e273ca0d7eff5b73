"""L2 prefetch from Triton and Gluon kernels: ``cp.async.bulk.prefetch.L2`` of a contiguous byte span.

A hint, not a copy: nothing waits for it and nothing reads it back, so it can be issued long before the data is
needed (a tile's epilogue operands before its K loop) without holding registers or shared memory across the loop.
The span's address and size must be multiples of 16 bytes (the host checks the layout that guarantees it)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["L2_PREFETCH_ASM", "prefetch_l2"]

# ``cp.async.bulk.prefetch.L2`` of $2 bytes at $1 when $2 > 0; $0 is a dummy result (inline asm must return one).
L2_PREFETCH_ASM = tl.constexpr("""{
.reg .pred p;
setp.gt.s32 p, $2, 0;
@p cp.async.bulk.prefetch.L2.global [$1], $2;
mov.u32 $0, 0;
}""")


@triton.jit
def prefetch_l2(ptrs, nbytes):
    """One bulk L2 prefetch per element: ``nbytes`` (int32, ≤ 0 = skip) bytes at ``ptrs``."""
    tl.inline_asm_elementwise(L2_PREFETCH_ASM, "=r,l,r", [ptrs, nbytes], dtype=tl.int32, is_pure=False, pack=1)
