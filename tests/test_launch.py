"""kernels/launch.py: the cached launch keys on Triton's own specialization and falls back to ``kernel[grid]``
wherever it cannot stand in for it.

CPU: the cache logic, on a stand-in JIT function whose binder specializes an int on ``== 1`` and ``% 16`` as
Triton's does. GPU: real kernels, where reusing the wrong specialization would give a wrong answer, and the
public ops' outputs bit-identical with the cache off.
"""

from __future__ import annotations

import pytest
import torch

from lowrank_gemm.kernels import launch as L


class _Compiled:
    def __init__(self, spec):
        self.spec, self.function, self.packed_metadata, self.runs = spec, object(), object(), []

    def run(self, *args):
        self.runs.append(args)


class _FakeJit:
    """The slice of triton's JITFunction that ``launch`` touches."""

    debug = None

    def __init__(self):
        self.slow, self.compiles = [], []
        self.device_caches = {}

    def binder(self, n, x, **options):
        spec = [("i32", "one" if n == 1 else ("d16" if n % 16 == 0 else "")), ("*fp32", "D")]
        return {"n": n, "x": x}, spec, options

    def _compile(self, args, kwargs):
        _, spec, options = self.binder(*args, **kwargs)
        return _Compiled((tuple(spec), tuple(options.items())))

    def __getitem__(self, grid):
        def slow(*args, **kwargs):
            if hasattr(self, "device_caches"):
                self.device_caches.setdefault(0, ({}, {}, None, None, self.binder))
            self.slow.append((grid, args))
            kw = dict(kwargs, debug=False, instrumentation_mode="")
            return self._compile(args, kw)
        return slow

    def run(self, *args, grid, warmup, **kwargs):
        self.compiles.append((grid, args))
        return self._compile(args, kwargs)


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(L, "_ENABLED", True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: 1234, raising=False)
    L.clear_launch_cache()
    yield
    L.clear_launch_cache()


def _all_runs(fn):
    return [(c.spec, r) for e in L._COMPILED.values() if e[0] is fn for c in e[1].values() for r in c.runs]


def test_first_launch_goes_through_triton_then_the_cached_launcher(fake_cuda):
    fn = _FakeJit()
    L.launch(fn, (3, ), 32, "x0", num_warps=4)
    assert len(fn.slow) == 1 and not _all_runs(fn)
    L.launch(fn, (3, 2), 48, "x1", num_warps=4)          # same specialization (n % 16 == 0, not 1)
    assert len(fn.slow) == 1 and not fn.compiles
    (spec, args), = _all_runs(fn)
    assert args[:4] == (3, 2, 1, 1234) and args[-2:] == (48, "x1")
    assert args[6:9] == (None, None, None)                # no launch metadata, no launch hooks


def test_a_new_specialization_compiles_through_triton(fake_cuda):
    fn = _FakeJit()
    L.launch(fn, (1, ), 32, "x", num_warps=4)
    L.launch(fn, (1, ), 1, "x", num_warps=4)              # n == 1 specializes differently
    L.launch(fn, (1, ), 33, "x", num_warps=4)             # neither 1 nor a multiple of 16
    L.launch(fn, (1, ), 32, "x", num_warps=8)             # another launch option
    assert len(fn.compiles) == 3 and not _all_runs(fn)
    for n, warps in ((1, 4), (33, 4), (32, 8), (32, 4)):
        L.launch(fn, (1, ), n, "y", num_warps=warps)
    runs = _all_runs(fn)
    assert len(runs) == 4 and len(fn.compiles) == 3
    by_spec = {spec: r[-2] for spec, r in runs}
    assert len(by_spec) == 4                              # each launch went to its own specialization


@pytest.mark.parametrize("why", ["hook", "callable_grid", "disabled", "interpreter", "cuda_not_initialized"])
def test_falls_back_to_kernel_grid(fake_cuda, monkeypatch, why):
    fn = _FakeJit()
    L.launch(fn, (1, ), 32, "x")                          # the cache knows this specialization
    grid = (1, )
    if why == "hook":
        from triton import knobs
        monkeypatch.setattr(knobs.runtime.launch_enter_hook, "calls", [lambda *a: None])
    elif why == "callable_grid":
        grid = lambda meta: (1, )                        # noqa: E731
    elif why == "disabled":
        monkeypatch.setattr(L, "_ENABLED", False)
    elif why == "interpreter":
        del fn.device_caches
    else:
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    L.launch(fn, grid, 32, "x")
    assert len(fn.slow) == 2 and not _all_runs(fn)


def test_interpreted_kernels_take_the_plain_launch():
    """Under the interpreter (the CPU suite) the JIT functions have no device caches: ``launch`` is
    ``kernel[grid]`` and the kernels still compute (one real interpreted launch)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n, other=0.0) * 2, mask=offs < n)

    if hasattr(_copy, "device_caches"):
        pytest.skip("compiled mode (a GPU machine): covered by the GPU tests")
    x = torch.randn(10)
    y = torch.full((10, ), float("nan"))
    L.launch(_copy, (1, ), x, y, 10, BLOCK=16)
    assert torch.equal(y, 2 * x)


# ---------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_gpu_specializations_are_not_mixed():
    """A stride of 1 is specialized as a constant by Triton: reusing that kernel for stride 2 (or an aligned
    kernel for an unaligned pointer) would read the wrong elements."""
    import triton
    import triton.language as tl

    @triton.jit
    def _gather(x_ptr, y_ptr, n, stride, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs * stride, mask=offs < n) + 1, mask=offs < n)

    L.clear_launch_cache()
    x = torch.randn(4099, device="cuda")
    for stride, offset, n in [(1, 0, 2048), (2, 0, 2049), (1, 1, 4000), (1, 0, 2048), (3, 3, 1000), (2, 0, 17),
                              (1, 1, 33)]:
        y = torch.full((n, ), float("nan"), device="cuda")
        src = x[offset:]
        L.launch(_gather, (triton.cdiv(n, 256), ), src, y, n, stride, BLOCK=256)
        torch.testing.assert_close(y, src[: n * stride: stride][:n] + 1, rtol=0, atol=0)
    entry = L._COMPILED[(id(_gather), torch.cuda.current_device())]
    assert len(entry[1]) >= 3


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16])
def test_gpu_ops_bit_identical_with_the_cache_off(m, monkeypatch):
    """The decode-sized layers (W4A4 GEMV / skinny / decode, LoRA) through the cached launcher equal the plain
    ``kernel[grid]`` launches bit for bit, including after the cache is warm."""
    from lowrank_gemm.formats.int4 import pack_int4, quantize_weight_int4
    from lowrank_gemm.ops import lora_linear, w4a4_linear
    dev, bf = "cuda", torch.bfloat16
    k, n = 1024, 3000
    x = torch.randn(m, k, device=dev, dtype=bf)
    q, sc = quantize_weight_int4(torch.randn(n, k, device=dev) * 0.02, 64)
    layer = dict(qweight=pack_int4(q), wscales=sc, smooth=(torch.rand(k, device=dev) + 0.5).to(bf),
                 lora_down=(torch.randn(32, k, device=dev) * 0.02).to(bf),
                 lora_up=(torch.randn(n, 32, device=dev) * 0.02).to(bf))
    w = torch.randn(n, k, device=dev, dtype=bf) * 0.02
    a, b = torch.randn(16, k, device=dev, dtype=bf) * 0.02, torch.randn(n, 16, device=dev, dtype=bf) * 0.02

    def run():
        return w4a4_linear(x, **layer), lora_linear(x, w, a, b, 2.0)

    monkeypatch.setattr(L, "_ENABLED", True)
    fast = [run() for _ in range(3)]       # first call fills the cache, the others take it
    monkeypatch.setattr(L, "_ENABLED", False)
    plain = run()
    for got in fast:
        for g, p in zip(got, plain):
            assert torch.equal(g, p)


def _jit_kernels_and_direct_launches():
    """(names of the package's @triton.jit / @gluon.jit functions, [(file, line, name)] of ``name[grid](...)`` calls
    outside kernels/launch.py)."""
    import ast
    from pathlib import Path
    import lowrank_gemm
    root = Path(lowrank_gemm.__file__).parent
    trees = {p: ast.parse(p.read_text()) for p in root.rglob("*.py")}
    jitted = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                for d in node.decorator_list:
                    d = d.func if isinstance(d, ast.Call) else d
                    if isinstance(d, ast.Attribute) and d.attr == "jit":
                        jitted.add(node.name)
    direct = []
    for path, tree in trees.items():
        if path.name == "launch.py":
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in jitted):
                direct.append((str(path.relative_to(root)), node.lineno, node.func.value.id))
    return jitted, direct


def test_every_package_launch_goes_through_launch():
    """``kernel[grid](...)`` costs ~12 µs more host time per call than ``launch`` on the H200 host (session 13), and an
    eager decode call is bound by the host: no kernel of the package is launched around it."""
    jitted, direct = _jit_kernels_and_direct_launches()
    assert len(jitted) > 50            # the scan sees the package's kernels
    assert direct == [], f"kernels launched as kernel[grid](...) instead of kernels.launch.launch: {direct}"
