"""kernels/w4_expand.py (interpreter on CPU): exact vs the torch spec, every element written, bad inputs."""

import pytest
import torch

from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
from lowrank_gemm.formats.int4_twolevel import pack_weight_2l
from lowrank_gemm.kernels.w4_expand import expand_w4, expand_w4_ref


@pytest.mark.parametrize("n,k,g", [(45, 320, 64), (33, 256, 128), (1, 64, 64)])
@pytest.mark.parametrize("fmt,dtype", [("int4_2l", torch.int8), ("int4_g64", torch.int8),
                                       ("int4_g64", torch.float8_e4m3fn)])
def test_expand_exact(n, k, g, fmt, dtype):
    w = torch.randn(n, k)
    if fmt == "int4_2l":
        q, u, _ = pack_weight_2l(w, g)
    else:
        q, u = pack_int4(quantize_weight_int4(w, g)[0]), None
    # poisoned: a stale value everywhere, so an unwritten element fails the comparison
    out = torch.full((n, k), 99, dtype=torch.int8).to(dtype)
    y = expand_w4(q, u, g, fmt, dtype, out=out)
    assert y.data_ptr() == out.data_ptr()
    assert torch.equal(y.float().to(torch.int16), expand_w4_ref(q, u, g, fmt))


def test_expand_bad_inputs():
    q, u, _ = pack_weight_2l(torch.randn(8, 128), 64)
    with pytest.raises(ValueError, match="w_mul uint8"):
        expand_w4(q, None, 64, "int4_2l")
    with pytest.raises(ValueError, match="int4_2l expands to int8"):
        expand_w4(q, u, 64, "int4_2l", torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="w_q must be uint8"):
        expand_w4(q.view(torch.int8), u, 64, "int4_2l")
    with pytest.raises(ValueError, match=r"out must be contiguous torch.int8 \[8, 128\]"):
        expand_w4(q, u, 64, "int4_2l", out=torch.empty(8, 64, dtype=torch.int8))
