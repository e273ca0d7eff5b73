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


class _CompileServer:
    """One child process (interpreter off) that compiles request after request: under ``TRITON_INTERPRET`` every
    compile used to start its own interpreter, and importing torch, Triton and the package took ~5 s of each
    (~190 AOT tests in the CPU suite). Requests and replies are one JSON line each; the child's stderr goes to a
    file, so an error message (or a crash) can be reported without a pipe filling up."""

    def __init__(self):
        import tempfile
        self._err = tempfile.TemporaryFile(mode="w+")
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        self.proc = subprocess.Popen([sys.executable, "-m", "lowrank_gemm.kernels.aot"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _stderr_tail(self) -> str:
        self._err.flush()
        self._err.seek(0)
        return self._err.read()[-4000:]

    def request(self, payload: str) -> dict:
        try:
            self.proc.stdin.write(payload + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except OSError:             # a broken pipe: the child is gone
            line = ""
        if not line:
            raise RuntimeError(f"the sm_90 compile server died (rc={self.proc.wait()}):\n{self._stderr_tail()}")
        return json.loads(line)


_SERVER: _CompileServer | None = None


def _compile_in_child(payload: str, what: str) -> dict:
    global _SERVER
    if _SERVER is None or not _SERVER.alive():
        _SERVER = _CompileServer()
    server = _SERVER
    try:
        reply = server.request(payload)
    except RuntimeError:
        _SERVER = None              # the next compile starts a fresh child
        raise
    if "error" in reply:
        raise RuntimeError(f"sm_90 compile of {what} failed:\n{reply['error']}")
    return reply["result"]


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
    # the caller's environment travels with each request (a test may have set a knob since the child started)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    payload = json.dumps({"module": module, "name": name, "signature": signature, "constexprs": constexprs,
                          "options": options, "aligned": list(aligned), "env": env})
    return CompiledInfo(**_compile_in_child(payload, f"{module}.{name}"))


def _serve() -> None:
    """The child's loop: a request per stdin line, a reply per stdout line ({"result": …} or {"error": …})."""
    import traceback
    replies = os.fdopen(os.dup(1), "w")      # the protocol's own channel; anything else printed goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if "env" in req:
            os.environ.clear()
            os.environ.update(req["env"])
        try:
            out = {"result": _compile_here(req["module"], req["name"], req["signature"], req["constexprs"],
                                           req["options"], req.get("aligned", ()))}
        except Exception:          # the compile's own error, reported to the caller; the server lives on
            out = {"error": traceback.format_exc()[-4000:]}
        replies.write(json.dumps(out) + "\n")
        replies.flush()


if __name__ == "__main__":
    _serve()
