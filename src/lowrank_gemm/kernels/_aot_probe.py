"""A minimal TMA + tl.dot kernel: the AOT helper's own test subject (tests/test_foundation.py)."""

import triton
import triton.language as tl


@triton.jit
def probe_dot(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [K, 1], [BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, [N, K], [K, 1], [BN, BK])
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        acc = tl.dot(a_desc.load([0, k]), b_desc.load([0, k]).T, acc)
    offs = tl.arange(0, BM)[:, None] * N + tl.arange(0, BN)[None, :]
    tl.store(c_ptr + offs, acc)


@triton.jit
def probe_default(out_ptr, FLAG: tl.constexpr = True):
    """Stores 1234567 with FLAG (its default) and 7654321 without: which branch an AOT compile took."""
    if FLAG:
        tl.store(out_ptr, 1234567)
    else:
        tl.store(out_ptr, 7654321)



@triton.jit
def probe_fma(x_ptr, out_ptr):
    """out = x·x + 1 in fp32: one ``fma.rn.f32`` by default, a multiply and an add with Triton's
    ``TRITON_DEFAULT_FP_FUSION=0`` (which the AOT compile child must see from its caller's environment)."""
    x = tl.load(x_ptr)
    tl.store(out_ptr, x * x + 1.0)
