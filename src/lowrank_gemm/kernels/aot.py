"""Ahead-of-time compiles for sm_90 on any machine (no GPU needed).

CI uses this to check that the main kernels lower to ``wgmma`` and TMA (``cp.async.bulk.tensor``)
and to read the shared memory the compiler allocates (``metadata.shared``), which the SMEM ledger
is checked against. Under ``TRITON_INTERPRET=1`` ``@triton.jit`` yields interpreter objects that
cannot be compiled, so the compile then runs in a child process with the interpreter off.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["CompiledInfo", "compile_sm90"]

SM90 = ("cuda", 90, 32)


@dataclass(frozen=True)
class CompiledInfo:
    ptx: str
    shared: int          # bytes of shared memory the compiled kernel needs
    num_warps: int

    def has(self, *needles: str) -> bool:
        return all(n in self.ptx for n in needles)


def _compile_here(module: str, name: str, signature: dict, constexprs: dict, options: dict,
                  aligned: list | tuple = ()) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(module), name)
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as Src
    else:
        Src = ASTSource
    # a constexpr left out gets its default, as a JIT launch binds it (ASTSource alone would compile it as None:
    # falsy, so a True default silently compiled the other branch — found in session 11)
    constexprs = dict(constexprs)
    for p in fn.params:
        if p.is_constexpr and p.name not in constexprs and p.name not in signature \
                and p.default is not inspect.Parameter.empty:
            constexprs[p.name] = p.default
    sig = dict(signature)
    for k in constexprs:
        sig[k] = "constexpr"
    # what the JIT infers at launch for 16-B-aligned pointers / multiples of 16 (vectorized, cp.async)
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = Src(fn=fn, signature=sig, constexprs=dict(constexprs), attrs=attrs or None)
    c = triton.compile(src, target=GPUTarget(*SM90), options=options)
    return {"ptx": c.asm["ptx"], "shared": int(c.metadata.shared), "num_warps": int(c.metadata.num_warps)}


def compile_sm90(module: str, name: str, signature: dict, constexprs: dict | None = None,
                 aligned: tuple[str, ...] = (), **options) -> CompiledInfo:
    """Compile ``module.name`` for sm_90.

    signature: argument name → Triton type string (``"*bf16"``, ``"i32"``, ``"fp32"``, …);
    constexprs: argument name → value; aligned: argument names the JIT would specialize as
    divisible by 16 (pointers, strides); options: ``num_warps``, ``num_stages``, ….
    """
    constexprs = constexprs or {}
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return CompiledInfo(**_compile_here(module, name, signature, constexprs, options, aligned))
    payload = json.dumps({"module": module, "name": name, "signature": signature,
                          "constexprs": constexprs, "options": options, "aligned": list(aligned)})
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "lowrank_gemm.kernels.aot"], input=payload,
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"sm_90 compile of {module}.{name} failed:\n{proc.stderr[-4000:]}")
    return CompiledInfo(**json.loads(proc.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    req = json.loads(sys.stdin.read())
    out = _compile_here(req["module"], req["name"], req["signature"], req["constexprs"], req["options"],
                        req.get("aligned", ()))
    print(json.dumps(out))
