"""Programmatic dependent launch (PDL) between the kernels of one layer call.

A W4A4 layer is a chain of launches — act_quant, (the e4m3 expansion), the GEMM — and at decode sizes
each kernel runs only a few microseconds, so the gap between them and the next kernel's ramp-up (weight
loads that do not depend on the previous kernel at all) is a large share of the layer. With PDL a kernel
launched with ``launch_pdl=True`` may start once every program of the kernel before it has executed
``griddepcontrol.launch_dependents`` (or exited); it must execute ``griddepcontrol.wait`` before it reads
anything the earlier kernel wrote. Both instructions are no-ops when the launch did not use PDL, and
CUDA-graph capture keeps the dependency as a programmatic edge.

The rule each kernel of the chain follows:
- ``launch_dependents`` as early as it likes (it only allows the next grid to be scheduled: the next grid's
  ``wait`` still waits for this whole grid to finish and flush its writes). Early is not always faster: measure
  (``w4_expand.OPERAND_PDL_TRIGGER`` launches one kernel of a chain without PDL);
- ``wait`` before its first read of a predecessor's output — and before its first global write, since the
  predecessor may still read a buffer that this kernel overwrites (the caching allocator reuses memory).

The interpreter cannot run inline PTX, so kernels take a ``PDL`` constexpr that is False there
(:func:`pdl_enabled`).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .env import getenv, interpreting
from .schedule import device_index

__all__ = ["PDL_DEFAULT", "pdl_supported", "pdl_enabled", "gdc_wait", "gdc_launch_dependents", "gl_gdc_wait", "gl_gdc_launch_dependents"]


# On (LOWRANK_GEMM_PDL=0 turns it off). H200, CUDA-graph replays (NOTES.md session 5): decode layers −1…3.3 µs
# (act_quant → decode GEMM), multi-LoRA −2.5…11 µs (shrink → main), outputs bit-identical to PDL off.
PDL_DEFAULT = True


def pdl_supported(device: torch.device | None) -> bool:
    """Whether a launch on ``device`` can use PDL at all: CUDA sm_90+, not the interpreter (which cannot run the
    griddepcontrol inline PTX). Callers with their own on/off switch combine it with this."""
    if interpreting():
        return False
    if device is None or device.type != "cuda":
        return False
    return _sm90_or_later(device_index(device))


@functools.lru_cache(maxsize=None)        # a device property query is microseconds of host time per launch
def _sm90_or_later(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_enabled(device: torch.device | None = None) -> bool:
    """PDL on this launch: :func:`pdl_supported` and ``LOWRANK_GEMM_PDL`` (0/1, else :data:`PDL_DEFAULT`)."""
    env = getenv("LOWRANK_GEMM_PDL", "")
    return (env == "1" if env in ("0", "1") else PDL_DEFAULT) and pdl_supported(device)


@triton.jit
def gdc_wait():
    tl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def gdc_launch_dependents():
    tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def gl_gdc_wait():
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def gl_gdc_launch_dependents():
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)
