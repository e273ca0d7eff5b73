"""Device check (session 26): does the paired / two-expander int4_g v2 kernel survive MAIN rings whose stage count is
odd once its K loop wraps the ring? One case per process (a fault poisons the context), e.g.
    python3 scripts/_v2_stage_check.py CASE   → prints "CASE ok err=…" / "CASE MISMATCH …" (a fault exits nonzero)
REPS=n: n more launches compared bit for bit with the routed plan's output instead of the float64 reference.
CASE: name=M,N,K,rank,group[,raw=..][,main=..][,expanders=..] (main= forces the MAIN stage count the ledger chose)."""
import os
import sys

import torch

sys.path.insert(0, "src")
from lowrank_gemm.kernels.gluon import w4a4_ws as w4  # noqa: E402

name, spec = sys.argv[1].split("=", 1)
parts = spec.split(",")
M, N, K, rank, group = (int(v) for v in parts[:5])
kw = {k: int(v) for k, v in (p.split(":") for p in parts[5:])}
force_main = kw.pop("main", None)
if force_main:
    _plan = w4.plan_w4a4_v2

    def plan(*a, **k):
        return _plan(*a, **k).replace(num_stages=force_main)
    w4.plan_w4a4_v2 = plan
    _args = w4.kernel_args_v2

    def kernel_args(*a, **k):           # the kernel refuses odd strided rings unless told it is a reproduction
        g, args, cx, cfg, dbg = _args(*a, **k)
        return g, args, dict(cx, ODD_RINGS_OK=True), cfg, dbg
    w4.kernel_args_v2 = kernel_args
if "bn" in kw:             # a block_n other than the default's (the decode variants of probe_w4a4_w8.py)
    kw["config"] = w4.default_config_v2("int4_g64", group).replace(block_n=kw.pop("bn"))
if "raw" in kw:
    kw["raw_stages"] = kw.pop("raw")
ops = w4.make_operands_v2("int4_g64", M, N, K, rank, group, device="cuda")
_, _, cx, cfg, _ = w4.kernel_args_v2(**ops, **kw)
out = w4.launch_w4a4_v2(**ops, **kw).clone()
torch.cuda.synchronize()
again = w4.launch_w4a4_v2(**ops, **kw).clone()
torch.cuda.synchronize()
reps = int(os.environ.get("REPS", "0"))
if reps:   # repeat mode: many back-to-back launches of this case against the routed plan's output (same bits)
    base = w4.launch_w4a4_v2(**ops).clone()
    bad = 0
    for i in range(reps):
        o = w4.launch_w4a4_v2(**ops, **kw)
        bad += int(not torch.equal(o, base))
    torch.cuda.synchronize()
    print(f"{name} repeat {reps}: {bad} launches differ from the routed plan's bits", flush=True)
    if bad:
        sys.exit(4)
    ref = None
    err = 0.0
else:
    ref = w4.reference_v2(ops)
    err = float((out.double().cpu() - ref).norm() / ref.norm())
tag = (f"main={cfg.num_stages} raw={cx.get('RAW_STAGES_N')} paired={cx.get('PAIRED')} "
       f"expanders={cx.get('EXPANDERS')} lr={cfg.lowrank_stages}")
ok = err < 1e-2 and torch.equal(out, again) and not torch.isnan(out).any()
print(f"{name} {'ok' if ok else 'MISMATCH'} err={err:.2e} same={torch.equal(out, again)} {tag}", flush=True)
sys.exit(0 if ok else 3)
