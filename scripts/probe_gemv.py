"""GPU probe (≤ ~2 min): the W4A4 GEMV (kernels/w4a4_gemv.py) at decode sizes — correctness first, then, in ONE
process, CUDA-graph medians next to cuBLAS bf16, fp8 ``_scaled_mm`` and today's decode GEMM (e4m3 path, operands
pre-expanded as the layer feeds it), two rotated operand sets.

    PYTHONPATH=src python scripts/probe_gemv.py --out $OUT [--cfgs g:32,64,4,1;g:16,64,2,1+ef] [--ms 1,2,4]
    PYTHONPATH=src python scripts/probe_gemv.py --out $OUT --two-level [--ms 1,2]

``--two-level``: the int4_2l GEMV (opt-in, impl="gemv") — per shape and M, the GEMM on int4_2l operands (checked
against the float64 reference) next to the decode kernel, and the layer (act_quant + GEMM) with impl gemv / decode
/ auto, beside cuBLAS bf16.

``--layer`` (session 11's lead for the M = 1 decode target): the layer op (act_quant + GEMV, impl auto) under the
launch-order knobs, one process, weights rotated past the L2 (one 62 MB set let evict_first keep part of it in L2
between calls): as shipped; the GEMV's first weight chunk after griddepcontrol.wait (``LOWRANK_GEMM_GEMV_EARLY=0``);
act_quant without launch_dependents (``LOWRANK_GEMM_ACT_QUANT_EARLY_DEPS=0``); both; each again with 8 rows per
1-warp program (the GEMM alone's best, 18.7 µs); no evict_first; PDL off. Every variant's output is compared with
the shipped one (bit-identical or not, max rel. difference). ``--fmt int4_2l`` for the two-level format.
Session 12 adds ``pf<P>``: the next P chunks of each weight row bulk-prefetched into L2 before griddepcontrol.wait
(``LOWRANK_GEMM_GEMV_L2_PREFETCH=P``), alone, with late_deps and with 8 rows; ``--variants`` picks, ';'-separated
(default: the launch-order check: shipped / early_deps / late_deps), and ``cfg:bn,bkw,warps,stages[+late]`` runs the
layer on that GEMV config with act_quant's trigger forced early (or late).

Writes probe_gemv.json / .md to --out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))
SHAPES = [(28672, 4096), (4096, 4096), (14336, 4096), (4096, 14336)]      # (N, K): Llama-3-8B gate_up, o/qkv, …
CFGS = ("t:16,64,2,1;g:16,64,2,1;g:32,64,4,1;g:16,128,4,1;g:32,128,4,1;g:64,64,8,1;g:16,32,1,1;g:32,32,2,1;"
        "g:64,128,4,1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".")
    ap.add_argument("--cfgs", default=CFGS)
    ap.add_argument("--ms", default="1,2,4")
    ap.add_argument("--two-level", action="store_true", help="the int4_2l GEMV instead (see above)")
    ap.add_argument("--layer", action="store_true", help="the layer under the launch-order knobs (see above)")
    ap.add_argument("--shapes", default="", help="N:K,… (default: LAYER_SHAPES with --layer, else SHAPES)")
    ap.add_argument("--variants", default=LAYER_DEFAULT,
                    help=f"--layer: ';'-separated names of {sorted(LAYER_VARIANTS)} or cfg:bn,bkw,warps,stages[+late] "
                    f"(the GEMV config, act_quant's trigger early or +late)")
    ap.add_argument("--fmt", default="int4_g64", choices=("int4_g64", "int4_2l"), help="--layer: weight format")
    args = ap.parse_args()
    if args.two_level:
        return two_level(args)
    if args.layer:
        return layer_knobs(args)
    import torch
    from _decode_probe import Probe
    from lowrank_gemm.kernels import w4a4_gemv as gv

    kernels = {"g": "gluon", "t": "triton"}
    # "g:16,64,2,1+ef+cg": config, then the weight loads' cache hints (w4a4_gemv.load_hints)
    cfgs = [(kernels[c.split(":")[0]], gv.GemvConfig(*(int(v) for v in c.split(":")[1].split("+")[0].split(","))),
             ",".join(c.split("+")[1:])) for c in args.cfgs.split(";") if c]
    probe = Probe(args.out, "probe_gemv")
    shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",") if s] or SHAPES
    for n, k in shapes:
        for m in (int(v) for v in args.ms.split(",")):
            if n != 28672 and m != 1:
                continue
            sets, ref, base = probe.operands(m, n, k)
            probe.baselines(base, sets, ref)
            for kern, cfg, hints in cfgs:
                tag = f"gemv:{kern}:" + ",".join(map(str, cfg)) + "".join(f"+{h}" for h in hints.split(",") if h)
                probe.checked(base, tag, lambda c=cfg, kk=kern, h=hints, **o: gv.launch_w4a4_gemv(
                    **o, config=c, kernel=kk, hints=h), sets, ref)
            del sets
            torch.cuda.empty_cache()
    probe.write()
    return 0


def two_level(args) -> int:
    import torch
    from _decode_probe import Probe
    from lowrank_gemm.bench.common import time_impl
    from lowrank_gemm.formats.int4_twolevel import pack_weight_2l
    from lowrank_gemm.kernels import w4a4_gemv as gv
    from lowrank_gemm.kernels.gluon import w4a4_ws as w4
    from lowrank_gemm.kernels.gluon.w4a4_decode import launch_w4a4_decode
    from lowrank_gemm.kernels.w4a4_gemm import w4a4_linear

    probe = Probe(args.out, "probe_gemv_2l")
    for n, k in SHAPES:
        for m in (int(v) for v in args.ms.split(",")):
            base = dict(M=m, N=n, K=k, r=32)
            xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
            wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
            probe.emit(**base, impl="cublas_bf16", **time_impl(lambda a, b: a @ b.T, list(zip(xs, wb))))
            del wb
            sets = [w4.make_operands_v2("int4_2l", m, n, k, 32, 64, device="cuda", bias=True, seed=s) for s in (0, 1)]
            ref = w4.reference_v2(sets[0]).cuda()
            probe.checked(base, "gemm:gemv", lambda **o: gv.launch_w4a4_gemv(**o), sets, ref)
            probe.checked(base, "gemm:decode", lambda **o: launch_w4a4_decode(**o), sets, ref)
            del sets
            wq, wmul, wsc = pack_weight_2l(torch.randn(n, k, device="cuda") * 0.02, 64)
            p = dict(qweight=wq, wscales=wsc, wmul=wmul, smooth=(torch.rand(k, device="cuda") + 0.5).to(torch.bfloat16),
                     lora_down=(torch.randn(32, k, device="cuda") * 0.02).to(torch.bfloat16),
                     lora_up=(torch.randn(n, 32, device="cuda") * 0.02).to(torch.bfloat16))
            for impl in ("gemv", "decode", "auto"):
                probe.emit(**base, impl=f"layer:{impl}", **time_impl(
                    lambda a, i=impl: w4a4_linear(a, **p, fmt="int4_2l", impl=i), [(a, ) for a in xs]))
            torch.cuda.empty_cache()
    probe.write()
    return 0


LAYER_SHAPES = [(28672, 4096), (14336, 4096), (4096, 14336), (4096, 4096), (6144, 4096)]
_EARLY = {"LOWRANK_GEMM_GEMV_EARLY": "0"}
_DEPS = {"LOWRANK_GEMM_ACT_QUANT_EARLY_DEPS": "0"}
_R8 = {"LOWRANK_GEMM_GEMV_CONFIG": "8,64,1,2"}
LAYER_VARIANTS = {"shipped": {}, "late_w": _EARLY, "late_deps": _DEPS, "late_both": {**_EARLY, **_DEPS},
                  "r8": _R8, "r8_late_w": {**_R8, **_EARLY}, "r8_late_deps": {**_R8, **_DEPS},
                  "r8_late_both": {**_R8, **_EARLY, **_DEPS}, "no_ef": {"LOWRANK_GEMM_GEMV_HINTS": ""},
                  "no_pdl": {"LOWRANK_GEMM_PDL": "0"}}
# session 12: the next P chunks of every weight row bulk-prefetched into L2 before griddepcontrol.wait
for _p in (1, 2, 4, 7):
    LAYER_VARIANTS[f"pf{_p}"] = {"LOWRANK_GEMM_GEMV_L2_PREFETCH": str(_p)}
    LAYER_VARIANTS[f"late_deps_pf{_p}"] = {**_DEPS, "LOWRANK_GEMM_GEMV_L2_PREFETCH": str(_p)}
    LAYER_VARIANTS[f"r8_pf{_p}"] = {**_R8, "LOWRANK_GEMM_GEMV_L2_PREFETCH": str(_p)}
LAYER_VARIANTS["early_deps"] = {"LOWRANK_GEMM_ACT_QUANT_EARLY_DEPS": "1"}
# session 12, last call: the weights through a cp.async ring of s chunks (LOWRANK_GEMM_GEMV_CP_STAGES)
for _s in (2, 3, 4):
    LAYER_VARIANTS[f"cp{_s}"] = {"LOWRANK_GEMM_GEMV_CP_STAGES": str(_s)}
    LAYER_VARIANTS[f"r8_cp{_s}"] = {**_R8, "LOWRANK_GEMM_GEMV_CP_STAGES": str(_s)}
    LAYER_VARIANTS[f"r32_cp{_s}"] = {"LOWRANK_GEMM_GEMV_CONFIG": "32,64,4,2", "LOWRANK_GEMM_GEMV_CP_STAGES": str(_s)}
# session 13: the epilogue's operands loaded before the K loop (LOWRANK_GEMM_GEMV_EPI_EARLY)
LAYER_VARIANTS["epi_early"] = {"LOWRANK_GEMM_GEMV_EPI_EARLY": "1"}
LAYER_VARIANTS["epi_early_deps"] = {"LOWRANK_GEMM_GEMV_EPI_EARLY": "1", "LOWRANK_GEMM_ACT_QUANT_EARLY_DEPS": "1"}
# session 12, call 2: "shipped,late_deps,r8,pf1,pf2,pf4,pf7,late_deps_pf2,late_deps_pf7,r8_pf2,r8_pf7"; then the
# per-format launch order (w4a4_gemv.act_quant_early_launch) is what ships, checked against both forced orders
LAYER_DEFAULT = "shipped;early_deps;late_deps"


def layer_knobs(args) -> int:
    import torch
    from _decode_probe import Probe
    from _scoped_env import scoped_env
    from lowrank_gemm.bench.common import rotation_count, time_impl
    from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
    from lowrank_gemm.formats.int4_twolevel import pack_weight_2l
    from lowrank_gemm.kernels.w4a4_gemm import w4a4_linear

    two_level = args.fmt == "int4_2l"
    probe = Probe(args.out, f"probe_gemv_layer_{args.fmt}")
    shapes = [tuple(int(v) for v in sh.split(":")) for sh in args.shapes.split(",")] if args.shapes else LAYER_SHAPES
    for n, k in shapes:
        def weights():
            w = torch.randn(n, k, device="cuda") * 0.02
            if two_level:
                wq, wmul, wsc = pack_weight_2l(w, 64)
                return dict(qweight=wq, wscales=wsc, wmul=wmul)
            q, sc = quantize_weight_int4(w, 64)
            return dict(qweight=pack_int4(q), wscales=sc)
        n_sets = min(4, rotation_count(n * k // 2))
        ws = [weights() for _ in range(n_sets)]
        common = dict(smooth=(torch.rand(k, device="cuda") + 0.5).to(torch.bfloat16),
                      lora_down=(torch.randn(32, k, device="cuda") * 0.02).to(torch.bfloat16),
                      lora_up=(torch.randn(n, 32, device="cuda") * 0.02).to(torch.bfloat16))
        for m in (int(v) for v in args.ms.split(",")):
            if n != 28672 and m != 1:
                continue
            base = dict(M=m, N=n, K=k, r=32, sets=n_sets)
            xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in ws]
            n_b = min(3, rotation_count(2 * n * k))
            wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(n_b)]
            probe.emit(**base, impl="cublas_bf16", **time_impl(lambda a, b: a @ b.T, list(zip(xs, wb))))
            del wb

            def layer(a, w):
                return w4a4_linear(a, **w, **common, fmt=args.fmt, impl="auto")
            want = layer(xs[0], ws[0])
            for name in args.variants.split(";"):
                # "cfg:bn,bkw,warps,stages": the GEMV config (LOWRANK_GEMM_GEMV_CONFIG), optionally "+late"
                cfg, _, late = name[4:].partition("+") if name.startswith("cfg:") else (None, "", "")
                values = LAYER_VARIANTS[name] if cfg is None else {
                    "LOWRANK_GEMM_GEMV_CONFIG": cfg, "LOWRANK_GEMM_ACT_QUANT_EARLY_DEPS": "0" if late else "1"}
                with scoped_env(**values):
                    got = layer(xs[0], ws[0])
                    diff = float((got.float() - want.float()).abs().max() / want.float().abs().max())
                    probe.emit(**base, impl=f"layer:{name}", same=bool(torch.equal(got, want)), max_rel_diff=diff,
                               **(time_impl(layer, list(zip(xs, ws))) if diff < 1e-2 else {}))
            torch.cuda.empty_cache()
    probe.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
