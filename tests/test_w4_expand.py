"""kernels/w4_expand.py (interpreter on CPU): exact vs the torch spec, every element written, bad inputs."""

import pytest
import torch

from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
from lowrank_gemm.formats.int4_twolevel import pack_weight_2l
from lowrank_gemm.kernels.w4_expand import expand_act_f8, expand_act_f8_ref, expand_w4, expand_w4_ref


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


@pytest.mark.parametrize("n,k", [(45, 320), (1, 64), (130, 192)])
def test_expand_offset_nibbles(n, k):
    """offset=True: byte (n, k) is q + 8 — read as e4m3 it is (q + 8)·2⁻⁹, the value the v2 fp8 kernel's MMA
    expects of its weight operand; every element written (poisoned output)."""
    q = pack_int4(quantize_weight_int4(torch.randn(n, k), 64)[0])
    out = torch.full((n, k), 99, dtype=torch.int8).view(torch.float8_e4m3fn)
    y = expand_w4(q, None, 64, "int4_g64", torch.float8_e4m3fn, out=out, offset=True)
    ref = expand_w4_ref(q, None, 64, "int4_g64", offset=True)
    assert torch.equal(y.view(torch.uint8).to(torch.int16), ref)
    assert torch.equal(y.float().double(), ref.double() * 2.0 ** -9)
    with pytest.raises(ValueError, match="offset nibbles are an int4_g64 e4m3 output"):
        expand_w4(q, None, 64, "int4_g64", torch.int8, offset=True)


@pytest.mark.parametrize("n,k,g", [(45, 320, 64), (33, 256, 128), (130, 640, 64)])
@pytest.mark.parametrize("sdtype", [torch.bfloat16, torch.float16])
def test_expand_with_scales(n, k, g, sdtype):
    """scales=: the launch also writes the group scales as fp32, exactly and completely (the no-expander v2 path's
    ring rows); the weights are the same bytes as without it."""
    q = pack_int4(quantize_weight_int4(torch.randn(n, k), g)[0])
    ws = (torch.rand(k // g, n) + 0.05).to(sdtype)
    y, ws32 = expand_w4(q, None, g, "int4_g64", torch.float8_e4m3fn, offset=True, scales=ws)
    assert ws32.dtype == torch.float32 and torch.equal(ws32, ws.float())
    assert torch.equal(y.view(torch.uint8), expand_w4(q, None, g, "int4_g64", torch.float8_e4m3fn,
                                                      offset=True).view(torch.uint8))
    with pytest.raises(ValueError, match=r"scales must be contiguous 16-bit \[K/G, N\]"):
        expand_w4(q, None, g, "int4_g64", torch.float8_e4m3fn, offset=True, scales=ws.float())
    with pytest.raises(ValueError, match=r"scales must be contiguous 16-bit \[K/G, N\]"):
        expand_w4(q, None, g, "int4_g64", torch.float8_e4m3fn, offset=True, scales=ws[:, :-1])


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


@pytest.mark.parametrize("m,k,g", [(37, 192, 64), (5, 256, 128), (64, 128, 64)])
def test_expand_act_f8_exact(m, k, g):
    """x8 holds q exactly (e4m3), rows a = 2⁹·xs and b = −8·R·xs (R: the group row sum of q) exactly as the spec
    computes them in fp32; every element written (poison-free by construction: fresh buffers compared in full)."""
    gen = torch.Generator().manual_seed(m + k)
    q = torch.randint(-8, 8, (m, k), generator=gen, dtype=torch.int8)
    xs = (torch.rand(k // g, m, generator=gen) + 0.1).to(torch.bfloat16)
    x8, xab = expand_act_f8(pack_int4(q), xs, g)
    rq, rab = expand_act_f8_ref(pack_int4(q), xs, g)
    assert x8.dtype == torch.float8_e4m3fn and xab.shape == (k // g, 2, m)
    assert torch.equal(x8.float(), q.float()) and torch.equal(rq, q.float())
    assert torch.equal(xab, rab)
    # the identity the kernel relies on: Σ q_x·q_w = 2⁹·Σ q_x·(q_w + 8)·2⁻⁹ − 8·R
    w = torch.randint(-8, 8, (3, k), generator=gen).double()
    p_off = q.double() @ ((w + 8) * 2.0 ** -9).T                      # what the e4m3 MMA returns (exact)
    r = q.double().reshape(m, k // g, g).sum(-1)                      # R per (row, group)
    assert torch.equal(2.0 ** 9 * p_off - 8 * r.sum(1, keepdim=True), q.double() @ w.T)


def test_expand_act_f8_bad_inputs():
    with pytest.raises(ValueError, match="x_scale"):
        expand_act_f8(torch.zeros(4, 64, dtype=torch.uint8), torch.ones(1, 5, dtype=torch.bfloat16), 64)
    with pytest.raises(ValueError, match="uint8"):
        expand_act_f8(torch.zeros(4, 64, dtype=torch.int8), torch.ones(2, 4, dtype=torch.bfloat16), 64)
    with pytest.raises(ValueError, match="group_size"):
        expand_act_f8(torch.zeros(4, 64, dtype=torch.uint8), torch.ones(2, 4, dtype=torch.bfloat16), 96)


_OPERAND_KERNELS = {
    "_act_f8_kernel": (dict(xq_ptr="*u8", xs_ptr="*bf16", x8_ptr="*fp8e4nv", xab_ptr="*fp32", M="i32", KH="i32"),
                       dict(G=64, BLOCK_M=32), ("xq_ptr", "x8_ptr", "KH")),
    "_act_f16_kernel": (dict(xq_ptr="*u8", xs_ptr="*bf16", x16_ptr="*fp16", t_ptr="*fp32", M="i32", KH="i32",
                             NG="i32"), dict(G=64, NG_P2=64), ("xq_ptr", "x16_ptr", "KH")),
}


@pytest.mark.parametrize("kernel", sorted(_OPERAND_KERNELS))
@pytest.mark.parametrize("late", [False, True])
def test_operand_kernels_sm90_pdl(kernel, late):
    """sm_90 with PDL, both token-operand kernels: the wait comes before the first read of x_q / x_scale; the next grid
    may launch before it ("early") or right after it ("after_wait", PDL_LATE)."""
    from lowrank_gemm.kernels.aot import compile_sm90
    sig, cx, aligned = _OPERAND_KERNELS[kernel]
    ptx = compile_sm90("lowrank_gemm.kernels.w4_expand", kernel, sig, dict(cx, PDL=True, PDL_LATE=late),
                       aligned=aligned, num_warps=4).ptx
    trigger, wait, load = (ptx.find(s) for s in ("griddepcontrol.launch_dependents", "griddepcontrol.wait",
                                                  "ld.global"))
    assert ptx.count("griddepcontrol.launch_dependents") == 1 and ptx.count("griddepcontrol.wait") == 1
    assert 0 < wait < load
    assert (wait < trigger < load) if late else (0 < trigger < wait)


def test_operand_pdl_trigger(monkeypatch):
    """The launch keywords per OPERAND_PDL_TRIGGER entry: PDL never on the CPU; an unknown trigger is an error."""
    from lowrank_gemm.kernels import w4_expand
    cpu = torch.device("cpu")
    for trig in w4_expand._OPERAND_PDL_TRIGGERS:
        monkeypatch.setattr(w4_expand, "OPERAND_PDL_TRIGGER", {"e4m3": trig, "f16": "late"})
        assert w4_expand._operand_pdl(cpu, "e4m3") == dict(PDL=False, PDL_LATE=trig == "after_wait", launch_pdl=False)
        with pytest.raises(ValueError, match=r"OPERAND_PDL_TRIGGER\['f16'\]"):
            w4_expand._operand_pdl(cpu, "f16")


def test_operand_pdl_shipped_choice(monkeypatch):
    """Where PDL is on, the e4m3 operand kernel lets the GEMM launch at its start and the fp16 one launches without
    PDL (NOTES.md session 40: its early trigger cost ~21 µs at 24–32 tokens behind act_quant on the H200)."""
    from lowrank_gemm.kernels import w4_expand
    monkeypatch.setattr(w4_expand, "pdl_enabled", lambda device: True)
    cuda = torch.device("cuda")
    assert w4_expand._operand_pdl(cuda, "e4m3") == dict(PDL=True, PDL_LATE=False, launch_pdl=True)
    assert w4_expand._operand_pdl(cuda, "f16") == dict(PDL=False, PDL_LATE=False, launch_pdl=False)
    # the W4A8 decode quantizer lets the decode GEMM launch at its start (NOTES.md session 41: −2…−3.7 µs, H100)
    assert w4_expand._operand_pdl(cuda, "e4m3_rows") == dict(PDL=True, PDL_LATE=False, launch_pdl=True)
