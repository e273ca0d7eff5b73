"""Nunchaku's int4 SVDQuant checkpoints as :class:`~lowrank_gemm.nn.SVDQLinear` layers, which run on Hopper.

Nunchaku, the SVDQuant reference engine, refuses Hopper. Its int4 checkpoints (the ``svdq-int4`` FLUX.1
transformers, for instance) load here unchanged and run on this package's W4A4 kernels on H100/H200 (and on the
reference path elsewhere). A W4A4 layer ``<prefix>`` of such a file holds:

=================================  ====================  ================================================================
key                                stored shape          meaning
=================================  ====================  ================================================================
``qweight``                        int8 [N, K/2]         signed int4 codes q of the residual, in MMA fragment order
``wscales``                        16-bit [K/64, N]      group scales s (W_q = q·s), in scale-load order
``smooth_factor`` (old: ``smooth``)  [K]                 λ: the 4-bit path quantizes x / λ; scale-load order
``proj_down`` (old: ``lora_down``)   [K, r]              D, fragment order; the branch is (x·Dᵀ)·Uᵀ on the *raw* x
``proj_up`` (old: ``lora_up``)       [N, r]              U, fragment order
``bias``                           [N]                   scale-load order (mlp_fc2 layers: shifted, see below)
=================================  ====================  ================================================================

so the layer is ``y = Q(x/λ)·W_qᵀ + (x·Dᵀ)·Uᵀ + b`` with D unpacked as [r, K]. Ours keeps the branch on the
smoothed input: ``lora_down`` A = D·diag(λ), the re-basing :meth:`SVDQLinear.append_lora` does too (A is rounded
to the factors' dtype once).

**Layouts.** Nunchaku's kernels load every operand straight into ``mma.sync`` registers, so each file layout is a
PTX fragment layout tiled over the matrix (Nunchaku writes them in ``nunchaku/lora/flux/packer.py``; here they are
re-derived from the PTX ISA and written as index maps):

- ``qweight``, the B operand of ``mma.m16n8k64.s4`` (B fragment: lane L holds row L // 4 of an 8-row tile and K
  positions 8·(L % 4) + j, j < 8, in one 32-bit register, and + 32 in a second). Per block of 128 rows × 64 K,
  ordered block-row-major: [16-row tile t][lane: row r (8), K quarter c (4)][8-row half h][K half e] words of
  8 nibbles, nibble j in bits 4j..4j+3 (little-endian bytes): row 16t + 8h + r, K 32e + 8c + j.
- ``wscales``, ``bias``, ``smooth_factor``: per 128 rows (128 K for λ) and per group, 32 lanes × 4 values; lane
  4a + b holds rows 16a + 2b + {0, 1, 8, 9} — the two accumulator columns a lane owns in each n8 half.
- ``proj_down`` / ``proj_up``, B operands of ``mma.m16n8k16.f16``: 16 × 16 tiles (rank × K for D, N × rank for U),
  in each [lane: row r (8), column pair c (4)][8-row half h][8-column half e][pair element p]: row 8h + r,
  column 8e + 2c + p. Tiles are ordered by the K (D) or N (U) block first, then the rank block.

**The GELU shift.** Nunchaku's fused MLP quantizes ``gelu(h) + 0.171875`` as unsigned int4 and its checkpoints
fold the shift into the bias of the layer behind it (``mlp_fc2``, ``mlp_context_fc2``): ``b_file = b − W·shift``.
On a plain input that layer needs the shift back, ``b = b_file + W·shift`` with W the layer's effective weight
(main path and branch), which :func:`svdq_linear_from_nunchaku` adds when ``input_shift`` is set —
:func:`load_nunchaku` does it for those layer names by default. Activations are then quantized signed, as every
SVDQLinear does, unless ``unsigned=True``: then those layers quantize x + shift unsigned
(``SVDQLinear.act_shift``), Nunchaku's own scheme.

Only the int4 format converts: NVFP4 checkpoints (fp8 group scales of 16, Blackwell-only in Nunchaku) are refused,
and Nunchaku's AWQ W4A16 layers (``wzeros`` beside ``qweight``) are left out and reported.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from ..formats.int4 import GELU_SHIFT, pack_int4, unpack_int4
from ..nn.svdq import SVDQLinear
from ..quant.config import SVDQuantConfig

__all__ = ["GELU_SHIFT", "SHIFTED_INPUTS", "GROUP_SIZE", "NunchakuImport", "load_nunchaku",
           "svdq_linear_from_nunchaku", "svdq_linear_to_nunchaku", "split_rows", "concat_inputs",
           "flux_to_diffusers", "replace_linears_", "load_nunchaku_flux_", "unpack_qweight", "pack_qweight", "unpack_scales",
           "pack_scales", "unpack_vector", "pack_vector", "unpack_lowrank", "pack_lowrank"]

SHIFTED_INPUTS = ("*mlp_fc2", "*mlp_context_fc2")   # names whose stored bias carries the GELU shift
GROUP_SIZE = 64                                      # Nunchaku's int4 group
ROW_BLOCK = 128                                      # rows (and K) per packed block (the kernels' warp_n)
_16BIT = (torch.float16, torch.bfloat16)


def _expect(cond: bool, msg) -> None:
    if not cond:
        raise ValueError(f"nunchaku: {msg() if callable(msg) else msg}")


# --- layouts: each is a reshape of the logical matrix into named axes and a permutation of them -----------

def _pack(t: torch.Tensor, logical: tuple, perm: tuple) -> torch.Tensor:
    return t.reshape(logical).permute(perm).contiguous()


def _unpack(flat: torch.Tensor, logical: tuple, perm: tuple) -> torch.Tensor:
    stored = tuple(logical[p] for p in perm)
    inverse = tuple(sorted(range(len(perm)), key=perm.__getitem__))
    return flat.reshape(stored).permute(inverse).contiguous()


def _weight_axes(n: int, k: int):
    # logical (block, tile t, half h, row r, K block, K half e, quarter c, byte pair) with bytes: (.., 4 bytes, 2 nibbles)
    logical = (n // ROW_BLOCK, 8, 2, 8, k // 64, 2, 4, 4)
    return logical, (0, 4, 1, 3, 6, 2, 5, 7)       # stored: block, K block, t, r, c, h, e, bytes


def unpack_qweight(qweight: torch.Tensor) -> torch.Tensor:
    """int8/uint8 [N, K/2] in Nunchaku's fragment order → int8 codes [N, K] in [−8, 7]."""
    _expect(isinstance(qweight, torch.Tensor) and qweight.dtype in (torch.int8, torch.uint8) and qweight.dim() == 2,
            lambda: f"qweight must be int8 [N, K/2], got {getattr(qweight, 'dtype', type(qweight).__name__)} "
            f"{list(getattr(qweight, 'shape', []))}")
    n, k = qweight.shape[0], qweight.shape[1] * 2
    _expect(n % ROW_BLOCK == 0 and k % (2 * 64) == 0,
            lambda: f"qweight [N, K/2] = {list(qweight.shape)}: N must be a multiple of {ROW_BLOCK} and K of 128")
    logical, perm = _weight_axes(n, k)
    b = _unpack(qweight.contiguous().view(torch.uint8), logical, perm).to(torch.int16)
    nib = torch.stack([b & 0xF, b >> 4], dim=-1)                 # byte i of a word: nibbles 2i (low), 2i + 1
    return ((nib ^ 8) - 8).to(torch.int8).reshape(n, k)


def pack_qweight(q: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`unpack_qweight`: int8 codes [N, K] in [−8, 7] → int8 [N, K/2]."""
    _expect(q.dtype == torch.int8 and q.dim() == 2, lambda: f"codes must be int8 [N, K], got {q.dtype} {list(q.shape)}")
    n, k = q.shape
    _expect(n % ROW_BLOCK == 0 and k % 128 == 0, lambda: f"codes [N, K] = {list(q.shape)}: N must be a multiple of "
            f"{ROW_BLOCK} and K of 128")
    _expect(q.numel() == 0 or (int(q.min()) >= -8 and int(q.max()) <= 7), "codes must lie in [-8, 7]")
    nib = (q.to(torch.int16) & 0xF).reshape(n, k // 2, 2)
    byte = (nib[..., 0] | (nib[..., 1] << 4)).to(torch.uint8)
    logical, perm = _weight_axes(n, k)
    return _pack(byte, logical, perm).view(torch.int8).reshape(n, k // 2)


def _scale_axes(groups: int, n: int):
    # logical (group, block, a, h (8-row half), b, pair element); row = 16a + 8h + 2b + element
    return (groups, n // ROW_BLOCK, 8, 2, 4, 2), (1, 0, 2, 4, 3, 5)     # stored: block, group, a, b, h, element


def unpack_scales(wscales: torch.Tensor) -> torch.Tensor:
    """[G, N] in Nunchaku's scale-load order → [G, N] (group g, row n)."""
    _expect(wscales.dim() == 2 and wscales.shape[1] % ROW_BLOCK == 0,
            lambda: f"scales must be [K/{GROUP_SIZE}, N] with N a multiple of {ROW_BLOCK}, got {list(wscales.shape)}")
    logical, perm = _scale_axes(*wscales.shape)
    return _unpack(wscales.contiguous(), logical, perm).reshape(wscales.shape)


def pack_scales(scales: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`unpack_scales`."""
    _expect(scales.dim() == 2 and scales.shape[1] % ROW_BLOCK == 0,
            lambda: f"scales must be [G, N] with N a multiple of {ROW_BLOCK}, got {list(scales.shape)}")
    logical, perm = _scale_axes(*scales.shape)
    return _pack(scales, logical, perm).reshape(scales.shape)


def unpack_vector(v: torch.Tensor) -> torch.Tensor:
    """A per-row vector (bias, λ) [N] in scale-load order → [N]."""
    _expect(v.dim() == 1, lambda: f"expected a vector, got shape {list(v.shape)}")
    return unpack_scales(v.reshape(1, -1)).reshape(-1)


def pack_vector(v: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`unpack_vector`."""
    _expect(v.dim() == 1, lambda: f"expected a vector, got shape {list(v.shape)}")
    return pack_scales(v.reshape(1, -1)).reshape(-1)


def _lowrank_axes(rows: int, cols: int, down: bool):
    # logical rows (block, h, r) × columns (block, e, c, p); stored (outer block, rank block, r, c, h, e, p) where
    # the outer block is the K block for D [rank, K] (its columns) and the N block for U [N, rank] (its rows)
    logical = (rows // 16, 2, 8, cols // 16, 2, 4, 2)
    return logical, ((3, 0, 2, 5, 1, 4, 6) if down else (0, 3, 2, 5, 1, 4, 6))


def unpack_lowrank(stored: torch.Tensor, down: bool) -> torch.Tensor:
    """``proj_down`` [K, r] → D as [r, K] (PEFT's lora_A layout, raw-input form); ``proj_up`` [N, r] → U [N, r]."""
    _expect(stored.dim() == 2 and stored.dtype in _16BIT, lambda: f"low-rank factors must be 16-bit 2-D, got "
            f"{stored.dtype} {list(stored.shape)}")
    c, r = stored.shape
    _expect(c % 16 == 0 and r % 16 == 0, lambda: f"low-rank factor {list(stored.shape)}: both dims must be multiples "
            "of 16 (Nunchaku pads the rank to 16)")
    rows, cols = (r, c) if down else (c, r)
    logical, perm = _lowrank_axes(rows, cols, down)
    return _unpack(stored.contiguous(), logical, perm).reshape(rows, cols)


def pack_lowrank(w: torch.Tensor, down: bool) -> torch.Tensor:
    """Inverse of :func:`unpack_lowrank`: D [r, K] → [K, r]; U [N, r] → [N, r]."""
    _expect(w.dim() == 2 and w.shape[0] % 16 == 0 and w.shape[1] % 16 == 0,
            lambda: f"low-rank factor must be 2-D with dims multiple of 16, got {list(w.shape)}")
    rows, cols = w.shape
    logical, perm = _lowrank_axes(rows, cols, down)
    flat = _pack(w, logical, perm)
    return flat.reshape(cols, rows) if down else flat.reshape(rows, cols)


# --- one layer --------------------------------------------------------------------------------------------

def _pick(tensors: Mapping[str, torch.Tensor], prefix: str, *names: str):
    for name in names:
        if prefix + name in tensors:
            return tensors[prefix + name]
    return None


def svdq_linear_from_nunchaku(tensors: Mapping[str, torch.Tensor], prefix: str = "", *, input_shift: float = 0.0,
                              in_features: int | None = None, out_features: int | None = None,
                              unsigned: bool = False) -> SVDQLinear:
    """The SVDQLinear computing Nunchaku's int4 layer ``prefix`` of ``tensors`` (keys ``prefix + "qweight"`` …).

    ``input_shift``: the constant Nunchaku added to this layer's input and folded out of its bias (the GELU shift
    of ``mlp_fc2`` layers, :data:`GELU_SHIFT`); it is folded back, so the module takes the plain input.
    ``unsigned`` (with ``input_shift``): the module quantizes x + input_shift unsigned (``act_shift``), as Nunchaku
    does, instead of x signed — one more bit of activation resolution for those layers.
    ``in_features`` / ``out_features``: crop Nunchaku's padding (its files pad N and K to multiples of 128).
    """
    name = prefix.rstrip(".") or "layer"
    qweight = _pick(tensors, prefix, "qweight")
    wscales = _pick(tensors, prefix, "wscales")
    _expect(qweight is not None and wscales is not None, f"{name}: needs 'qweight' and 'wscales'")
    _expect(_pick(tensors, prefix, "wzeros") is None, f"{name}: an AWQ W4A16 layer (has 'wzeros'), not SVDQuant W4A4")
    _expect(wscales.dtype in _16BIT, lambda: f"{name}: wscales are {wscales.dtype}; only the int4 format (16-bit "
            "scales, group 64) converts — NVFP4 checkpoints (fp8 scales, group 16) need Blackwell")
    _expect(_pick(tensors, prefix, "wcscales", "wtscale") is None, f"{name}: NVFP4 tensors (wcscales / wtscale) "
            "present; only int4 checkpoints convert")
    q = unpack_qweight(qweight)
    n, k = q.shape
    _expect(wscales.shape == (k // GROUP_SIZE, n), lambda: f"{name}: wscales {list(wscales.shape)} do not match "
            f"qweight {list(qweight.shape)} (expected [{k // GROUP_SIZE}, {n}])")
    dtype = wscales.dtype
    smooth = _pick(tensors, prefix, "smooth_factor", "smooth")
    if smooth is None:
        lam = torch.ones(k, dtype=dtype, device=q.device)
    else:
        _expect(smooth.shape == (k,), lambda: f"{name}: smooth_factor {list(smooth.shape)}, expected [{k}]")
        lam = unpack_vector(smooth)
    down = _pick(tensors, prefix, "proj_down", "lora_down")
    up = _pick(tensors, prefix, "proj_up", "lora_up")
    _expect((down is None) == (up is None), f"{name}: needs both proj_down and proj_up, or neither")
    if down is not None:
        _expect(down.dim() == 2 and down.shape[0] == k and up.dim() == 2 and up.shape == (n, down.shape[1]),
                lambda: f"{name}: proj_down {list(down.shape)} / proj_up {list(up.shape)} do not match [K, r] = "
                f"[{k}, r] / [N, r] = [{n}, r]")
        d, u = unpack_lowrank(down, True), unpack_lowrank(up, False)         # [r, K] raw-input form, [N, r]
    else:
        d = torch.zeros(0, k, dtype=dtype, device=q.device)
        u = torch.zeros(n, 0, dtype=dtype, device=q.device)
    bias = _pick(tensors, prefix, "bias")
    if bias is not None:
        _expect(bias.shape == (n,), lambda: f"{name}: bias {list(bias.shape)}, expected [{n}]")
        bias = unpack_vector(bias)
    kk = k if in_features is None else int(in_features)
    nn_ = n if out_features is None else int(out_features)
    _expect(0 < kk <= k and kk % GROUP_SIZE == 0 and 0 < nn_ <= n,
            lambda: f"{name}: cannot crop [{n}, {k}] to [{nn_}, {kk}] (K must stay a multiple of {GROUP_SIZE})")
    q, ws, lam = q[:nn_, :kk], unpack_scales(wscales)[:kk // GROUP_SIZE, :nn_], lam[:kk]
    d, u = d[:, :kk], u[:nn_]
    if bias is not None:
        bias = bias[:nn_]
    _expect(bool(torch.isfinite(ws).all() and torch.isfinite(lam).all() and (lam != 0).all()),
            f"{name}: wscales / smooth_factor hold NaN, Inf or zero λ")
    rank = d.shape[0]
    if input_shift:
        base = bias.double() if bias is not None else torch.zeros(nn_, dtype=torch.float64, device=q.device)
        bias = (base + float(input_shift) * _raw_row_sums(q, ws, lam, u, d)).to(
            bias.dtype if bias is not None else dtype)
    config = SVDQuantConfig(rank=rank, group_size=GROUP_SIZE, smooth=smooth is not None,
                            scale_dtype=_dtype_name(dtype), lowrank_dtype=_dtype_name(u.dtype if rank else dtype))
    mod = SVDQLinear(kk, nn_, rank, GROUP_SIZE, bias is not None, 4, dtype, u.dtype if rank else dtype,
                     bias.dtype if bias is not None else torch.float32, config,
                     act_shift=float(input_shift) if unsigned else 0.0)
    mod.qweight = pack_int4(q.contiguous())
    mod.wscales = ws.contiguous()
    mod.smooth = lam.to(dtype).contiguous()
    # our branch sees x / λ: A = D·diag(λ) (rounded once to the factors' dtype)
    mod.lora_down = (d.float() * lam.float()).to(u.dtype if rank else dtype).contiguous()
    mod.lora_up = u.contiguous()
    if bias is not None:
        mod.bias = bias.contiguous()
    mod.source = "nunchaku"
    mod.refresh_act_shift()
    return mod


def _raw_row_sums(q, ws, lam, u, d) -> torch.Tensor:
    """Σ_k W_eff[n, k] in float64 for the layer on the raw input: the main path's q·s/λ plus the branch's U·D
    (D [r, K] in raw-input form) — what a constant input shift of 1 adds to each output."""
    n, k = q.shape
    main = ((q.double().reshape(n, k // GROUP_SIZE, GROUP_SIZE) / lam.double().reshape(1, -1, GROUP_SIZE)).sum(-1)
            * ws.double().t()).sum(-1)
    return main + (u.double() @ d.double().sum(1) if d.shape[0] else 0.0)


def _dtype_name(dtype: torch.dtype) -> str:
    return "float16" if dtype == torch.float16 else "bfloat16"


def svdq_linear_to_nunchaku(layer: SVDQLinear, *, input_shift: float = 0.0) -> dict[str, torch.Tensor]:
    """``layer`` as Nunchaku's int4 tensors (keys without prefix): the inverse of :func:`svdq_linear_from_nunchaku`
    for layers of group 64 whose N and K are multiples of 128 (the rank is padded with zeros to a multiple of 16).
    ``input_shift``: fold that input shift out of the bias the way Nunchaku's mlp_fc2 layers store it. The factor D
    = A·diag(1/λ) is rounded to the factors' dtype (Nunchaku applies it to the raw input)."""
    _expect(isinstance(layer, SVDQLinear) and layer.group_size == GROUP_SIZE and layer.act_bits == 4,
            lambda: f"expected a W4A4 SVDQLinear of group {GROUP_SIZE}, got {layer!r}")
    n, k = layer.out_features, layer.in_features
    _expect(n % ROW_BLOCK == 0 and k % 128 == 0, lambda: f"Nunchaku needs N and K multiples of 128, got [{n}, {k}]")
    q = unpack_int4(layer.qweight.cpu())
    lam = layer.smooth.cpu()
    r = layer.rank
    r16 = -(-r // 16) * 16
    dtype = layer.lora_up.dtype
    d = torch.zeros(r16, k, dtype=dtype)
    u = torch.zeros(n, r16, dtype=dtype)
    if r:
        d[:r] = (layer.lora_down.cpu().double() / lam.double()).to(dtype)
        u[:, :r] = layer.lora_up.cpu()
    bias = layer.bias.cpu().to(dtype) if layer.bias is not None else torch.zeros(n, dtype=dtype)
    out = {"qweight": pack_qweight(q), "wscales": pack_scales(layer.wscales.cpu()), "smooth_factor": pack_vector(lam),
           "proj_down": pack_lowrank(d, True), "proj_up": pack_lowrank(u, False)}
    if input_shift:
        raw_down = layer.lora_down.cpu().double() / lam.double()
        sums = _raw_row_sums(q, layer.wscales.cpu(), lam, layer.lora_up.cpu(), raw_down)
        bias = (bias.double() - float(input_shift) * sums).to(dtype)
    out["bias"] = pack_vector(bias)
    return out


# --- a whole checkpoint -----------------------------------------------------------------------------------

_LAYER_KEYS = ("qweight", "wscales", "smooth_factor", "smooth", "smooth_factor_orig", "proj_down", "proj_up",
               "lora_down", "lora_up", "bias")


class NunchakuImport(NamedTuple):
    """``layers``: layer name (the key prefix without its dot) → SVDQLinear; ``skipped``: name → why (Nunchaku's
    AWQ W4A16 layers); ``other``: every tensor of no converted layer (norms, embeddings, skipped layers), by key."""

    layers: dict[str, SVDQLinear]
    skipped: dict[str, str]
    other: dict[str, torch.Tensor]


def _matches(name: str, patterns: Sequence[str] | Callable[[str], bool]) -> bool:
    if callable(patterns):
        return bool(patterns(name))
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def load_nunchaku(source: str | Path | Mapping[str, torch.Tensor], *,
                  shifted_inputs: Sequence[str] | Callable[[str], bool] = SHIFTED_INPUTS,
                  input_shift: float = GELU_SHIFT, unsigned: bool = False, progress: bool = True) -> NunchakuImport:
    """Every int4 W4A4 layer of a Nunchaku checkpoint (a ``.safetensors`` path or its tensors) as an SVDQLinear.

    ``shifted_inputs``: globs on the layer name (or a predicate) of the layers whose stored bias carries Nunchaku's
    input shift (default: the FLUX checkpoints' MLP fc2 layers, :data:`SHIFTED_INPUTS`); ``input_shift`` is folded
    back into their bias (:func:`svdq_linear_from_nunchaku`). Pass ``()`` for a checkpoint written without the shift,
    and the right names for another model's (a missed shift is a constant error in those biases). ``unsigned``:
    those layers quantize their shifted input unsigned, as Nunchaku does (``SVDQLinear.act_shift``; on CUDA the
    e4m3 GEMM paths, not yet measured on the GPU). Raises
    ValueError, naming the layer, for anything that does not convert exactly (NVFP4, mismatched shapes)."""
    if isinstance(source, Mapping):
        tensors = source
    else:
        import safetensors.torch
        tensors = safetensors.torch.load_file(str(source))
    from tqdm.auto import tqdm
    prefixes = sorted(k[:-len("qweight")] for k in tensors if k == "qweight" or k.endswith(".qweight"))
    layers, skipped, used = {}, {}, set()
    for prefix in tqdm(prefixes, desc="nunchaku layers", unit="layer", disable=not progress):
        name = prefix.rstrip(".")
        if prefix + "wzeros" in tensors:
            skipped[name or "qweight"] = "AWQ W4A16 layer (wzeros): not an SVDQuant W4A4 layer"
            continue
        shift = float(input_shift) if _matches(name, shifted_inputs) else 0.0
        layers[name] = svdq_linear_from_nunchaku(tensors, prefix, input_shift=shift, unsigned=unsigned)
        used.update(prefix + key for key in _LAYER_KEYS if prefix + key in tensors)
    other = {k: v for k, v in tensors.items() if k not in used}
    return NunchakuImport(layers, skipped, other)


# --- reshaping layers for a model's module tree ------------------------------------------------------------

def _like(layer: SVDQLinear, in_features: int, out_features: int, rank: int,
          bias_dtype: torch.dtype | None) -> SVDQLinear:
    """An empty SVDQLinear of ``layer``'s format (group, activation bits, dtypes) in the given shape; a bias of
    ``bias_dtype`` (None: no bias)."""
    if getattr(layer, "weight_format", "int4_g64") != "int4_g64":
        raise ValueError(f"reshaping Nunchaku-style layers takes int4_g64 layers (Nunchaku's format), got "
                         f"weight_format={layer.weight_format!r}")
    mod = SVDQLinear(in_features, out_features, rank, layer.group_size, bias_dtype is not None, layer.act_bits,
                     layer.wscales.dtype, layer.lora_up.dtype, bias_dtype or torch.float32, layer.config,
                     act_shift=layer.act_shift)
    if getattr(layer, "source", None):
        mod.source = layer.source
    return mod.to(layer.qweight.device)


def split_rows(layer: SVDQLinear, sizes: Sequence[int]) -> list[SVDQLinear]:
    """``layer`` cut along its outputs into layers of ``sizes`` rows (a fused q/k/v projection into three). Each
    part gives exactly its rows of the whole layer's output: rows are independent, the input side (λ, the
    activation groups, lora_down) is shared and copied."""
    _expect(len(sizes) > 0 and all(s > 0 for s in sizes) and sum(sizes) == layer.out_features,
            lambda: f"split sizes {list(sizes)} must be positive and sum to out_features={layer.out_features}")
    parts, start = [], 0
    for size in sizes:
        rows = slice(start, start + size)
        part = _like(layer, layer.in_features, size, layer.rank, None if layer.bias is None else layer.bias.dtype)
        part.qweight = layer.qweight[rows].clone()
        part.wscales = layer.wscales[:, rows].clone()
        part.smooth = layer.smooth.clone()
        part.lora_down = layer.lora_down.clone()
        part.lora_up = layer.lora_up[rows].clone()
        if layer.bias is not None:
            part.bias = layer.bias[rows].clone()
        part.refresh_act_shift()
        parts.append(part)
        start += size
    return parts


def concat_inputs(layers: Sequence[SVDQLinear]) -> SVDQLinear:
    """One layer over the concatenated inputs of ``layers``: ``y = Σ_i layers[i](x_i)`` for ``x = [x_0, x_1, …]``
    (FLUX's single-block ``proj_out`` over [attention output, MLP hidden], which Nunchaku stores as two layers).
    Activation groups never straddle two inputs (each K is a multiple of the group), so the 4-bit path is unchanged;
    the branches stack along the rank (lora_down block-diagonal) and the biases add."""
    _expect(len(layers) >= 1, "concat_inputs needs at least one layer")
    first = layers[0]
    for lay in layers:
        _expect(isinstance(lay, SVDQLinear) and lay.out_features == first.out_features
                and lay.group_size == first.group_size and lay.act_bits == first.act_bits
                and lay.wscales.dtype == first.wscales.dtype and lay.lora_up.dtype == first.lora_up.dtype
                and lay.in_features % lay.group_size == 0 and lay.act_shift == first.act_shift,
                lambda: "concat_inputs: layers must share out_features, group size, activation bits and shift, and "
                "dtypes; got "
                f"{[repr(x) for x in layers]}")
    k = sum(lay.in_features for lay in layers)
    r = sum(lay.rank for lay in layers)
    biases = [lay.bias for lay in layers if lay.bias is not None]
    out = _like(first, k, first.out_features, r, biases[0].dtype if biases else None)
    out.qweight = torch.cat([lay.qweight for lay in layers], dim=1)
    out.wscales = torch.cat([lay.wscales for lay in layers], dim=0)
    out.smooth = torch.cat([lay.smooth for lay in layers])
    down = torch.zeros(r, k, dtype=first.lora_down.dtype, device=first.lora_down.device)
    r0 = k0 = 0
    for lay in layers:
        down[r0:r0 + lay.rank, k0:k0 + lay.in_features] = lay.lora_down
        r0, k0 = r0 + lay.rank, k0 + lay.in_features
    out.lora_down = down
    out.lora_up = torch.cat([lay.lora_up for lay in layers], dim=1)
    if biases:
        out.bias = torch.stack([b.double() for b in biases]).sum(0).to(biases[0].dtype)
    out.refresh_act_shift()
    return out


# FLUX.1 in Nunchaku's names (per block) → diffusers' FluxTransformer2DModel module paths
_FLUX_DOUBLE = {"qkv_proj": ("attn.to_q", "attn.to_k", "attn.to_v"),
                "qkv_proj_context": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
                "out_proj": "attn.to_out.0", "out_proj_context": "attn.to_add_out",
                "mlp_fc1": "ff.net.0.proj", "mlp_fc2": "ff.net.2",
                "mlp_context_fc1": "ff_context.net.0.proj", "mlp_context_fc2": "ff_context.net.2"}
_FLUX_SINGLE = {"qkv_proj": ("attn.to_q", "attn.to_k", "attn.to_v"), "mlp_fc1": "proj_mlp",
                ("out_proj", "mlp_fc2"): "proj_out"}


def flux_to_diffusers(layers: Mapping[str, SVDQLinear]) -> dict[str, SVDQLinear]:
    """Nunchaku FLUX.1 layer names → diffusers ``FluxTransformer2DModel`` module paths: fused q/k/v projections are
    split by rows (:func:`split_rows`), a single block's ``out_proj`` + ``mlp_fc2`` become its ``proj_out``
    (:func:`concat_inputs`). Every name must map; the unmapped ones are listed in the error."""
    out, done = {}, set()
    blocks = sorted({name.rsplit(".", 1)[0] for name in layers})
    for block in blocks:
        kind = block.split(".")[0]
        table = {"transformer_blocks": _FLUX_DOUBLE, "single_transformer_blocks": _FLUX_SINGLE}.get(kind)
        if table is None:
            continue
        for local, target in table.items():
            names = [f"{block}.{x}" for x in (local if isinstance(local, tuple) else (local,))]
            if not all(n in layers for n in names):
                continue
            if isinstance(local, tuple):
                out[f"{block}.{target}"] = concat_inputs([layers[n] for n in names])
            elif isinstance(target, tuple):
                whole = layers[names[0]]
                _expect(whole.out_features % len(target) == 0,
                        lambda: f"{names[0]}: {whole.out_features} rows do not split into {len(target)} equal parts")
                for t, part in zip(target, split_rows(whole, [whole.out_features // len(target)] * len(target))):
                    out[f"{block}.{t}"] = part
            else:
                out[f"{block}.{target}"] = layers[names[0]]
            done.update(names)
    left = sorted(set(layers) - done)
    _expect(not left, lambda: f"flux_to_diffusers: no diffusers module for {left}")
    return out


def replace_linears_(model: nn.Module, layers: Mapping[str, nn.Module]) -> list[str]:
    """Swap the ``nn.Linear`` modules of ``model`` named in ``layers`` for those layers (moved to the Linear's
    device, the bias cast to the Linear's bias dtype, as ``SVDQLinear.from_linear`` keeps it). Every name is
    checked first — it exists, is an ``nn.Linear`` of the same in/out features, and a bias matches (a layer's
    all-zero bias is dropped where the Linear has none) — so a mismatch changes nothing."""
    plan = {}
    for name, layer in layers.items():
        try:
            target = model.get_submodule(name)
        except AttributeError:
            raise ValueError(f"replace_linears_: the model has no module '{name}'") from None
        _expect(isinstance(target, nn.Linear), lambda: f"replace_linears_: '{name}' is a {type(target).__name__}, "
                "not nn.Linear")
        _expect((target.in_features, target.out_features) == (layer.in_features, layer.out_features),
                lambda: f"replace_linears_: '{name}' is [{target.out_features}, {target.in_features}] in the model, "
                f"[{layer.out_features}, {layer.in_features}] in the checkpoint")
        has_bias = getattr(layer, "bias", None) is not None
        if target.bias is None and has_bias:
            _expect(not bool(layer.bias.any()), lambda: f"replace_linears_: '{name}' has no bias in the model but a "
                    "non-zero one in the checkpoint")
        _expect(target.bias is None or has_bias, lambda: f"replace_linears_: '{name}' has a bias in the model but none "
                "in the checkpoint")
        plan[name] = (layer, target.weight.device, target.bias)
    for name, (layer, device, target_bias) in plan.items():
        if target_bias is None:
            layer.bias = None
        elif layer.bias.dtype != target_bias.dtype:
            layer.bias = layer.bias.to(target_bias.dtype)
        model.set_submodule(name, layer.to(device))
    return list(plan)


def load_nunchaku_flux_(model: nn.Module, source: str | Path | Mapping[str, torch.Tensor], **load_kw) -> NunchakuImport:
    """:func:`load_nunchaku` + :func:`flux_to_diffusers` + :func:`replace_linears_` on a diffusers
    ``FluxTransformer2DModel`` (its unquantized parts loaded as usual, e.g. from the original FLUX.1 weights). Returns
    the import record with ``layers`` keyed by the model's module names, as replaced."""
    got = load_nunchaku(source, **load_kw)
    mapped = flux_to_diffusers(got.layers)
    replace_linears_(model, mapped)
    return NunchakuImport(mapped, got.skipped, got.other)
