"""CPU probe (≈ 30 s, no GPU): the host work of each W4A4 launcher before its kernel launch, with the launches
stubbed, on CPU stand-in tensors of the shapes the benches run.

An eager call is bound by the host wherever this work exceeds the kernel's time (``bench w4a4``'s eager column:
v2 FLUX layers 1.4 ms eager vs 0.58 ms in a graph replay, session 34). This probe times the Python our launchers
run before ``launch`` — validation, routing, planning, descriptors, operand preparation — so a host-side change can
be measured here and its prediction written before a device call confirms it (``scripts/probe_host_parts.py`` is
the GPU counterpart). The routes are the CUDA routes: the stages take their device argument or are fed
``torch.device("cuda")`` where a route is decided; ``schedule.num_sms`` answers 132 (H200).

    PYTHONPATH=src python scripts/probe_host_cpu.py [--calls 300] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# CPU tensors take the launch path (not the CPU reference) in w4_expand; the launches themselves are stubbed
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.environ.get("PROBE_SRC") or str(ROOT / "src"))


def _stub_launches():
    """Every module-level ``launch`` of the package becomes a no-op; returns how many were replaced."""
    import importlib
    import pkgutil
    import lowrank_gemm.kernels as kp
    real = importlib.import_module("lowrank_gemm.kernels.launch").launch
    for info in pkgutil.walk_packages(kp.__path__, kp.__name__ + "."):
        try:
            importlib.import_module(info.name)
        except Exception:      # (optional modules: a missing dependency is not this probe's concern)
            pass
    n = 0
    for name, mod in list(sys.modules.items()):
        if name.startswith("lowrank_gemm") and getattr(mod, "launch", None) is real:
            mod.launch = lambda *a, **k: None
            n += 1
    return n


def _time(fn, calls: int) -> float:
    """Median of five runs of ``calls`` back-to-back calls, µs per call."""
    for _ in range(10):
        fn()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append(1e6 * (time.perf_counter() - t0) / calls)
    return statistics.median(runs)


def stages(M_flux=4608, M_dec=16):
    """(name, closure) of each launcher's host part on CPU tensors."""
    import torch
    from lowrank_gemm.formats.int4 import pack_int4
    from lowrank_gemm.kernels import w4a4_gemm as wg
    from lowrank_gemm.kernels.gluon import w4a4_ws as ws
    from lowrank_gemm.kernels.gluon import w4a4_decode as wd
    from lowrank_gemm.kernels import w4a4_gemv as gv

    cuda = torch.device("cuda")
    out = []

    # v2, FLUX fc2 shape, the auto route's kernel: e4m3 activations from act_quant, no expanders, coop, in flight
    K, N, r = 3072, 3072, 32
    g = torch.Generator().manual_seed(0)
    x8 = torch.randint(-8, 8, (M_flux, K), generator=g, dtype=torch.int8).to(torch.float8_e4m3fn)
    xab = torch.rand(K // 64, 2, M_flux, generator=g)
    wq = pack_int4(torch.randint(-8, 8, (N, K), generator=g, dtype=torch.int8))
    wsc = (torch.rand(K // 64, N, generator=g) + 0.5).to(torch.bfloat16)
    s = torch.randn(M_flux, r, generator=g)
    up = torch.randn(N, r, generator=g).to(torch.bfloat16)
    bias = torch.randn(N, generator=g).to(torch.bfloat16)
    y = torch.empty(M_flux, N, dtype=torch.bfloat16)
    flux = (x8, xab, wq, wsc, None, s, up, bias, y, "int4_g64", 64)
    out.append(("v2 g64 FLUX: kernel_args_v2", lambda: ws.kernel_args_v2(*flux)))
    out.append(("v2 g64 FLUX: check_gemm_args", lambda: wg.check_gemm_args(x8, xab, wq, wsc, None, s, up, bias, 64,
                                                                          "int4_g64")))
    out.append(("v2 g64 FLUX: _route", lambda: wg._route("auto", "int4_g64", M_flux, N, K, r, 64, cuda, xab, wsc,
                                                         None, True)))
    out.append(("v2 g64 FLUX: _layer_wants_f8", lambda: wg._layer_wants_f8("auto", "int4_g64", M_flux, N, K, r, 64,
                                                                           cuda, torch.bfloat16, wsc)))

    # v2 int4_2l at a decode size (the "v2" rows of bench w4a4 --suite decode)
    ops2 = ws.make_operands_v2("int4_2l", M_dec, 4096, 4096, r, device="cpu")
    out.append((f"v2 2l M={M_dec}: kernel_args_v2", lambda: ws.kernel_args_v2(**ops2)))

    # the Gluon decode kernel, int4_g64 e4m3 path (auto's route at M ≤ 16 where the GEMV does not take it)
    Kd, Nd = 4096, 28672
    x8d = torch.randint(-8, 8, (M_dec, Kd), generator=g, dtype=torch.int8).to(torch.float8_e4m3fn)
    xabd = torch.rand(Kd // 64, 2, M_dec, generator=g)
    wqd = pack_int4(torch.randint(-8, 8, (Nd, Kd), generator=g, dtype=torch.int8))
    wsd = (torch.rand(Kd // 64, Nd, generator=g) + 0.5).to(torch.bfloat16)
    sd, upd = torch.randn(M_dec, r, generator=g), torch.randn(Nd, r, generator=g).to(torch.bfloat16)
    bd, yd = torch.randn(Nd, generator=g).to(torch.bfloat16), torch.empty(M_dec, Nd, dtype=torch.bfloat16)
    dec = (x8d, xabd, wqd, wsd, None, sd, upd, bd, yd, "int4_g64", 64, None)
    out.append((f"decode g64 M={M_dec}: _args", lambda: wd._args(*dec)))
    out.append((f"decode g64 M={M_dec}: _route", lambda: wg._route("auto", "int4_g64", M_dec, Nd, Kd, r, 64, cuda,
                                                                    xabd, wsd, None, True)))

    # the GEMV at M = 1, packed operands
    xq1 = pack_int4(torch.randint(-8, 8, (1, Kd), generator=g, dtype=torch.int8))
    xs1 = (torch.rand(Kd // 64, 1, generator=g) + 0.5).to(torch.bfloat16)
    s1, y1 = torch.randn(1, r, generator=g), torch.empty(1, Nd, dtype=torch.bfloat16)
    gem = (xq1, xs1, wqd, wsd, None, s1, upd, bd, y1, "int4_g64", 64)
    out.append(("gemv g64 M=1: gemv_args", lambda: gv.gemv_args(*gem, kernel="gluon", swar=True)))

    # act_quant's host part (the CPU device plans its K split for 8 SMs, not 132: the same host work)
    from lowrank_gemm.kernels.act_quant import act_quant
    xf = torch.randn(M_flux, K, generator=g).to(torch.bfloat16)
    lam = torch.rand(K, generator=g) + 0.5
    down = torch.randn(r, K, generator=g).to(torch.bfloat16)
    out.append(("act_quant g64 FLUX (f8 out)", lambda: act_quant(xf, lam, down, 64, "int4_g64", out="f8")))
    xd = torch.randn(M_dec, Kd, generator=g).to(torch.bfloat16)
    lamd, downd = torch.rand(Kd, generator=g) + 0.5, torch.randn(r, Kd, generator=g).to(torch.bfloat16)
    out.append((f"act_quant g64 M={M_dec} (f8 out)", lambda: act_quant(xd, lamd, downd, 64, "int4_g64", out="f8")))

    # the whole layer op body (check, route, act_quant, GEMM launcher), its routes decided for CUDA (_cuda_routes)
    from lowrank_gemm.formats.int4 import quantize_weight_int4
    for name, M, Kl, Nl in (("FLUX v2 route", M_flux, K, N), (f"M={M_dec} decode route", M_dec, Kd, Nd),
                            ("M=1 GEMV route", 1, Kd, Nd)):
        q, sc = quantize_weight_int4(torch.randn(Nl, Kl, generator=g) * 0.02, 64)
        xl = torch.randn(M, Kl, generator=g).to(torch.bfloat16)
        lay = (xl, pack_int4(q), sc.to(torch.bfloat16), (torch.rand(Kl, generator=g) + 0.5).to(torch.bfloat16),
               (torch.randn(r, Kl, generator=g) * 0.02).to(torch.bfloat16),
               (torch.randn(Nl, r, generator=g) * 0.02).to(torch.bfloat16), None, None, 64, "int4_g64",
               torch.bfloat16, "auto")
        out.append((f"layer g64 {name}", lambda lay=lay: wg._w4a4_linear_impl(*lay)))
    return out


def _cuda_routes():
    """The W4A4 routes decide for CUDA on the CPU tensors: each route function gets torch.device("cuda") for its
    device argument. Returns {function name: 0} counters of how often each was asked (the probe checks the layer
    stages went through them)."""
    import torch
    from lowrank_gemm.kernels import w4a4_gemm as wg
    cuda, calls = torch.device("cuda"), {}
    for fname, pos in (("_route", 7), ("_layer_wants_f8", 7), ("_early_launch", 5)):
        real = getattr(wg, fname)
        calls[fname] = 0

        def wrapped(*a, _real=real, _pos=pos, _name=fname, **k):
            calls[_name] += 1
            return _real(*a[:_pos], cuda, *a[_pos + 1:], **k)
        setattr(wg, fname, wrapped)
    return calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args()
    import torch
    from lowrank_gemm.kernels import schedule
    schedule.num_sms = lambda device: 132
    stubbed = _stub_launches()
    import lowrank_gemm.kernels.gluon.w4a4_decode as wd
    wd.num_sms = schedule.num_sms
    routed = _cuda_routes()
    rows = []
    for name, fn in stages():
        us = _time(fn, a.calls)
        rows.append({"stage": name, "us": round(us, 2)})
        print(f"{name:48s} {us:9.2f} µs")
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), "?") if Path("/proc/cpuinfo").exists() else "?"
    meta = {"torch": torch.__version__, "launches_stubbed": stubbed, "cpus": os.cpu_count(), "cpu_model": model,
            "src": os.environ.get("PROBE_SRC") or "this tree",
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    print(f"route calls: {routed}")
    if a.out:
        Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
