"""Device check (session 26): does the paired / two-expander int4_g v2 kernel survive MAIN rings whose stage count is
odd once its K loop wraps the ring? One case per process (a fault poisons the context), e.g.
    python3 scripts/_v2_stage_check.py CASE   → prints "CASE ok err=…" / "CASE MISMATCH …" (a fault exits nonzero)
CASE: name=M,N,K,rank,group[,raw=..][,main=..][,expanders=..] (main= forces the MAIN stage count the ledger chose)."""
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
if "raw" in kw:
    kw["raw_stages"] = kw.pop("raw")
ops = w4.make_operands_v2("int4_g64", M, N, K, rank, group, device="cuda")
_, _, cx, cfg, _ = w4.kernel_args_v2(**ops, **kw)
out = w4.launch_w4a4_v2(**ops, **kw).clone()
torch.cuda.synchronize()
again = w4.launch_w4a4_v2(**ops, **kw).clone()
torch.cuda.synchronize()
ref = w4.reference_v2(ops)
err = float((out.double().cpu() - ref).norm() / ref.norm())
tag = (f"main={cfg.num_stages} raw={cx.get('RAW_STAGES_N')} paired={cx.get('PAIRED')} "
       f"expanders={cx.get('EXPANDERS')} lr={cfg.lowrank_stages}")
ok = err < 1e-2 and torch.equal(out, again) and not torch.isnan(out).any()
print(f"{name} {'ok' if ok else 'MISMATCH'} err={err:.2e} same={torch.equal(out, again)} {tag}", flush=True)
sys.exit(0 if ok else 3)
