"""Kernel launches with less host time: ``launch(kernel, grid, *args, **kwargs)`` does what
``kernel[grid](*args, **kwargs)`` does.

At decode sizes an eager layer call is bound by the host. On the H200 box (``scripts/probe_host_parts.py``,
``probes/s13/host_before``), Triton's ``JITFunction.run`` took 37.7 µs to launch the W4A4 GEMV with its arguments
already built. The compiled kernel's own launcher, with the same arguments bound once, took 7.5 µs. The difference
is Python work Triton repeats on every call: options are re-parsed, the cache key is rebuilt as a string, the
launch-metadata dict is built even with no hook installed, and the kernel's global values are checked again.

``launch`` keeps the one step that decides correctness, Triton's own binder. That binder computes the
specialization: dtypes, 16-byte alignment of pointers, the value classes of integers, the constexprs and the
tensor-descriptor block shapes. The compiled kernel is cached per (device, specialization, launch options). On a
hit the compiled launcher is called directly. The first call of a specialization, a launch with a Triton launch hook
installed (the proton profiler), and the interpreter take ``kernel[grid]`` as before.
``LOWRANK_GEMM_FAST_LAUNCH=0`` turns the cache off (the variable is read at import).

The one check it skips is Triton's "a global value changed since the kernel compiled". Our kernels read only
module constants that never change.

Measured on the H200 host, GEMV launch with its arguments built (`probes/s13/verify_2c08539`, `host_ab`):
`jit[grid]` 49.8–50.2 µs, `launch` 36.8–38.5, the compiled launcher alone 12.3–13.0. Most of what is left is the
binder: one `native_specialize_impl` per argument into a dict of ~35 parameters, ~10 µs on a CPU core. A key of our
own would cost about as much to build in Python.
"""

from __future__ import annotations

import os

import torch
from triton import knobs

__all__ = ["launch", "FAST_LAUNCH_ENV", "fast_launch_enabled", "clear_launch_cache"]

FAST_LAUNCH_ENV = "LOWRANK_GEMM_FAST_LAUNCH"
_ENABLED = os.environ.get(FAST_LAUNCH_ENV, "1") != "0"

# (id of the JIT function, device index) → (the function, {(specialization, options): compiled kernel}). Keyed by
# id (a JITFunction's own hash is computed from its source: ~1 µs); the entry holds the function, so its id cannot be
# reused while the entry lives.
_COMPILED: dict = {}


def fast_launch_enabled() -> bool:
    return _ENABLED


def clear_launch_cache() -> None:
    _COMPILED.clear()


def launch(kernel, grid, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``. ``grid`` is a tuple of 1–3 ints, not a callable."""
    caches = getattr(kernel, "device_caches", None)
    hooks = knobs.runtime
    if (not _ENABLED or caches is None or hooks.launch_enter_hook.calls or hooks.launch_exit_hook.calls
            or callable(grid) or not torch.cuda.is_initialized()):
        kernel[grid](*args, **kwargs)
        return
    device = torch.cuda.current_device()
    entry = _COMPILED.get((id(kernel), device))
    binder = caches[device][4] if device in caches else None
    if entry is None or binder is None:
        compiled = kernel[grid](*args, **kwargs)
        _remember(kernel, device, args, kwargs, compiled)
        return
    _add_run_options(kernel, kwargs)
    bound, spec, options = binder(*args, **kwargs)
    key = (tuple(spec), tuple(options.items()))
    per_kernel = entry[1]
    compiled = per_kernel.get(key)
    if compiled is None:
        compiled = kernel.run(*args, grid=grid, warmup=False, **kwargs)
        if compiled is not None and hasattr(compiled, "result"):
            compiled = compiled.result()
        per_kernel[key] = compiled
        return
    n = len(grid)
    compiled.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1,
                 torch._C._cuda_getCurrentRawStream(device), compiled.function, compiled.packed_metadata,
                 None, None, None, *bound.values())


def _remember(kernel, device: int, args, kwargs, compiled) -> None:
    """After the first launch through Triton (which created the device's binder): cache what it compiled under the
    same key the fast path computes."""
    per_kernel = _COMPILED.setdefault((id(kernel), device), (kernel, {}))[1]
    caches = kernel.device_caches
    if compiled is None or device not in caches:
        return
    if hasattr(compiled, "result"):
        compiled = compiled.result()
    kwargs = _add_run_options(kernel, dict(kwargs))
    _, spec, options = caches[device][4](*args, **kwargs)
    per_kernel[(tuple(spec), tuple(options.items()))] = compiled


def _add_run_options(kernel, kwargs: dict) -> dict:
    """The two options Triton's JITFunction.run adds to every launch; they are part of its cache key, so of ours."""
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    return kwargs
