"""Launches for `ncu -k <kernel>` / compute-sanitizer on the device: the decode GEMM (both formats) and act_quant
at M=1 (`decode`, `actquant`), one small checked decode launch per format (`smoke`, for the sanitizers), the
v2 int4_g64 kernel at FLUX fc1, fp8 path then int8 path, two launches each (`v2g`), or the routed no-expander
coop kernel there (`v2coop`, two launches) or the four-consumer kernel (`quad`), the routed decode-M v2 kernel (`v2dec` [M], two launches), or the W4A4 GEMV at M=1,
K=4096, N=28672, three launches (`gemv`), or the skinny GEMM at M=16 (argv[2], default 16), K=4096, N=28672, three
launches (`skinny`; config from LOWRANK_GEMM_SKINNY_CONFIG), or the plain read kernel of `probe_stream.py` over the
GEMV's 62.4 MB (weights + scales), 16 programs per SM, three launches (`stream`: the GEMV's floor, side by side)."""
import sys

import torch

sys.path.insert(0, "src")
from lowrank_gemm.kernels.act_quant import act_quant  # noqa: E402
from lowrank_gemm.kernels.gluon import w4a4_ws as w4  # noqa: E402
from lowrank_gemm.kernels.gluon.w4a4_decode import launch_w4a4_decode  # noqa: E402

what = sys.argv[1] if len(sys.argv) > 1 else "decode"
if what == "smoke":
    for fmt in ("int4_2l", "int4_g64"):
        ops = w4.make_operands_v2(fmt, 5, 160, 512, 16, 64, device="cuda", col_scale=True)
        out = launch_w4a4_decode(**ops).clone()
        ref = w4.reference_v2(ops)
        err = float((out.double().cpu() - ref).norm() / ref.norm())
        print(f"smoke {fmt}: rel err {err:.2e}", "OK" if err < 1e-2 else "FAIL")
elif what == "v2g":
    ops = w4.make_operands_v2("int4_g64", 4608, 12288, 3072, 32, 64, device="cuda")
    for f8 in (True, False):
        for _ in range(2):
            w4.launch_w4a4_v2(**ops, f8=f8)
elif what == "v2coop":   # the routed M = 4608 kernel (no expander, coop, in flight, fp32 w_scale rows), two launches
    ops = w4.make_operands_v2("int4_g64", 4608, 12288, 3072, 32, 64, device="cuda")
    for _ in range(2):
        w4.launch_w4a4_v2(**ops)
elif what == "quad":   # the four-consumer kernel (gluon/w4a4_quad.py) at fc1, two launches
    ops = w4.make_operands_v2("int4_g64", 4608, 12288, 3072, 32, 64, device="cuda")
    for _ in range(2):
        w4.launch_w4a4_v2(**ops, quad=True)
elif what == "v2dec":   # the routed decode-M kernel (two expanders, paired) at M = argv[2] (64), K=4096, N=28672
    m = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    ops = w4.make_operands_v2("int4_g64", m, 28672, 4096, 32, 64, device="cuda")
    for _ in range(2):
        w4.launch_w4a4_v2(**ops)
elif what == "v2f8":   # the fp8 path alone (raw ring 4), two launches
    ops = w4.make_operands_v2("int4_g64", 4608, 12288, 3072, 32, 64, device="cuda")
    for _ in range(2):
        w4.launch_w4a4_v2(**ops, f8=True, raw_stages=4)
elif what == "gemv":
    from lowrank_gemm.kernels.w4a4_gemv import launch_w4a4_gemv
    ops = w4.make_operands_v2("int4_g64", 1, 28672, 4096, 32, 64, device="cuda")
    for _ in range(3):
        launch_w4a4_gemv(**ops)
elif what == "stream":
    sys.path.insert(0, "scripts")
    import triton
    from probe_stream import _stream_kernel
    n_words = (28672 * 2048 + 28672 * 64 * 2) // 4
    progs = torch.cuda.get_device_properties(0).multi_processor_count * 16
    wpp = triton.cdiv(triton.cdiv(n_words, progs), 2048) * 2048
    progs = triton.cdiv(n_words, wpp)
    w = torch.randint(-2**31, 2**31 - 1, (n_words,), device="cuda", dtype=torch.int32)
    v = torch.zeros(1, device="cuda", dtype=torch.int32)
    outs = torch.empty(progs, device="cuda", dtype=torch.int32)
    for _ in range(3):
        _stream_kernel[(progs,)](w, v, outs, n_words, wpp, BLOCK=2048, PDL=False, num_warps=8)
elif what == "skinny":
    from lowrank_gemm.kernels.w4a4_skinny import launch_w4a4_skinny
    m = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    ops = w4.make_operands_v2("int4_g64", m, 28672, 4096, 32, 64, device="cuda")
    for _ in range(3):
        launch_w4a4_skinny(**ops)
elif what == "decode":
    for fmt in ("int4_2l", "int4_g64"):
        ops = w4.make_operands_v2(fmt, 1, 28672, 4096, 32, 64, device="cuda")
        for _ in range(3):
            launch_w4a4_decode(**ops)
else:
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    smooth = torch.rand(4096, device="cuda", dtype=torch.bfloat16) + 0.5
    a = torch.randn(32, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    for _ in range(3):
        act_quant(x, smooth, a, 64, "int4_2l")
torch.cuda.synchronize()
