"""Single-adapter LoRA GEMM: launchers for every fusion strategy and the public op.

    y = x·Wᵀ + scale·(x·Aᵀ)·Bᵀ + bias          x [..., K], W [N, K], A [r, K], B [N, r], bias [N]

``lora_linear`` validates, then calls the custom op ``lowrank_gemm::lora_linear`` (opaque to
``torch.compile``, shape-only fake impl; no host syncs, so it can be captured in a CUDA graph).
Inside, the planner (:func:`lowrank_gemm.plan.planner.plan_lora`) picks a strategy and config
unless ``strategy`` is given; kernels live in :mod:`._lora_kernels`.

Launch options that leave the plan as it is (:class:`LoraOptions`: epilogue prefetch, PDL between
``split``'s two kernels, full-rank down kernel) are off unless ``LOWRANK_GEMM_LORA_OPTIONS`` or
:func:`lora_options` turn them on. A one-launch (``split_mode="fixup"``) split-K with at least
one wave of tiles splits only the tiles past the last whole wave (:func:`planner.fixup_dp_tiles`).

Where it runs:
- CUDA tensors: Triton kernels.
- CPU tensors with ``TRITON_INTERPRET=1``: the same kernels in Triton's interpreter (tests).
- CPU tensors otherwise, or ``strategy="torch"``: unfused PyTorch computed in fp32, cast back.
- ``strategy="unfused"``: the three library GEMMs in the input dtype (what PyTorch runs without this package); the
  planner routes it only from a user's own tuned table, where it measured fastest (:mod:`..plan.autotune`).

Input contract (decisions, tested):
- dtypes: x, weight, lora_a, lora_b (and bias) all float16 or all bfloat16; output has x's dtype.
- rank 0 (``lora_a [0, K]``, ``lora_b [N, 0]``) is accepted: a plain GEMM (+ bias).
- M = 0 gives an empty ``[..., N]`` result.
- TMA needs 16-byte aligned row strides and base pointers: non-contiguous or misaligned inputs
  are copied, and K that is not a multiple of 8 elements is zero-padded (a copy of x, W and A:
  correct but slow — real layers have K % 8 == 0).
- ``merged`` / ``concat`` cache W + scale·B·A / [W; A] keyed by the tensors' data pointers and
  versions (and ``scale``), evicted when a source tensor is freed: in-place edits bump the version
  and invalidate the entry. Inference tensors have no version counter; there only the pointer is
  used — call :func:`clear_weight_cache` after editing such weights in place.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import weakref
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Optional

import torch
from torch.utils import _python_dispatch
from triton.tools.tensor_descriptor import TensorDescriptor

from ..plan.config import KernelConfig
from ..plan.planner import (LORA_STRATEGIES, block_r_for, can_implement, current_pin, fixup_dp_tiles, pinned,
                            plan_lora, user_plan)
from ..plan.tuned import read_table, tuned_file
from .env import env_on, getenv, interpreting
from .launch import launch
from .pdl import pdl_supported
from .persistent import capturing as _capturing, outside_graph_pools, persistent_zeros, stream_key
from .tma import TMA_ALIGN, tma_operand
from .row_quant import fp8_rows
from . import _lora_kernels as K_
from ._lora_kernels import smem_ledger
from .schedule import (cdiv, device_index, flat_programs, flat_s_tasks, grouped_tile_host, next_pow2, num_sms,
                       persistent_grid)

__all__ = ["lora_linear", "lora_linear_impl", "smem_ledger", "clear_weight_cache", "check_inputs",
           "run_strategy", "LoraOptions", "lora_options", "current_options", "LORA_OPTIONS_ENV"]

_DTYPES = (torch.float16, torch.bfloat16)
# fp8 base weights (with ``weight_scale``, fp32 per output channel): widened to x's dtype tile by tile in the kernels
FP8_WEIGHTS = (torch.float8_e4m3fn, torch.float8_e5m2)
# the strategies whose kernels take the weight scale: merged (W + BA), concat ([W; A]) and kcat ([W | B]) put W in
# one buffer with a 16-bit factor, which an fp8 W cannot share
WEIGHT_SCALE_STRATEGIES = ("kloop", "split", "streams", "streamk", "persistent_static", "persistent_dynamic")
# fp8 activations too (W8A8, ``fp8_activations=True``): the strategies whose S comes from the 16-bit x outside the main
# K loop (the down kernel or a side-stream GEMM), so only the main product sees the fp8 x
FP8_ACT_STRATEGIES = ("split", "streams")


# ---------------------------------------------------------------------------- input hygiene

def check_inputs(x, weight, lora_a, lora_b, bias=None, strategy: str = "auto", weight_scale=None,
                 fp8_activations: bool | int = False) -> None:
    """Raise ValueError/TypeError saying expected vs got for any malformed input. ``weight`` may be fp8
    (:data:`FP8_WEIGHTS`) with ``weight_scale`` (its per-output-channel or per-tensor scale: [N] or one value);
    ``fp8_activations`` False / True / 2 (:func:`lora_linear`)."""
    for name, t in (("x", x), ("weight", weight), ("lora_a", lora_a), ("lora_b", lora_b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() < 1:
        raise ValueError(f"x must be [..., K] with at least 1 dim, got shape {tuple(x.shape)}")
    for name, t in (("weight", weight), ("lora_a", lora_a), ("lora_b", lora_b)):
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got {t.dim()}-D shape {tuple(t.shape)}")
    k, n, r = x.shape[-1], weight.shape[0], lora_a.shape[0]
    if weight.shape[1] != k:
        raise ValueError(f"weight must be [N, K] with K={k} (x's last dim), got {tuple(weight.shape)}")
    if lora_a.shape[1] != k:
        raise ValueError(f"lora_a must be [r, K] with K={k}, got {tuple(lora_a.shape)}")
    if tuple(lora_b.shape) != (n, r):
        raise ValueError(f"lora_b must be [N, r] = [{n}, {r}] (N from weight, r from lora_a), "
                         f"got {tuple(lora_b.shape)}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias must be [N] = [{n}], got {tuple(bias.shape)}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"x must be float16 or bfloat16, got {x.dtype}")
    named = [("weight", weight), ("lora_a", lora_a), ("lora_b", lora_b)]
    if bias is not None:
        named.append(("bias", bias))
    for name, t in named:
        if t.dtype != x.dtype and not (name == "weight" and t.dtype in FP8_WEIGHTS):
            raise TypeError(f"{name} must have x's dtype {x.dtype}"
                            + (" (or an fp8 dtype, with weight_scale)" if name == "weight" else "") + f", got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name} must be on x's device {x.device}, got {t.device}")
    if strategy != "auto" and strategy not in LORA_STRATEGIES:
        raise ValueError(f"strategy must be 'auto' or one of {LORA_STRATEGIES}, got {strategy!r}")
    check_fp8_base(x, weight, weight_scale, fp8_activations)
    if strategy == "unfused" and (weight_scale is not None or fp8_activations):
        raise ValueError(f"strategy 'unfused' runs three 16-bit library GEMMs: it takes no weight_scale or "
                         f"fp8_activations (use 'auto', 'torch' or one of {WEIGHT_SCALE_STRATEGIES})")
    if weight_scale is not None and strategy not in ("auto", "torch") and strategy not in WEIGHT_SCALE_STRATEGIES:
        raise ValueError(f"strategy {strategy!r} keeps W in one buffer with a 16-bit factor and takes no "
                         f"weight_scale; with one use 'auto' or one of {WEIGHT_SCALE_STRATEGIES}")
    if fp8_activations and strategy not in ("auto", "torch") and strategy not in FP8_ACT_STRATEGIES:
        raise ValueError(f"fp8_activations: strategy {strategy!r} computes S from the main loop's x tiles, which "
                         f"would be fp8; use 'auto' or one of {FP8_ACT_STRATEGIES}")


def check_fp8_base(x, weight, weight_scale, fp8_activations) -> None:
    """An fp8 base's operands (the single- and the multi-adapter ops): an fp8 ``weight`` needs ``weight_scale`` ([N]
    or one value, floating point, on x's device); ``fp8_activations`` (False / True / 2) needs an e4m3 weight."""
    n = weight.shape[0]
    if weight.dtype in FP8_WEIGHTS and weight_scale is None:
        raise ValueError(f"an fp8 weight ({weight.dtype}) needs weight_scale: its scale per output channel [N] or "
                         "one per-tensor value")
    if weight_scale is not None:
        if not isinstance(weight_scale, torch.Tensor) or not weight_scale.is_floating_point():
            raise TypeError(f"weight_scale must be a floating-point tensor, got {type(weight_scale).__name__}"
                            f"{'' if not isinstance(weight_scale, torch.Tensor) else ' ' + str(weight_scale.dtype)}")
        if not (weight_scale.numel() == 1 or tuple(weight_scale.shape) == (n,)):
            raise ValueError(f"weight_scale must be [N] = [{n}] or hold one value, got shape {tuple(weight_scale.shape)}")
        if weight_scale.device != x.device:
            raise ValueError(f"weight_scale must be on x's device {x.device}, got {weight_scale.device}")
    if _act_terms(fp8_activations) and weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"fp8_activations quantizes x to e4m3 per token for an fp8 × fp8 main product: the weight "
                         f"must be float8_e4m3fn (with weight_scale), got {weight.dtype}")


def column_scale(weight_scale: torch.Tensor, n: int) -> torch.Tensor:
    """An fp8 weight's scale ([N] or one value) as the kernels read it: float32 [N], contiguous."""
    return weight_scale.to(torch.float32).reshape(-1).expand(n).contiguous()


def _act_terms(fp8_activations) -> int:
    """``fp8_activations`` as the number of e4m3 terms of x (0: x stays 16-bit), or a ValueError."""
    if not isinstance(fp8_activations, int) or fp8_activations not in (0, 1, 2):
        raise ValueError(f"fp8_activations must be False, True (x in one e4m3 term) or 2 (two terms), "
                         f"got {fp8_activations!r}")
    return int(fp8_activations)


def _k_padded(k: int, elem_bytes: int) -> int:
    per = TMA_ALIGN // elem_bytes
    return cdiv(k, per) * per


def _desc(t: torch.Tensor, rows: int, cols: int) -> TensorDescriptor:
    return TensorDescriptor.from_tensor(t, [rows, cols])


_interpreting = interpreting


def _use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda or (x.device.type == "cpu" and _interpreting())


# ---------------------------------------------------------------------------- launch options

@dataclass(frozen=True)
class LoraOptions:
    """Launch choices under a given plan (strategy + config). Measured on the H200 (``scripts/probe_lora.py
    --issue2``, NOTES.md session 5): ``pdl`` pays wherever ``split`` runs its down kernel (M=256, 4096²:
    28.5 → 25.8 µs) and is on by default with the project-wide switch (``LOWRANK_GEMM_PDL``, kernels/pdl.py);
    ``prefetch`` is mixed (−0.3 µs at M=256 4096², +2.6 at M=256 N=28672) and ``down_full_rank`` neutral, so
    both stay off; ``s_words`` is on by default (session 30). Set per process with ``LOWRANK_GEMM_LORA_OPTIONS``
    (comma-separated field names, ``all`` or ``none``; replaces the defaults), per scope with :func:`lora_options`
    (which wins).

    - ``prefetch``: the epilogue's B tile and bias (and, for ``split`` without PDL, the S rows) are
      loaded before the K loop, so their round trip overlaps the pipeline fill instead of following
      the last MMA (outputs bit-identical).
    - ``pdl``: ``split``'s main kernel is the programmatic dependent of the down kernel: its K loop
      starts while S is computed, and it waits (griddepcontrol) before it reads S or writes anything
      (outputs bit-identical). Main CTAs start on every SM without a down CTA; the rest follow as
      the down CTAs finish (beside a down CTA's 80 KB only a main CTA of ≤ ~145 KB fits).
    - ``down_full_rank``: the down kernel covers all r ≤ 128 ranks per program (X read once) instead
      of 16-rank blocks (``SPLIT_BLOCK_R``: X read ⌈r/16⌉ times — at M=4096, K=4096, r=64 three
      extra 32 MB passes). S differs from the 16-rank blocks at most in the MMA's summation order.
    - ``s_words``: plans with in-grid S producers (``KernelConfig.s_producers`` ≤ 4, the S rows held for the
      epilogue) hand S over as stamped 8-byte words, so the main tiles' S loads are their synchronization — one
      round trip after the K loop instead of an acquire and the loads behind it, and no reset ticket
      (``_lora_kernels._s_rows_words``; outputs bit-identical). On by default (with ``pdl``, the fields the
      defaults turn on; ``LoraOptions()`` itself is all off, as ``none`` is). H200, CUDA-graph replays paired
      against cuBLAS in one process (``probes/s30/s30_words2``): `auto` 4096² r16 M = 1 / 16 14.42 / 14.02 →
      13.85 / 13.36 µs, r8 14.21 / 14.23 → 13.50 / 13.47, 8192² r16 36.5 / 36.7 → 35.9 / 36.0.
    """

    prefetch: bool = False
    pdl: bool = False
    down_full_rank: bool = False
    s_words: bool = False


LORA_OPTIONS_ENV = "LOWRANK_GEMM_LORA_OPTIONS"
_OPTION_NAMES = tuple(f.name for f in fields(LoraOptions))
_OPTIONS: contextvars.ContextVar[LoraOptions | None] = contextvars.ContextVar("lora_options", default=None)


@functools.lru_cache(maxsize=16)
def _options_from_env(value: str, _pdl_env: str = "") -> LoraOptions:   # _pdl_env: part of the cache key
    names = [v.strip().lower() for v in value.split(",") if v.strip()]
    if not names:
        from .pdl import PDL_DEFAULT
        env = getenv("LOWRANK_GEMM_PDL", "")
        return LoraOptions(pdl=env == "1" if env in ("0", "1") else PDL_DEFAULT, s_words=True)
    if names == ["none"]:
        return LoraOptions()
    if names == ["all"]:
        names = list(_OPTION_NAMES)
    bad = [n for n in names if n not in _OPTION_NAMES]
    if bad:
        raise ValueError(f"{LORA_OPTIONS_ENV} takes a comma-separated subset of {_OPTION_NAMES}, 'all' or 'none', "
                         f"got {value!r}")
    return LoraOptions(**{n: True for n in names})


def current_options() -> LoraOptions:
    scoped = _OPTIONS.get()
    return scoped if scoped is not None else _options_from_env(getenv(LORA_OPTIONS_ENV, ""),
                                                                getenv("LOWRANK_GEMM_PDL", ""))


@contextlib.contextmanager
def lora_options(**flags: bool):
    """Set :class:`LoraOptions` fields for a scope (the others keep their current value)."""
    token = _OPTIONS.set(replace(current_options(), **flags))
    try:
        yield
    finally:
        _OPTIONS.reset(token)


# ---------------------------------------------------------------------------- weight cache

class _WeightCache:
    """Derived weights ([W; A], W + scale·B·A), keyed by address + version and evicted when a source
    tensor object is freed (so a reused address can never hit a stale entry): an LRU bounded by
    ``capacity`` entries and ``max_bytes`` (env ``LOWRANK_GEMM_WEIGHT_CACHE_MB``, default 2048).

    Several entries, not one: a model (or the bench, which rotates ≥ 3×L2 of weight sets) calls
    the op with several weights in turn, and a one-entry cache would rebuild on every call. The
    newest entry is always kept, even when it alone exceeds ``max_bytes``."""

    def __init__(self, capacity: int = 16, max_bytes: int | None = None):
        self.capacity = capacity
        if max_bytes is None:
            max_bytes = int(float(getenv("LOWRANK_GEMM_WEIGHT_CACHE_MB", "2048")) * 2**20)
        self.max_bytes = max_bytes
        self.entries: collections.OrderedDict = collections.OrderedDict()

    @staticmethod
    def _nbytes(v) -> int:
        return v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0

    def nbytes(self) -> int:
        return sum(self._nbytes(v) for v in self.entries.values())

    @staticmethod
    def _ident(t: torch.Tensor) -> tuple:
        try:
            version = t._version
        except RuntimeError:      # inference tensors carry no version counter
            version = -1
        return (t.data_ptr(), version, tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device))

    def get(self, kind: str, tensors: tuple, extra: tuple, build):
        key = (kind, extra) + tuple(self._ident(t) for t in tensors)
        hit = self.entries.get(key)
        if hit is not None:
            self.entries.move_to_end(key)
            return hit
        value = outside_graph_pools(build, tensors[0].device)
        self.entries[key] = value
        # A data pointer outlives nothing: once a source tensor is freed, a new tensor can get the
        # same address and version and would hit a stale entry. Evict when any source dies.
        for t in tensors:
            weakref.finalize(t, self.entries.pop, key, None)
        while len(self.entries) > 1 and (len(self.entries) > self.capacity
                                         or self.nbytes() > self.max_bytes):
            self.entries.popitem(last=False)
        return value

    def clear(self) -> None:
        self.entries.clear()


_WEIGHT_CACHE = _WeightCache()


def clear_weight_cache() -> None:
    """Drop cached merged / concatenated weights (needed only after in-place edits of inference
    tensors, whose version counter cannot be read)."""
    _WEIGHT_CACHE.clear()


# ---------------------------------------------------------------------------- launchers

def _lora_linear_torch(x, weight, lora_a, lora_b, scale, bias, weight_scale=None, fp8_activations=False):
    """Unfused fallback in fp32 (CPU without the interpreter, or ``strategy="torch"``)."""
    xf = x.float()
    w = weight.float() if weight_scale is None else weight.float() * weight_scale.float().reshape(-1, 1)
    if fp8_activations:
        x8, xs = fp8_rows(xf.reshape(-1, xf.shape[-1]), terms=int(fp8_activations))
        xq = x8.float().reshape(int(fp8_activations), -1, xf.shape[-1]).sum(0) * xs[:, None]
        y = (xq @ w.t()).reshape(*x.shape[:-1], w.shape[0])
    else:
        y = xf @ w.t()
    if lora_a.shape[0] > 0:
        y = y + scale * ((xf @ lora_a.float().t()) @ lora_b.float().t())
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def _reduce_tile(cfg: KernelConfig) -> tuple[int, int]:
    # memory-bound pass over the workspace: small tiles so even M=64 gives ≥ 1 wave of CTAs
    return min(cfg.block_m, 32), min(cfg.block_n, 64)


def _launch_main(x, w, a, b, s, bias, y, sws, M, N, Kp, R, scale, cfg, *, lowrank, partial,
                 fixup=None, pdl=False, producers=None, bank=None, s_words=False, w_scale=None, x_scale=None):
    """lora_main_kernel over an [M, N] grid of tiles × split_k. Shapes as in the kernel; s is
    [S_SPLITS, M, ≥R] fp32 (read only by GLOBAL); sws is [SPLIT_K, M, BR] (PARTIAL) or
    [SPLIT_K, n tiles, M, BR] (FIXUP). ``fixup = (ws [SPLIT_K, M, N] fp32, tickets int32 [tiles])``
    selects the one-launch split-K (y is then the real output); with ≥ one wave of tiles only the
    tiles past the last whole wave are split (:func:`fixup_dp_tiles`, a 1-D grid). ``pdl``: launched
    as the programmatic dependent of the down kernel just before it (GLOBAL). ``producers`` (GLOBAL,
    ``cfg.s_producers`` > 0): int32 [2] zeroed counters; ``cfg.s_producers`` programs at the head of the grid
    write S's K slices into s (no down kernel); with ``s_words`` s is int64 words and ``producers`` the two int64
    epoch counters (:class:`_SWords`). ``bank``: the kernel's BANK arguments (:func:`run_bank`). ``w_scale``: fp32 [N],
    the per-output-channel scale of fp8 weights; ``x_scale``: fp32 [M], x's per-token scale when x is fp8
    (:func:`run_strategy`)."""
    c = cfg
    x_d = _desc(x, c.block_m, c.block_k)
    w_d = _desc(w, c.block_n, c.block_k)
    a_d = _desc(a, c.block_r, c.block_k) if (lowrank == K_.LOWRANK_KLOOP or producers is not None) else x_d
    sy = (y.stride(0), y.stride(1), y.stride(2)) if partial else (0, y.stride(0), y.stride(1))
    ssw = (sws.stride(0), 0, sws.stride(1), sws.stride(2)) if sws.dim() == 3 else sws.stride()
    ws, cnt = fixup if fixup is not None else (_dummy(x.device), producers if producers is not None
                                               else _dummy(x.device))
    has_bias = bias is not None and not partial
    split = c.split_k if (partial or fixup is not None) else 1
    tiles = cdiv(M, c.block_m) * cdiv(N, c.block_n)
    r_chunks = cdiv(R, c.block_r) if lowrank == K_.LOWRANK_GLOBAL else 1
    grid, dp, meta = (tiles, split), 0, {}
    if fixup is not None:
        meta = fixup_meta(M, c)
        dp = fixup_dp_tiles(tiles, split, _wave_sms(x.device))
        if dp:
            grid, meta["HYBRID"] = (dp + (tiles - dp) * split,), True
    if pdl:
        meta.update(PDL=True, launch_pdl=True)
    if c.swap_ab:
        meta["SWAP_AB"] = True
    if producers is not None:
        grid, meta["S_PRODUCERS"] = (c.s_producers + tiles, 1), c.s_producers
        if s_words:
            meta["S_WORDS"] = True
    if _prefetch_ok(c, b.element_size() * 8, lowrank, partial=partial, has_bias=has_bias,
                    r_chunks=r_chunks):
        meta["EPI_PREFETCH"] = True
    if bank is not None:
        meta.update(bank)
    if w_scale is not None:
        meta["wscale_ptr"] = w_scale
    if x_scale is not None:
        meta["xscale_ptr"] = x_scale
        if x.shape[0] == 2 * M:                # two e4m3 terms per token (row_quant.fp8_rows, terms=2)
            meta["X_TERMS"] = 2
    launch(K_.lora_main_kernel, grid,
        x_d, w_d, a_d, s, b, bias if has_bias else y, y, sws, ws, cnt, M, N, Kp, R, scale,
        split, s.shape[0], dp,
        s.stride(0), s.stride(1), s.stride(2), b.stride(0), b.stride(1), *sy, *ssw,
        ws.stride(0), ws.stride(1), ws.stride(2),
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, BLOCK_R=c.block_r,
        GROUP_M=c.group_m, LOWRANK=lowrank, R_CHUNKS=r_chunks,
        HAS_BIAS=has_bias, PARTIAL=partial, FIXUP=fixup is not None, **meta,
        num_warps=c.num_warps, num_stages=c.num_stages)


_LEDGER_STRATEGY = {K_.LOWRANK_NONE: "merged", K_.LOWRANK_KLOOP: "kloop", K_.LOWRANK_GLOBAL: "split"}


def _prefetch_ok(cfg: KernelConfig, dtype_bits: int, lowrank: int, *, partial: bool, has_bias: bool,
                 r_chunks: int) -> bool:
    """EPI_PREFETCH for this launch: asked for (LoraOptions.prefetch) or a swap_ab plan (decode-sized
    M: the epilogue's loads after the last MMA are pure exposed latency there), something to
    prefetch, one rank chunk of S and B at most, and the prefetched B tile still fits beside the
    pipeline the planner sized without it (else this launch runs without)."""
    if not (current_options().prefetch or cfg.swap_ab) or partial or r_chunks > 1:
        return False
    if lowrank == K_.LOWRANK_NONE and not has_bias:
        return False
    return _prefetch_fits(cfg, dtype_bits, lowrank)


@functools.lru_cache(maxsize=256)      # per plan, not per call: the ledger is ~20 µs of host time per launch
def _prefetch_fits(cfg: KernelConfig, dtype_bits: int, lowrank: int) -> bool:
    return smem_ledger(cfg, dtype_bits, _LEDGER_STRATEGY[lowrank], prefetch=True).fits()


# SMs of one wave for the FIXUP hybrid grid under the interpreter: None = the interpreter has no
# waves (every tile is split, as on the GPU below one wave); tests set it to exercise the hybrid
INTERPRETER_WAVE_SMS: int | None = None


def _wave_sms(device) -> int | None:
    return num_sms(device) if device.type == "cuda" else INTERPRETER_WAVE_SMS


# fp32 elements per thread of one row chunk of a FIXUP reduction (the running sum and the partial
# being loaded are each this size). ptxas -v on sm_90a, compiled as launched (stride-1 arguments
# specialized, aligned pointers): whole 128-row tiles (128 per thread: 128×128 over 4 warps,
# 128×256 / 256×128 over 8) took 215–255 registers; chunks of 64 per thread 164–208, no spills
FIXUP_MAX_PER_THREAD = 64


def fixup_meta(M: int, cfg: KernelConfig) -> dict:
    """EPI_M / EPI_CHUNKS / IN_FLIGHT of a FIXUP launch. The last arriver reduces and finishes the
    tile's rows in EPI_CHUNKS chunks of EPI_M rows: all BLOCK_M rows when M ≥ BLOCK_M, else only
    the first ≥ M (≥ 16, the smallest MMA M of the up-projection: one M-block whose rows ≥ M do
    not exist). A chunk is halved until one partial costs ≤ FIXUP_MAX_PER_THREAD registers per
    thread (decode tiles never are: one chunk, as before). Two partials in flight while one costs
    ≤ 32 fp32 registers per thread."""
    rows = cfg.block_m if M >= cfg.block_m else min(cfg.block_m, max(16, 1 << (M - 1).bit_length()))
    threads = 32 * cfg.num_warps
    epi_m = rows
    while epi_m > 16 and epi_m * cfg.block_n // threads > FIXUP_MAX_PER_THREAD:
        epi_m //= 2
    per_thread = epi_m * cfg.block_n // threads
    return {"EPI_M": epi_m, "EPI_CHUNKS": rows // epi_m, "IN_FLIGHT": 2 if per_thread <= 32 else 1}


# ---------------------------------------------------------------------------- split-K tickets

TICKET_SLOTS = 4096          # tiles per ticket region (small-M plans have ≤ a few hundred)
_REGIONS_PER_BLOCK = 16      # regions allocated at a time (one 256 KB buffer)


class _Tickets:
    """Zeroed int32 ticket regions for FIXUP launches, one per (device, stream), never shared.

    Every FIXUP launch leaves its tickets at zero, so a region is reused by every later launch on
    the same stream (and by every CUDA-graph replay: the graph holds the region's address) with
    no memset. Regions are carved from buffers of ``_REGIONS_PER_BLOCK`` allocated outside any
    capture, the next one as soon as the last free region is handed out; a stream first seen while
    capturing takes a free region without allocating, or, when none is left (more than one new
    stream in a capture), a fresh zeroed buffer of its own per call (a memset node in the graph).

    Launches on different streams may overlap in time, so no two streams share a region. (Until
    session 31 a 17th stream shared the first one's: torch's stream pool hands out 32 streams, and
    two overlapping launches on one region can leave its tickets off zero, after which that
    region's launches never see their last arrival.) Graphs captured on one stream share its region
    and must not be replayed concurrently with each other."""

    def __init__(self):
        self.blocks: dict = {}     # device → [int32 [_REGIONS_PER_BLOCK, TICKET_SLOTS] buffers]
        self.free: dict = {}       # device → regions not handed out yet
        self.regions: dict = {}    # (device, stream) → its region
        self.views: dict = {}      # (device, stream, tiles) → the region's first ``tiles`` slots (one view per plan)

    def get(self, device: torch.device, tiles: int) -> torch.Tensor:
        if tiles > TICKET_SLOTS:   # a pinned big-M plan: private zeroed tickets (a memset)
            return torch.zeros(tiles, dtype=torch.int32, device=device)
        stream = self._stream(device)
        view = self.views.get((device, stream, tiles))
        if view is not None:
            return view
        region = self.regions.get((device, stream))
        if region is None:
            free = self.free.setdefault(device, [])
            if not free:
                if _capturing(device):
                    return torch.zeros(tiles, dtype=torch.int32, device=device)
                self._add_block(device)
            region = self.regions[(device, stream)] = free.pop(0)
            if not free and not _capturing(device):    # keep a region free for a stream first seen in a capture
                self._add_block(device)
        view = self.views[(device, stream, tiles)] = region[:tiles]
        return view

    def _add_block(self, device: torch.device) -> None:
        block = persistent_zeros((_REGIONS_PER_BLOCK, TICKET_SLOTS), torch.int32, device)
        self.blocks.setdefault(device, []).append(block)
        self.free[device].extend(block.unbind(0))

    _stream = staticmethod(stream_key)     # an attribute, so a test can give an instance streams of its own

    def region(self, device: torch.device, stream: int = 0) -> torch.Tensor | None:
        """The whole region of (device, stream) (tests: it must be back at zero after launches)."""
        return self.regions.get((device, stream))

    def all_zero(self, device: torch.device) -> bool:
        """Whether every ticket of every region of ``device`` is zero (tests, probes)."""
        return not any(bool(block.any()) for block in self.blocks.get(device, []))


_TICKETS = _Tickets()


S_WORDS_SPARE = 1 << 18      # int64 words per device set aside outside any capture for pairs first needed inside one


class _SWords:
    """The word buffers and epoch counters of ``s_words`` launches (:data:`LoraOptions.s_words`), one pair per (device,
    stream, producers, M, rank, main tiles): words int64 [producers, M, rank] and counters int64 [2] (main tiles',
    producers'), both zero when made and never reset — each launch moves the counters on by (tiles, producers), and
    a word left by an earlier launch carries an older epoch. The tile count is part of the key because a main tile
    derives its epoch by dividing its counter value by it.

    A CUDA graph is usually captured on a stream no eager call has used, so its pairs are new there. Allocating them
    inside the capture would put two memsets in the graph per call (measured +1.6 µs per call at 4096², M = 1,
    probes/s30/s30_words); instead each device keeps a zeroed spare buffer, made outside any capture, and a pair
    first needed inside a capture is carved from it (the graph holds its address; replays count on from where the
    last one stopped, like eager calls). Only when the spare is used up does a capture fall back to a fresh pair
    per call (a memset node; each replay counts from zero again), and the next call outside a capture sets a new
    spare aside. Graphs and eager calls on one stream share its pairs, so they must not run concurrently (as with
    :class:`_Tickets`)."""

    def __init__(self):
        self.pairs: dict = {}
        self.spare: dict = {}      # device → [zeroed int64 buffer, words handed out]

    def _carve(self, device, n: int):
        """``n`` zeroed words from the device's spare (16-word aligned, as a fresh allocation would be), or None."""
        spare = self.spare.get(device)
        if spare is None:
            return None
        buf, used = spare
        if used + n > buf.numel():
            del self.spare[device]
            return None
        spare[1] = used + -(-n // 16) * 16
        return buf[used:used + n]

    def get(self, device: torch.device, producers: int, M: int, R: int, tiles: int):
        key = (device, stream_key(device), producers, M, R, tiles)
        pair = self.pairs.get(key)
        if pair is not None:
            return pair
        if not _capturing(device):
            if device not in self.spare:
                self.spare[device] = [persistent_zeros((S_WORDS_SPARE,), torch.int64, device), 0]
            pair = (persistent_zeros((producers, M, R), torch.int64, device),
                    persistent_zeros((2,), torch.int64, device))
        else:
            words, counters = self._carve(device, producers * M * R), self._carve(device, 2)
            if words is None or counters is None:
                return (torch.zeros(producers, M, R, dtype=torch.int64, device=device),
                        torch.zeros(2, dtype=torch.int64, device=device))
            pair = (words.view(producers, M, R), counters)
        self.pairs[key] = pair
        return pair


_S_WORDS = _SWords()


def _s_words_ok(cfg: KernelConfig, x: torch.Tensor, R: int, has_bias: bool, bank) -> bool:
    """Whether this S-producer launch hands S over as words: asked for (LoraOptions.s_words), ≤ 4 producers, and
    the epilogue holding the S rows — the prefetched epilogue (:func:`_prefetch_ok`, the same test the launch makes)
    or the stacked bank mode's one rank chunk."""
    if not current_options().s_words or not 1 <= cfg.s_producers <= 4:
        return False
    if bank is not None and bank.get("STACK_D", 0) > 0 and cdiv(R, cfg.block_r) == 1:
        return True
    return _prefetch_ok(cfg, x.element_size() * 8, K_.LOWRANK_GLOBAL, partial=False, has_bias=has_bias,
                        r_chunks=cdiv(R, cfg.block_r))


def _launch_reduce(ws, s, b, bias, y, M, N, R, s_scale, splits, s_splits, cfg, *, has_lora):
    """y = Σ ws[k] (+ s_scale·Σ s[k]·Bᵀ) (+ bias). ws [splits, M, ≥N] fp32, s [s_splits, M, ≥R]."""
    bm, bn = _reduce_tile(cfg)
    grid = (cdiv(M, bm), cdiv(N, bn))
    launch(K_.lora_reduce_kernel, grid,
        ws, s, b, y if bias is None else bias, y, M, N, R, s_scale, splits, s_splits,
        ws.stride(0), ws.stride(1), ws.stride(2), s.stride(0), s.stride(1), s.stride(2),
        b.stride(0), b.stride(1), y.stride(0), y.stride(1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_R=cfg.block_r, HAS_LORA=has_lora, HAS_BIAS=bias is not None,
        num_warps=4, num_stages=1)


def _empty_f32(device, *shape):
    return torch.empty(shape, dtype=torch.float32, device=device)


_DUMMIES: dict = {}


def _dummy(device) -> torch.Tensor:
    """A [1, 1, 1] fp32 placeholder for pointer arguments a launch never touches; cached (one
    allocation less per call), except while a CUDA graph is being captured (its pool is private)."""
    t = _DUMMIES.get(device)
    if t is None:
        if _capturing(device):
            return _empty_f32(device, 1, 1, 1)
        t = _DUMMIES[device] = persistent_zeros((1, 1, 1), torch.float32, device)
    return t


def _fixup_buffers(M, N, cfg, device):
    """(partials [split_k, M, N] fp32, tickets int32 [tiles]) of a FIXUP launch. The partials come
    from the caching allocator (every element read is first written by the same launch)."""
    tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
    return _empty_f32(device, cfg.split_k, M, N), _TICKETS.get(device, tiles)


def _gemm(x, w, bias, y, cfg, *, N, Kp, w_scale=None, x_scale=None):
    """Plain y = x·wᵀ (+ bias) with our kernel (rank 0), split-K through the reduce kernel. (M from y: fp8 x in two
    terms has 2M rows.)"""
    M, dev = y.shape[0], x.device
    dummy = _dummy(dev)
    if cfg.split_k == 1:
        _launch_main(x, w, None, y, dummy, bias, y, dummy, M, N, Kp, 0, 1.0, cfg,
                     lowrank=K_.LOWRANK_NONE, partial=False, w_scale=w_scale, x_scale=x_scale)
        return y
    if cfg.split_mode == "fixup":
        _launch_main(x, w, None, y, dummy, bias, y, dummy, M, N, Kp, 0, 1.0, cfg,
                     lowrank=K_.LOWRANK_NONE, partial=False, fixup=_fixup_buffers(M, N, cfg, dev), w_scale=w_scale,
                     x_scale=x_scale)
        return y
    ws = _empty_f32(dev, cfg.split_k, M, N)
    _launch_main(x, w, None, y, dummy, bias, ws, dummy, M, N, Kp, 0, 1.0, cfg,
                 lowrank=K_.LOWRANK_NONE, partial=True, w_scale=w_scale, x_scale=x_scale)
    _launch_reduce(ws, dummy, y, bias, y, M, N, 0, 1.0, cfg.split_k, 1, cfg, has_lora=False)
    return y


def _run_kloop(x, w, a, b, bias, y, scale, cfg, *, N, Kp, R, bank=None, w_scale=None):
    M, dev = x.shape[0], x.device
    dummy = _dummy(dev)
    if cfg.split_k == 1:
        _launch_main(x, w, a, b, dummy, bias, y, dummy, M, N, Kp, R, scale, cfg,
                     lowrank=K_.LOWRANK_KLOOP, partial=False, bank=bank, w_scale=w_scale)
        return y
    if cfg.split_mode == "fixup":
        sws = _empty_f32(dev, cfg.split_k, cdiv(N, cfg.block_n), M, cfg.block_r)
        _launch_main(x, w, a, b, dummy, bias, y, sws, M, N, Kp, R, scale, cfg,
                     lowrank=K_.LOWRANK_KLOOP, partial=False, fixup=_fixup_buffers(M, N, cfg, dev), bank=bank,
                     w_scale=w_scale)
        return y
    ws = _empty_f32(dev, cfg.split_k, M, N)
    sws = _empty_f32(dev, cfg.split_k, M, cfg.block_r)
    _launch_main(x, w, a, b, dummy, bias, ws, sws, M, N, Kp, R, scale, cfg,
                 lowrank=K_.LOWRANK_KLOOP, partial=True, w_scale=w_scale)
    _launch_reduce(ws, sws, b, bias, y, M, N, R, scale, cfg.split_k, cfg.split_k, cfg, has_lora=True)
    return y


# down-projection tile: M 64 (smallest wgmma M), deep K steps; it is a thin [M, K]·[K, r]
# product, so what matters is enough CTAs in flight, not the tile shape of the main GEMM
_DOWN_BM, _DOWN_BK, _DOWN_STAGES, _DOWN_MAX_SPLITS = 64, 128, 4, 4


def down_splits(M: int, R: int, Kp: int, block_r: int, sms: int) -> int:
    """K slices of the down projection: double while the grid stays within the SMs and every
    slice keeps ≥ 4 K steps; ≤ 4 because every main tile's epilogue sums the slices."""
    ctas = cdiv(M, _DOWN_BM) * cdiv(R, block_r)
    k_tiles = cdiv(Kp, _DOWN_BK)
    split = 1
    while (ctas * split * 2 <= sms and k_tiles // (split * 2) >= 4
           and split * 2 <= _DOWN_MAX_SPLITS):
        split *= 2
    return split


def down_block_r(R: int, cfg: KernelConfig, opts: LoraOptions) -> int:
    """Ranks per down-kernel program: the main epilogue's chunk (``cfg.block_r``), or with
    ``down_full_rank`` all of them (≤ 128) so X is read once."""
    return block_r_for(R) if opts.down_full_rank else cfg.block_r


def _launch_down(x, a, s, scale, block_r, *, Kp, R, pdl=False, bank=None):
    """s [S_SPLITS, M, R] fp32: K-slice partials of scale · x·aᵀ (S_SPLITS = s.shape[0]). ``bank``: the
    BANK arguments the down kernel shares with the main kernel's (:func:`run_bank`)."""
    M = x.shape[0]
    bm, bk = (_DOWN_BM, _DOWN_BK) if not _interpreting() else (32, 32)
    grid = (cdiv(M, bm), cdiv(R, block_r), s.shape[0])
    launch(K_.lora_down_kernel, grid, _desc(x, bm, bk), _desc(a, block_r, bk), s,
           M, Kp, R, scale, s.stride(0), s.stride(1), s.stride(2),
           BLOCK_M=bm, BLOCK_R=block_r, BLOCK_K=bk, PDL=pdl,
           **({k: bank[k] for k in _DOWN_BANK_ARGS + (_DOWN_STACK_ARGS if bank.get("STACK_D") else ())}
              if bank is not None else {}),
           num_warps=4, num_stages=_DOWN_STAGES)


_DOWN_BANK_ARGS = ("ids_ptr", "ranks_ptr", "scales_ptr", "L", "R_MAX", "BANK", "ID_BLOCK", "B_CLEAN")
_DOWN_STACK_ARGS = ("bank_a_ptr", "stride_al", "stride_ar", "STACK_D", "STACK_R")


# PDL between split's down and main kernels only up to this M. H200 (NOTES.md session 5): M=256 4096² 28.5 → 25.8 µs,
# M=1024 −1.3 µs; at M=4096 the early main CTAs compete with a long down kernel (X is 32 MB): 4096² r8 221.6 →
# 236.9, r16 213.5 → 218.2.
SPLIT_PDL_MAX_M = 1024


def _run_split(x, w, a, b, bias, y, scale, cfg, *, N, Kp, R, bank=None, w_scale=None, x_fp8=None):
    """``x_fp8`` = (x in e4m3, its per-token scale): the main product's X; S still comes from the 16-bit ``x``, by the
    down kernel (not by in-grid producers, which read the main kernel's X)."""
    M, dev = x.shape[0], x.device
    xm, xs = x_fp8 if x_fp8 is not None else (x, None)
    if x_fp8 is not None and cfg.s_producers:
        cfg = cfg.replace(s_producers=0)
    if cfg.s_producers and _s_words_ok(cfg, x, R, bias is not None, bank):
        tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
        words, counters = _S_WORDS.get(dev, cfg.s_producers, M, R, tiles)
        _launch_main(x, w, a, b, words, bias, y, _dummy(dev), M, N, Kp, R, scale, cfg, lowrank=K_.LOWRANK_GLOBAL,
                     partial=False, producers=counters, bank=bank, s_words=True, w_scale=w_scale)
        return y
    if cfg.s_producers:       # one launch: S's K slices come from the head of the main grid
        s = _empty_f32(dev, cfg.s_producers, M, R)
        _launch_main(x, w, a, b, s, bias, y, _dummy(dev), M, N, Kp, R, scale, cfg, lowrank=K_.LOWRANK_GLOBAL,
                     partial=False, producers=_TICKETS.get(dev, 2), bank=bank, w_scale=w_scale)
        return y
    opts = current_options()
    pdl = opts.pdl and pdl_supported(dev) and M <= SPLIT_PDL_MAX_M
    dbr = down_block_r(R, cfg, opts)
    splits = down_splits(M, R, Kp, dbr, num_sms(dev)) if not _interpreting() else 2
    s = _empty_f32(dev, splits, M, R)
    _launch_down(x, a, s, scale, dbr, Kp=Kp, R=R, pdl=pdl, bank=bank)
    dummy = _dummy(dev)
    if cfg.split_k == 1 or cfg.split_mode == "fixup":
        fixup = _fixup_buffers(M, N, cfg, dev) if cfg.split_k > 1 else None
        _launch_main(xm, w, None, b, s, bias, y, dummy, M, N, Kp, R, 1.0, cfg,
                     lowrank=K_.LOWRANK_GLOBAL, partial=False, fixup=fixup, pdl=pdl, bank=bank, w_scale=w_scale,
                     x_scale=xs)
        return y
    ws = _empty_f32(dev, cfg.split_k, M, N)
    _launch_main(xm, w, None, b, s, bias, ws, dummy, M, N, Kp, R, 1.0, cfg,
                 lowrank=K_.LOWRANK_NONE, partial=True, pdl=pdl, w_scale=w_scale, x_scale=xs)
    _launch_reduce(ws, s, b, bias, y, M, N, R, 1.0, cfg.split_k, s.shape[0], cfg, has_lora=True)
    return y


def _run_concat(x, w, a, b, bias, y, scale, cfg, *, N, Kp, R):
    """[Y | S] = x·[W; A]ᵀ into an fp32 workspace (split-K partials), then the epilogue kernel."""
    M, dev = x.shape[0], x.device
    wcat = _WEIGHT_CACHE.get("concat", (w, a), (), lambda: torch.cat([w, a], 0).contiguous())
    ws = _empty_f32(dev, cfg.split_k, M, N + R)
    dummy = _dummy(dev)
    _launch_main(x, wcat, None, b, dummy, bias, ws, dummy, M, N + R, Kp, 0, 1.0, cfg,
                 lowrank=K_.LOWRANK_NONE, partial=True)
    _launch_reduce(ws, ws[:, :, N:], b, bias, y, M, N, R, scale, cfg.split_k, cfg.split_k, cfg,
                   has_lora=True)
    return y


def _static_grid(num_pid_m: int, num_pid_n: int, group_m: int, device) -> int:
    """Persistent grid; under the interpreter programs run one after another, so a program must
    never wait on an S task owned by a later program — widen the grid until none does."""
    grid = persistent_grid(num_pid_m + num_pid_m * num_pid_n, device)
    if not _interpreting():
        return grid
    total = num_pid_m + num_pid_m * num_pid_n
    for task in range(num_pid_m, total):
        pm, _ = grouped_tile_host(task - num_pid_m, num_pid_m, num_pid_n, group_m)
        if pm % grid > task % grid:
            return total
    return grid


# Debug knob (scripts/probe_flat_trace.py): an int64 CUDA tensor [≥ programs, K_.TRACE_SLOTS] here makes _run_flat and
# _run_persistent launch their kernels with TRACE on (per-program timestamps, K_.TRACE_NAMES); None: off
KERNEL_TRACE: torch.Tensor | None = None


def _trace_arg(dev: torch.device, grid: int) -> torch.Tensor | None:
    """:data:`KERNEL_TRACE` checked for a launch of ``grid`` programs on ``dev`` (None when off)."""
    trace = KERNEL_TRACE
    if trace is not None and (_interpreting() or trace.dtype != torch.int64 or trace.device != dev
                              or trace.dim() != 2 or trace.shape[0] < grid
                              or trace.shape[1] != K_.TRACE_SLOTS or not trace.is_contiguous()):
        raise ValueError(f"KERNEL_TRACE: a contiguous int64 tensor on {dev} of [≥ {grid}, {K_.TRACE_SLOTS}], "
                         f"not under the interpreter, got {trace.dtype} {tuple(trace.shape)} on {trace.device}")
    return trace


def _run_persistent(x, w, a, b, bias, y, scale, cfg, *, N, Kp, R, dynamic, bank=None, w_scale=None):
    M, dev, c = x.shape[0], x.device, cfg
    num_pid_m, num_pid_n = cdiv(M, c.block_m), cdiv(N, c.block_n)
    s = _empty_f32(dev, M, R)
    sync = _TICKETS.get(dev, 2 * num_pid_m + 1)     # zeroed once per stream, left zero by the kernel
    grid = (persistent_grid(num_pid_m * (num_pid_n + 1), dev) if dynamic
            else _static_grid(num_pid_m, num_pid_n, c.group_m, dev),)
    y_desc, y_pieces = (None, 1) if bank else _y_desc(y, c, "persistent_dynamic" if dynamic else "persistent_static")
    trace = _trace_arg(dev, grid[0])
    launch(K_.lora_persistent_kernel, grid,
        _desc(x, c.block_m, c.block_k), _desc(w, c.block_n, c.block_k), _desc(a, c.block_r, c.block_k),
        s, sync, b, y if bias is None else bias, y, M, N, Kp, R, scale,
        s.stride(0), s.stride(1), b.stride(0), b.stride(1), y.stride(0), y.stride(1),
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, BLOCK_R=c.block_r,
        GROUP_M=c.group_m, DYNAMIC=dynamic, HAS_BIAS=bias is not None, EPI_STAGES=c.epi_stages or None,
        **(bank or {}), **({"wscale_ptr": w_scale} if w_scale is not None else {}),
        y_desc=y_desc, Y_TMA=y_desc is not None, Y_PIECES=y_pieces, TRACE=trace is not None, trace_ptr=trace,
        num_warps=c.num_warps, num_stages=c.num_stages)
    return y


def flat_s_stages(cfg) -> int:
    """Pipeline depth of the flat kernel's S tasks: as many X / A stages as fit in the main loop's X / W stages (the
    two loops never run at once, so Triton lays their buffers over each other: no shared memory added), at most 8.
    The tasks stream 128 rows of X for a rank-sized MMA, so their steps are load-bound: at r64 on the main loop's 3
    stages a block cost ~0.65 of a tile (s51a) where its bytes are 0.5 of one."""
    return max(cfg.num_stages, min(8, cfg.num_stages * (cfg.block_m + cfg.block_n) // (cfg.block_m + cfg.block_r)))


# Session 52 candidate (measured level or behind, sessions 52–53: off): Y stored by TMA in Y_PIECES column pieces
# (`epilogue.store_y`) by the kernels of these strategies ("flat", "persistent_static", "persistent_dynamic"). The
# planner's ledger reads them (y_store_pieces): after changing either, drop memoized plans (planner.clear_plan_cache)
Y_TMA_STRATEGIES: frozenset[str] = frozenset()
Y_PIECES = 4


def y_store_pieces(strategy: str, cfg, y_bytes: int = 2) -> int:
    """The column pieces a ``strategy`` kernel stores a TMA-legal Y in (0: pointer stores): :data:`Y_PIECES`, fewer
    where a piece would be under 16 bytes wide. The planner's ledger counts the staging piece from it."""
    if strategy not in Y_TMA_STRATEGIES:
        return 0
    return max(1, min(Y_PIECES, cfg.block_n * y_bytes // 16))


def _y_desc(y: torch.Tensor, cfg, strategy: str) -> tuple[TensorDescriptor | None, int]:
    """(Y's descriptor, its column pieces) where a kernel stores Y by TMA — :func:`y_store_pieces` and a TMA-legal Y
    (unit column stride, 16-byte rows and base) — else (None, 1). The box is [BM, BN / pieces]."""
    pieces = y_store_pieces(strategy, cfg, y.element_size())
    if not pieces or y.stride(1) != 1 or (y.stride(0) * y.element_size()) % 16 or y.data_ptr() % 16:
        return None, 1
    return TensorDescriptor.from_tensor(y, [cfg.block_m, cfg.block_n // pieces]), pieces


def _run_flat(x, w, a, b, bias, y, scale, cfg, *, N, Kp, R):
    """``lora_flat_kernel`` with its S tasks in the grid (``LoraStrategy.FLAT``): one launch, a persistent grid (one
    program under the interpreter, which runs programs one after another: a program must never wait on a later one).
    S tasks placed by :func:`flat_s_tasks`, K-sliced partials in a scratch buffer summed in slice order."""
    M, dev, c = x.shape[0], x.device, cfg
    s = _empty_f32(dev, 1, M, R)
    b = b if b.is_contiguous() else b.contiguous()
    num_pid_m = cdiv(M, c.block_m)
    tiles = num_pid_m * cdiv(N, c.block_n)
    grid = 1 if _interpreting() else flat_programs(tiles, num_pid_m, num_sms(dev))
    slices, s_programs = flat_s_tasks(num_pid_m, tiles, grid, cdiv(Kp, c.block_k))
    ws = _empty_f32(dev, slices, M, R) if slices > 1 else s
    y_desc, y_pieces = _y_desc(y, c, "flat")
    trace = _trace_arg(dev, grid)
    launch(K_.lora_flat_kernel, (grid,),
           _desc(x, c.block_m, c.block_k), _desc(w, c.block_n, c.block_k), _desc(a, c.block_r, c.block_k), s,
           _TICKETS.get(dev, 2 + num_pid_m), b, y if bias is None else bias, y,
           TensorDescriptor.from_tensor(s, [1, c.block_m, c.block_r]), _desc(b, c.block_n, c.block_r),
           M, N, Kp, R, scale, s.stride(1), s.stride(2), b.stride(0), b.stride(1), y.stride(0), y.stride(1),
           BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, BLOCK_R=c.block_r, GROUP_M=c.group_m,
           LOWRANK=True, HAS_BIAS=bias is not None, FLATTEN=True, LORA_TMA=True, IN_GRID=True,
           PROXY_FENCE=not _interpreting(), ws_ptr=ws, stride_wk=ws.stride(0), s_slices=slices,
           s_programs=s_programs, S_STAGES=flat_s_stages(c), y_desc=y_desc, Y_TMA=y_desc is not None,
           Y_PIECES=y_pieces, TRACE=trace is not None, trace_ptr=trace, num_warps=c.num_warps,
           num_stages=c.num_stages)
    return y


def streamk_grid(num_tiles: int, k_tiles: int, device) -> int:
    """Stream-K programs: one per SM, never more than work units (tiles × K steps)."""
    return max(1, min(num_tiles * k_tiles, num_sms(device)))


def streamk_segments(num_tiles: int, k_tiles: int, grid: int) -> list[list[tuple[int, int, int]]]:
    """Host mirror of the kernel's split, for tests and for reading a plan: per tile, the
    segments ``(program, k_lo, k_hi)`` in segment (= K) order."""
    total = num_tiles * k_tiles
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(num_tiles)]
    for p in range(grid):
        u, hi = p * total // grid, (p + 1) * total // grid
        while u < hi:
            t, k_lo = divmod(u, k_tiles)
            k_hi = min(k_tiles, k_lo + hi - u)
            out[t].append((p, k_lo, k_hi))
            u += k_hi - k_lo
    return out


def _run_streamk(x, w, a, b, bias, y, scale, cfg, *, N, Kp, R, w_scale=None):
    M, dev, c = x.shape[0], x.device, cfg
    tiles = cdiv(M, c.block_m) * cdiv(N, c.block_n)
    grid = streamk_grid(tiles, cdiv(Kp, c.block_k), dev)
    ws = _empty_f32(dev, 2 * grid, c.block_m, c.block_n)
    sws = _empty_f32(dev, 2 * grid, c.block_m, c.block_r)
    cnt = _TICKETS.get(dev, tiles)      # zeroed once per stream, left zero by the kernel
    launch(K_.lora_streamk_kernel, (grid,),
        _desc(x, c.block_m, c.block_k), _desc(w, c.block_n, c.block_k), _desc(a, c.block_r, c.block_k),
        b, y if bias is None else bias, y, ws, sws, cnt, M, N, Kp, R, scale,
        b.stride(0), b.stride(1), y.stride(0), y.stride(1),
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, BLOCK_R=c.block_r,
        GROUP_M=c.group_m, HAS_BIAS=bias is not None, **({"wscale_ptr": w_scale} if w_scale is not None else {}),
        num_warps=c.num_warps, num_stages=c.num_stages)
    return y


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    idx = device_index(device)
    if idx not in _SIDE_STREAMS:
        _SIDE_STREAMS[idx] = torch.cuda.Stream(device=idx)
    return _SIDE_STREAMS[idx]


def _run_streams(x, w, a, b, bias, y, scale, cfg, *, N, Kp, R, w_scale=None, x_fp8=None):
    """Base GEMM on the current stream ‖ S = x·Aᵀ on a side stream; join; y += scale·S·Bᵀ.

    S is allocated on the current stream before the fork, and the current stream waits on the
    side stream before touching it, so the caching allocator and CUDA-graph capture both see a
    proper fork/join (no record_stream needed)."""
    s = torch.empty(x.shape[0], R, dtype=x.dtype, device=x.device)
    xm, xs = x_fp8 if x_fp8 is not None else (x, None)       # fp8 activations: the main product's X; S from x
    if x.is_cuda:
        cur, side = torch.cuda.current_stream(x.device), _side_stream(x.device)
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            torch.mm(x, a.t(), out=s)
        _gemm(xm, w, bias, y, cfg, N=N, Kp=Kp, w_scale=w_scale, x_scale=xs)
        cur.wait_stream(side)
    else:
        torch.mm(x, a.t(), out=s)
        _gemm(xm, w, bias, y, cfg, N=N, Kp=Kp, w_scale=w_scale, x_scale=xs)
    return y.addmm_(s, b.t(), alpha=scale)


def _run_merged(x, w, a, b, bias, y, scale, cfg, *, N, Kp, R):
    def build():
        return (w.float() + scale * (b.float() @ a.float())).to(w.dtype).contiguous()
    wm = _WEIGHT_CACHE.get("merged", (w, a, b), (float(scale),), build)
    return _gemm(x, wm, bias, y, cfg, N=N, Kp=Kp)


def _run_kcat(x, w, a, b, bias, y, scale, cfg, *, N, Kp, R):
    """[x | scale·x·Aᵀ] (one concat kernel) · [W | B]ᵀ (one cuBLAS GEMM). The plan's config is not used: the concat
    kernel plans itself (:func:`.lora_kcat.xcat_plan`) and cuBLAS picks its own tiles."""
    from .lora_kcat import build_xcat, kcat_gemm, kcat_weight, packed_wcat, r_padded
    rp = r_padded(R)
    wcat = packed_wcat(w, b)        # w, x and A arrive padded to Kp columns (run_strategy), so shapes agree
    if wcat is None:
        wcat = _WEIGHT_CACHE.get("kcat", (w, b), (), lambda: kcat_weight(w, b, rp))
    return kcat_gemm(build_xcat(x, a, scale, rp), wcat, bias, y)


def _run_unfused(x2, w, a, b, bias, y, scale):
    """x·Wᵀ (+ bias) into y, then y += scale·(x·Aᵀ)·Bᵀ: three library GEMMs in the input dtype (S rounded to it)."""
    if bias is not None:
        torch.addmm(bias, x2, w.t(), out=y)
    else:
        torch.mm(x2, w.t(), out=y)
    if a.shape[0]:
        y.addmm_(x2 @ a.t(), b.t(), alpha=scale)
    return y


_RUNNERS = {
    "kloop": _run_kloop, "split": _run_split, "concat": _run_concat, "streams": _run_streams,
    "merged": _run_merged, "streamk": _run_streamk, "kcat": _run_kcat, "flat": _run_flat,
    "persistent_static": lambda *a, **k: _run_persistent(*a, **k, dynamic=False),
    "persistent_dynamic": lambda *a, **k: _run_persistent(*a, **k, dynamic=True),
}


def run_strategy(strategy: str, x2, weight, lora_a, lora_b, scale, bias, cfg: KernelConfig,
                 out: torch.Tensor | None = None, weight_scale: torch.Tensor | None = None,
                 x_fp8: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Launch one strategy on 2-D x2 [M, K] (M > 0) → y [M, N] (written into ``out`` if given,
    e.g. a NaN-poisoned buffer in tests). No validation, no planning. ``weight_scale`` (an fp8 weight's scale,
    [N] or one value): only the :data:`WEIGHT_SCALE_STRATEGIES`. ``x_fp8`` = (x2 in e4m3, its per-token fp32
    scale [M], :func:`fp8_rows`): the main product runs fp8 × fp8 (the :data:`FP8_ACT_STRATEGIES`); S uses x2."""
    M, K = x2.shape
    N, R = weight.shape[0], lora_a.shape[0]
    y = torch.empty(M, N, dtype=x2.dtype, device=x2.device) if out is None else out
    if strategy == "unfused":
        if weight_scale is not None or x_fp8 is not None:
            raise ValueError("strategy 'unfused' runs the 16-bit library GEMMs: no weight_scale or fp8 activations")
        return _run_unfused(x2, weight, lora_a, lora_b, bias, y, float(scale))
    Kp = _k_padded(K, min(x2.element_size(), weight.element_size()))    # fp8 W: 16 of its 1-byte elements
    x2, w = tma_operand(x2, Kp), tma_operand(weight, Kp)
    bias_arg = bias.contiguous() if bias is not None else None
    extra = {}
    if weight_scale is not None:
        if R and strategy not in WEIGHT_SCALE_STRATEGIES:
            raise ValueError(f"strategy {strategy!r} takes no weight_scale (one of {WEIGHT_SCALE_STRATEGIES} does)")
        extra["w_scale"] = column_scale(weight_scale, N)
    if x_fp8 is not None:
        if weight_scale is None or (R and strategy not in FP8_ACT_STRATEGIES):
            raise ValueError(f"fp8 activations need an fp8 weight with weight_scale and one of {FP8_ACT_STRATEGIES}, "
                             f"got strategy {strategy!r}")
        x8, xs = x_fp8
        if x8.shape[0] not in (M, 2 * M) or xs.numel() != M:
            raise ValueError(f"x_fp8: codes of M = {M} rows, or 2M (two terms on one scale per token), and M scales, "
                             f"got {tuple(x8.shape)} and {xs.numel()} scales")
        x_fp8 = (tma_operand(x8, Kp), xs.to(torch.float32).contiguous())
    if R == 0:  # documented: rank 0 is the plain GEMM
        if x_fp8 is not None:
            return _gemm(x_fp8[0], w, bias_arg, y, cfg, N=N, Kp=Kp, x_scale=x_fp8[1], **extra)
        return _gemm(x2, w, bias_arg, y, cfg, N=N, Kp=Kp, **extra)
    if x_fp8 is not None:
        extra["x_fp8"] = x_fp8
    a = tma_operand(lora_a, Kp)
    return _RUNNERS[strategy](x2, w, a, lora_b, bias_arg, y, float(scale), cfg, N=N, Kp=Kp, R=R, **extra)


# bank mode (one adapter of a bank, device-side pick): every program reads all M ids, so M is kept to one block of
# them; up to the M the persistent plans serve (64 < M ≤ 256)
BANK_MAX_M = 256
BANK_STRATEGIES = ("split", "kloop", "persistent_static", "persistent_dynamic")


def bank_plan(M: int, N: int, K: int, r_max: int, dtype, device) -> tuple[str, KernelConfig] | None:
    """The single-adapter plan a one-adapter multi-LoRA batch runs in bank mode (:func:`run_bank`), or None where
    bank mode does not apply: M > BANK_MAX_M, K rows not 16-B aligned (no padded copy of a bank), or a plan outside
    :data:`BANK_STRATEGIES` or on the two-launch reduce split-K (its reduce kernel has no bank mode)."""
    if not 0 < M <= BANK_MAX_M or (K * dtype.itemsize) % TMA_ALIGN:
        return None
    strategy, cfg = plan_lora(M, N, K, r_max, dtype, device)
    if strategy not in BANK_STRATEGIES or (cfg.split_k > 1 and cfg.split_mode != "fixup"):
        return None
    return strategy, cfg


def run_bank(strategy: str, cfg: KernelConfig, x2, weight, bank_a, bank_b, ranks, scales, adapter_ids, bias=None,
             out: torch.Tensor | None = None, has_lora: bool = True, b_clean: bool = False,
             stack_d: int = 0) -> torch.Tensor:
    """y [M, N] of a multi-LoRA batch through a single-adapter strategy (:data:`BANK_STRATEGIES`) in bank mode:
    bank_a [L, R_MAX, K] (K contiguous), bank_b [L, N, R_MAX], ranks [L] int32, scales [L] fp32, adapter_ids [M]
    int32 (−1 = base only). The kernels serve the batch's largest valid id with the single-adapter data path;
    rows of any other adapter are still exact, through a slow path (``adapter_rows``). No validation, no
    planning: :func:`bank_plan` chose ``strategy`` / ``cfg``. ``has_lora=False``: the same launches with no id
    valid (``L`` = 0), i.e. the same kernels' base product, which rows with id −1 of a full call equal bit for bit.
    ``b_clean``: bank_b is zero past each slot's rank (``AdapterBank``), so loads keep the launch's R_MAX masks
    (vector loads); without it the picked rank masks them (a bank may hold anything past a rank, NaN included).
    ``stack_d`` > 0 (:func:`stack_plan`): stacked bank mode, the batch's ``stack_d`` largest valid ids served as one
    rank of stack_d·R_MAX (``kloop`` / ``split`` plans of whole tiles); rows of smaller ids take the slow path."""
    M, K = x2.shape
    N = weight.shape[0]
    L, r_max = bank_a.shape[0], bank_a.shape[1]
    y = torch.empty(M, N, dtype=x2.dtype, device=x2.device) if out is None else out
    x2, w = tma_operand(x2, K), tma_operand(weight, K)
    bias_arg = bias.contiguous() if bias is not None else None
    a2 = bank_a.view(L * r_max, K)
    bank = dict(ids_ptr=adapter_ids, ranks_ptr=ranks, scales_ptr=scales, x_ptr=x2, bank_a_ptr=bank_a,
                L=L if has_lora else 0,
                R_MAX=r_max, stride_xm=x2.stride(0), stride_al=bank_a.stride(0), stride_ar=bank_a.stride(1),
                stride_bl=bank_b.stride(0), BANK=True, ID_BLOCK=max(16, next_pow2(M)), B_CLEAN=b_clean)
    if stack_d:
        wide = strategy == "split" and not cfg.s_producers     # the rank in chunks of block_r (_stacked_chunks)
        if strategy not in STACK_STRATEGIES or cfg.split_k != 1 or (stack_d * r_max > cfg.block_r and not wide):
            raise ValueError(f"stacked bank mode runs {STACK_STRATEGIES} plans of whole tiles with block_r ≥ "
                             f"stack_d·r_max = {stack_d * r_max} (split without S producers: any block_r); "
                             f"got {strategy} {cfg}")
        bank.update(STACK_D=stack_d, STACK_R=r_max, B_VEC=_stack_b_vec(bank_b))
        return _RUNNERS[strategy](x2, w, a2, bank_b[0], bias_arg, y, 1.0, cfg, N=N, Kp=K, R=stack_d * r_max, bank=bank)
    return _RUNNERS[strategy](x2, w, a2, bank_b[0], bias_arg, y, 1.0, cfg, N=N, Kp=K, R=r_max, bank=bank)


# stacked bank mode (a few adapters, device-side pick of the batch's D largest ids): D·R_MAX ≤ STACK_MAX_RANK, the
# rank the single-adapter plans were measured at; M ≤ STACK_MAX_M (every program reads all ids; the bank plans of
# larger M are persistent or split-K)
STACK_STRATEGIES = ("split", "kloop")
STACK_MAX_RANK = 64
STACK_MAX_M = 64
# above STACK_MAX_RANK (opt-in, LOWRANK_GEMM_ML_STACK_WIDE=1; measured slower, see _stack_wide_plan): up to 16
# adapters, a stacked rank of ≤ STACK_WIDE_MAX_RANK on the rank-64 plan turned split, its epilogue in rank chunks
STACK_WIDE_MAX_RANK = 256
STACK_WIDE_MAX_D = 16


def _stack_b_vec(bank_b: torch.Tensor) -> bool:
    """The stacked B gather may use 16-B vectors (:func:`~.adapter_rows.stacked_b`): unit rank stride, slots and rows
    a multiple of 8 elements apart, R_MAX a power of two ≥ 8."""
    r_max = bank_b.shape[2]
    return (bank_b.stride(2) == 1 and bank_b.stride(0) % 8 == 0 and bank_b.stride(1) % 8 == 0
            and r_max >= 8 and r_max & (r_max - 1) == 0 and bank_b.data_ptr() % 16 == 0)


def stack_plan(M: int, N: int, K: int, r_max: int, adapters: int, dtype, device
               ) -> tuple[str, KernelConfig, int] | None:
    """(strategy, config, D) of stacked bank mode for a batch the caller bounds to ``adapters`` ≥ 2 distinct ids, or
    None: D = adapters rounded up to a power of two, D·r_max ≤ STACK_MAX_RANK with r_max a power of two ≥ 16 (each
    adapter a whole run of the stacked rank), M ≤ STACK_MAX_M, and the single-adapter plan of rank D·r_max a
    :data:`STACK_STRATEGIES` plan of whole tiles whose block_r holds the stacked rank. A kloop plan whose N tile is
    narrower than the stacked rank runs as split (:func:`_stack_split_config`)."""
    if adapters < 2 or not 0 < M <= STACK_MAX_M or r_max < 16 or r_max & (r_max - 1):
        return None
    d = next_pow2(adapters)
    if d * r_max > STACK_MAX_RANK:
        return _stack_wide_plan(M, N, K, r_max, d, dtype, device)
    one = bank_plan(M, N, K, d * r_max, dtype, device)
    if one is None:
        return None
    strategy, cfg = one
    if strategy not in STACK_STRATEGIES or cfg.split_k != 1 or cfg.block_r < d * r_max:
        return None
    if strategy == "kloop" and not cfg.swap_ab and cfg.block_n < d * r_max:
        strategy, cfg = "split", _stack_split_config(cfg, K, dtype)
    return strategy, cfg, d


def _stack_wide_plan(M, N, K, r_max, d, dtype, device):
    """A stacked rank above STACK_MAX_RANK (opt-in: ``LOWRANK_GEMM_ML_STACK_WIDE=1``; off: measured slower than the
    multi plan in every cell, H200 M = 16, graph µs: N = 4096 16 × r16 21.6 vs 18.6, N = 28672 16 × r16 75.4 vs 67.1,
    N = 4096 4 × r64 22.3 vs 17.3 — NOTES.md session 23): the table's rank-STACK_MAX_RANK plan as split (kloop turned
    split on its output tile, S producers dropped: they hold one rank chunk), whose down kernel writes the whole
    stacked S and whose epilogue walks it in block_r chunks."""
    if not env_on("LOWRANK_GEMM_ML_STACK_WIDE", default=False) or d > STACK_WIDE_MAX_D \
            or d * r_max > STACK_WIDE_MAX_RANK:
        return None
    one = bank_plan(M, N, K, STACK_MAX_RANK, dtype, device)
    if one is None or one[1].split_k != 1 or one[0] not in STACK_STRATEGIES:
        return None
    strategy, cfg = one
    if strategy == "kloop":
        cfg = _stack_split_config(cfg, K, dtype)
    return "split", cfg.replace(s_producers=0), d


# H200, session 22 (probes/s22/call5): N = K = 4096, M = 64, four r16 adapters — the table's rank-64 kloop plan
# (64×32×128, 5 stages) 19.3 µs, split 64×32×256 with 4 stages 17.8 (cuBLAS 13.2). Every kloop program gathers the
# whole stacked A tile (64 rows, twice its 32-row W tile) by cp.async each K step; split's down kernel gathers it
# once per row block.
STACK_SPLIT_BLOCK_K = 256


def _stack_split_config(cfg: KernelConfig, K: int, dtype) -> KernelConfig:
    """The split plan stacked bank mode runs where the kloop plan's N tile is narrower than the stacked rank: the same
    output tile, STACK_SPLIT_BLOCK_K-wide K steps (narrower when K is), the deepest pipeline the SMEM ledger fits."""
    from ..plan.planner import lora_ledger, stages_for
    base = cfg.replace(block_k=min(STACK_SPLIT_BLOCK_K, max(cfg.block_k, next_pow2(K))), num_stages=2)
    bits = dtype.itemsize * 8
    return base.replace(num_stages=stages_for(lambda st: lora_ledger("split", base.replace(num_stages=st), bits)))


def lora_linear_impl(x, weight, lora_a, lora_b, scale: float = 1.0, bias=None,
                     strategy: str = "auto", weight_scale=None, fp8_activations: bool | int = False) -> torch.Tensor:
    """The op body (no custom-op dispatch): validate, plan, launch. Shapes as :func:`lora_linear`."""
    check_inputs(x, weight, lora_a, lora_b, bias, strategy, weight_scale, fp8_activations)
    N, K = weight.shape
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if M == 0:
        return x.new_empty(*x.shape[:-1], N)
    if strategy == "torch" or not _use_triton(x):
        return _lora_linear_torch(x, weight, lora_a, lora_b, scale, bias, weight_scale, fp8_activations)
    pin = current_pin()
    scaled = weight_scale is not None
    # a user's own tuned entry (plan_lora reads it first) is taken as measured: no v2 table, no kcat preference
    free = strategy == "auto" and pin is None and x.is_cuda and not scaled
    if free and user_plan(M, N, K, lora_a.shape[0], x.dtype, x.device) is not None:
        free = False
    if free:
        entry = _v2_entry(M, N, K, lora_a.shape[0], x.device)
        if entry is not None:
            from .gluon.lora_ws import launch_lora_v2
            return launch_lora_v2(x, weight, lora_a, lora_b, scale, bias, shrink=entry["shrink"],
                                  config=entry.get("config"))
    # kcat needs [W | B] as a free view, a property of the tensors and not of the shape: decided here, not in plan_lora
    planned = None
    if free and kcat_shape(M, N, K, lora_a.shape[0]):
        from .lora_kcat import packed_wcat
        if packed_wcat(weight, lora_b) is not None:      # the packed layout: [W | B] is a free view
            planned = plan_lora(M, N, K, lora_a.shape[0], x.dtype, x.device)
            if kcat_preferred(M, N, K, lora_a.shape[0], planned[0]):
                strategy, planned = "kcat", None
    if strategy == "auto":
        strategy, cfg = planned or plan_lora(M, N, K, lora_a.shape[0], x.dtype, x.device)
        if scaled and pin is None:          # a pinned plan is taken as given (run_strategy refuses what cannot run)
            strategy, cfg = _fp8_weight_plan(strategy, cfg, M, N, K, lora_a.shape[0], x.dtype, x.device,
                                             int(fp8_activations))
    else:
        with pinned(strategy=strategy, config=pin.config if pin else None):
            strategy, cfg = plan_lora(M, N, K, lora_a.shape[0], x.dtype, x.device)
    if strategy == "torch":
        return _lora_linear_torch(x, weight, lora_a, lora_b, scale, bias, weight_scale, fp8_activations)
    y = run_strategy(strategy, x2, weight, lora_a, lora_b, scale, bias, cfg, weight_scale=weight_scale,
                     x_fp8=fp8_rows(x2, terms=int(fp8_activations)) if fp8_activations else None)
    return y.reshape(*x.shape[:-1], N)


# fp8 weights run these lora_main_kernel strategies (the planner's 16-bit plan where it is one of them, else the
# same shape's split plan), swap-AB where the tiles allow
FP8_AUTO_STRATEGIES = ("kloop", "split", "streams")


@functools.lru_cache(maxsize=1024)  # the op plans on every call: keep this off the host critical path too
def _fp8_weight_plan(strategy: str, cfg: KernelConfig, M: int, N: int, K: int, r: int, dtype, device,
                     activations: int = 0):
    """``auto``'s plan for an fp8 weight, from the 16-bit plan of the shape (the tables are 16-bit measurements; not
    measured with fp8 yet). A widened W tile kept as the wgmma's B operand goes registers → shared memory, and on the
    prefill tiles that spills (sm_90 ptxas: split 128×256×64 on 8 warps 24 bytes, 128×128×64 on 4 warps 84); with
    swap-AB it is the register A operand and none of the planner's tiles spills (NOTES.md, session 33). So: one of
    :data:`FP8_AUTO_STRATEGIES` (else ``split``), with ``swap_ab`` wherever the tiles can take it.
    ``activations`` (fp8 x too, in 1 or 2 e4m3 terms): one of :data:`FP8_ACT_STRATEGIES` (else ``split``) with S
    from the down kernel (no in-grid S producers, which would read the fp8 x). Nothing is widened; but a 256-wide
    tile spills with two fp8 operands (sm_90 ptxas, 128×256×64 on 8 warps: 28 bytes; ×128: 40), so those become
    128×128×128 (CUTLASS's fp8 tile: 207 registers, no spill) where the ledger, at 8 bits (two x terms: 16), fits
    them."""
    if strategy == "torch":
        return strategy, cfg
    if strategy not in (FP8_ACT_STRATEGIES if activations else FP8_AUTO_STRATEGIES):
        with pinned(strategy="split"):
            strategy, cfg = plan_lora(M, N, K, r, dtype, device)
    if activations:
        cfg = cfg.replace(s_producers=0)
        if not cfg.swap_ab and cfg.block_n > 128:
            # two x terms: two fp8 x tiles per stage, which the 16-bit ledger (x and W at 16 bits) bounds; fewer
            # stages where the 16-bit count does not fit (the 256-wide tile would spill)
            for stages in range(max(cfg.num_stages, 2), 1, -1):
                square = cfg.replace(block_n=128, block_k=max(cfg.block_k, 128), num_stages=stages)
                if can_implement(strategy, (M, N, K, r), square, 8 * activations):
                    return strategy, square
        return strategy, cfg
    if M <= FP8_WEIGHT_NARROW_MAX_M and (M > 16 or N >= 8192):
        narrow = cfg.replace(block_m=max(16, next_pow2(M)), block_n=64, block_k=128, num_stages=4, num_warps=4,
                             swap_ab=True, split_k=1, s_producers=0)
        if can_implement("split", (M, N, K, r), narrow):
            return "split", narrow
    swapped = cfg.replace(swap_ab=True)
    if not cfg.swap_ab and can_implement(strategy, (M, N, K, r), swapped):
        cfg = swapped
    return strategy, cfg


# fp8 weights with 16-bit x up to this M: split, swap-AB, 64 weight rows × 128 K per step, 4 stages. H200, session 34
# (probe_lora_fp8w, graph µs, same process): 4096 → 28672 M = 1 / 16 / 64: 60.5 / 60.5 / 124.0 (the 16-bit plans,
# swapped) → 52.3 / 52.5 / 62.9; 4096² M = 64: 34.1 → 25.5. (cuBLAS bf16 58.4 / 59.2 / 63.8 / 13.3: W8A16 saves
# memory, not time; fp8_activations is the fast path.) Not at N < 8192 with M ≤ 16, where its 64-row tiles leave
# most SMs idle: 4096² M = 1 / 16 went 23.3 → 24.8 (bench lora --fp8, s34_fp8plan), so the 16-bit plan stays there.
FP8_WEIGHT_NARROW_MAX_M = 64


def kcat_preferred(M: int, N: int, K: int, r: int, planned: str | None = None) -> bool:
    """Where ``auto`` runs ``kcat`` on the packed layout (H200, session 15, ``probes/s15/kcat*``): compute-bound M with
    N ≥ 2·K, where the concat of x (~4·M·K bytes) is small next to the GEMM (2·M·N·K flops) and cuBLAS's main loop
    beats ours by 4–12 %. ``planned``: the strategy ``plan_lora`` picked for the shape. Below M=2048 a tuned
    persistent plan wins instead (4096×28672 M=1024, session 16: persistent 1.007–1.009× cuBLAS in the probe, kcat
    1.055–1.058× in the same day's bench); elsewhere kcat beat the planner's ``split`` there (1.07–1.12×). From
    M=2048 kcat stays (M=4096: 1.01–1.02× paired against the persistent plan's 1.02–1.04×)."""
    if not kcat_shape(M, N, K, r):
        return False
    return M >= 2048 or not (planned or "").startswith("persistent")


def kcat_shape(M: int, N: int, K: int, r: int) -> bool:
    """The shapes where kcat can be ``auto``'s choice at all (compute-bound M, N ≥ 2·K, r ≤ 128)."""
    return M >= 1024 and N >= 2 * K and r <= 128


def _v2_entry(M: int, N: int, K: int, r: int, device) -> dict | None:
    """The tuned table's (``plan/tuned/lora_v2_<gpu>.json``) entry whose bucket holds this shape — where the Gluon
    v2 measured faster than v1 on this GPU — else None (v1). ``LOWRANK_GEMM_LORA_V2=0`` turns v2 off. An entry
    has ``m_min``, ``m_max``, ``n_min`` (or ``n``: exactly), ``k``, ``r_max`` (and ``r_min``), ``shrink`` and
    optionally ``config`` (the tiles it was measured with, a KernelConfig once loaded; else v2's default)."""
    if getenv("LOWRANK_GEMM_LORA_V2", "1") == "0":
        return None
    path = tuned_file("lora_v2", device)
    for e in _load_v2_table(str(path)) if path is not None else ():
        n_ok = N == e["n"] if "n" in e else N >= e["n_min"]
        if e["m_min"] <= M <= e["m_max"] and n_ok and K == e["k"] and max(1, e.get("r_min", 1)) <= r <= e["r_max"]:
            return e
    return None


def _v2_choice(M: int, N: int, K: int, r: int, device) -> str | None:
    """The Gluon v2's shrink mode where :func:`_v2_entry` routes the shape to v2, else None."""
    e = _v2_entry(M, N, K, r, device)
    return None if e is None else e["shrink"]


_V2_ENTRY_KEYS = ("m_min", "m_max", "k", "r_max", "shrink")


@functools.lru_cache(maxsize=None)
def _load_v2_table(path: str) -> tuple:
    """The table's entries, each ``config`` (tile fields) made a KernelConfig once, here. Version 1, as every tuned
    table (another version is refused, not misread); a table that ``extends`` another (an H100's own entries over
    the H200's) lists its own entries first, so they win where buckets overlap. An entry missing a bucket field is
    an error naming the file and the entry, not a silent miss."""
    from .gluon.lora_ws import SHRINK_MODES
    p = Path(path)
    if not p.exists():
        return ()
    data = read_table(p)
    for i, e in enumerate(data.get("entries", ())):
        missing = [k for k in _V2_ENTRY_KEYS if k not in e] + ([] if "n" in e or "n_min" in e else ["n or n_min"])
        if missing:
            raise ValueError(f"{p}: entry {i} lacks {', '.join(missing)} (has {sorted(e)})")
        if e["shrink"] not in SHRINK_MODES:
            raise ValueError(f"{p}: entry {i} has shrink {e['shrink']!r} (expected one of {SHRINK_MODES})")
    own = tuple({**e, "config": KernelConfig(**e["config"])} if "config" in e else e for e in data.get("entries", ()))
    return own + (_load_v2_table(str(p.parent / data["extends"])) if data.get("extends") else ())


# ---------------------------------------------------------------------------- the op

@torch.library.custom_op("lowrank_gemm::lora_linear", mutates_args=())
def _lora_linear_op(x: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor,
                    lora_b: torch.Tensor, scale: float, bias: Optional[torch.Tensor],
                    strategy: str, weight_scale: Optional[torch.Tensor] = None,
                    fp8_activations: int = 0) -> torch.Tensor:
    return lora_linear_impl(x, weight, lora_a, lora_b, scale, bias, strategy, weight_scale, fp8_activations)


@_lora_linear_op.register_fake
def _(x, weight, lora_a, lora_b, scale, bias, strategy, weight_scale=None, fp8_activations=0):
    check_inputs(x, weight, lora_a, lora_b, bias, strategy, weight_scale, fp8_activations)
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def lora_linear(x: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                scale: float = 1.0, bias: torch.Tensor | None = None, strategy: str = "auto",
                weight_scale: torch.Tensor | None = None, fp8_activations: bool | int = False) -> torch.Tensor:
    """``y = x·Wᵀ + scale·(x·Aᵀ)·Bᵀ + bias``, fused.

    x [..., K], weight [N, K], lora_a [r, K], lora_b [N, r], bias [N] or None → y [..., N] in x's
    dtype. ``strategy``: "auto" (planner) or one of ``LORA_STRATEGIES``; ``plan.planner.pinned``
    can also force a strategy/config for a scope. See the module docstring for the input contract.
    ``weight_scale``: with an fp8 ``weight`` (e4m3 / e5m2), its scale per output channel ([N], or one value), so
    the base is ``x·(W·diag(weight_scale))ᵀ``; the kernels read W as fp8 (half the bytes) and widen it on chip.
    ``fp8_activations`` (an e4m3 weight): x is quantized per token for the base product, which then runs on the fp8
    tensor cores; the branch still reads the 16-bit x. ``True``: one e4m3 term (W8A8, rel. error ~0.024 on random
    data); ``2``: two terms, x ≈ (q + q')·s (the residual quantized on the same scale, ~8 significant bits: rel.
    error ~0.0023 on the swapped decode tiles (M ≤ 16), where the residual has its own accumulator, ~0.0028 above,
    against the widened W's 0.0018), twice the fp8 MMA work, so it pays at decode only. H200 (session 35,
    ``lora_fp8.md``, N = 28672, K = 4096, M = 1 / 16 / 64 / 1024): cuBLAS bf16 56.7 / 57.4 / 61.8 / 356 µs; widened
    W (False) 52.4 / 52.5 / 62.9 / 481; two terms 46.9 / 41.4 / 51.8 / 441 (session 38, own residual accumulator:
    46.5 / 41.3 / 51.9); one term 37.2 / 37.3 / 43.4 / 248.
    """
    terms = _act_terms(fp8_activations)
    if _direct_ok(x, weight, lora_a, lora_b, bias, weight_scale):
        return lora_linear_impl(x, weight, lora_a, lora_b, float(scale), bias, strategy, weight_scale, terms)
    check_inputs(x, weight, lora_a, lora_b, bias, strategy, weight_scale, terms)
    return torch.ops.lowrank_gemm.lora_linear(x, weight, lora_a, lora_b, float(scale), bias, strategy, weight_scale,
                                              terms)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _direct_ok(*tensors) -> bool:
    """Eager calls on plain tensors skip the custom-op dispatcher (tens of µs of host time per
    call) and run the op body directly: same validation, same kernels, same result. The op is
    still used whenever something must see it: torch.compile / export tracing, dispatch modes
    (fake, proxy), tensor subclasses, and autograd (the op has no backward, and through the op
    torch raises on backward instead of silently returning no gradient)."""
    if torch.compiler.is_compiling() or _python_dispatch._get_current_dispatch_mode() is not None:
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN or (grad and t.requires_grad)):
            return False
    return True
