"""PEFT glue: read a PEFT LoRA layer's branch, and swap PEFT LoRA layers for fused modules."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

__all__ = ["is_peft_lora_linear", "peft_branch", "fuse_lora_", "append_lora_weights_", "LORA_PREFIXES"]

# key prefixes that LoRA files put before the module path: PEFT's adapter files, diffusers' pipelines
LORA_PREFIXES = ("", "base_model.model.", "transformer.", "unet.", "model.")
_LORA_KEY = re.compile(r"^(?P<path>.+)\.lora_A(?:\.(?P<adapter>[^.]+))?\.weight$")


def is_peft_lora_linear(module: nn.Module) -> bool:
    try:
        from peft.tuners.lora.layer import Linear as PeftLoraLinear
    except ImportError:
        return False
    return isinstance(module, PeftLoraLinear)


def peft_branch(layer: nn.Module):
    """The branch a PEFT ``lora.Linear`` adds in eval mode, as one low-rank pair.

    Returns ``(base_linear, lora_a [r, K] | None, lora_b [N, r] | None, scale, extra_bias [N] | None)``.
    Several active adapters are concatenated along the rank with each adapter's scaling folded into
    its B (then ``scale == 1``); one adapter keeps its scaling (``alpha/r``, or ``alpha/sqrt(r)`` with
    rslora, as PEFT computed it) so the kernel applies it in fp32. ``lora_bias`` becomes an extra bias.
    Merged layers, DoRA and other variants are refused: converting them silently would change results.
    """
    if not is_peft_lora_linear(layer):
        raise TypeError(f"expected a peft.tuners.lora.Linear, got {type(layer).__name__}")
    base = layer.get_base_layer()
    if not isinstance(base, nn.Linear):
        raise TypeError(f"PEFT layer wraps {type(base).__name__}; only nn.Linear bases can be fused")
    if layer.merged:
        raise ValueError("PEFT layer has merged adapters; call unmerge_adapter() before fuse_lora_()")
    if layer.disable_adapters:
        return base, None, None, 1.0, None
    active = [a for a in layer.active_adapters if a in layer.lora_A.keys()]
    variants = [a for a in active if a in getattr(layer, "lora_variant", {})]
    if variants:
        raise NotImplementedError(f"LoRA variant(s) {variants} (e.g. DoRA) are not supported by the fused kernels")
    if not active:
        return base, None, None, 1.0, None
    a_list, b_list, scales, extra_bias = [], [], [], None
    for name in active:
        a_lin, b_lin = layer.lora_A[name], layer.lora_B[name]
        scaling = float(layer.scaling[name])
        a_list.append(a_lin.weight.detach())
        b_list.append(b_lin.weight.detach())
        scales.append(scaling)
        if getattr(b_lin, "bias", None) is not None:
            term = b_lin.bias.detach() * scaling
            extra_bias = term if extra_bias is None else extra_bias + term
    if len(active) == 1:
        return base, a_list[0], b_list[0], scales[0], extra_bias
    lora_a = torch.cat(a_list, dim=0)
    lora_b = torch.cat([b * s for b, s in zip(b_list, scales)], dim=1)
    return base, lora_a, lora_b, 1.0, extra_bias


def fuse_lora_(model: nn.Module, *, strategy: str = "auto", pack: bool = False,
               fp8: torch.dtype | None = None, fp8_activations: bool | int = False) -> nn.Module:
    """Replace, in place, every PEFT LoRA Linear in ``model`` by :class:`~lowrank_gemm.nn.LoRALinear`.

    Layers whose adapters are disabled become their plain base ``nn.Linear``. ``pack``: lay each layer's W and B
    out as one buffer (:meth:`LoRALinear.pack_`), where ``auto`` runs the ``kcat`` strategy at prefill sizes.
    ``fp8`` (``torch.float8_e4m3fn`` / ``float8_e5m2``): store each fused layer's base weight in fp8 with a scale
    per output channel (:meth:`LoRALinear.quantize_weight_fp8_`; not with ``pack``), and with ``fp8_activations``
    (e4m3) quantize x per token for the base product too (``True``: one e4m3 term, ``2``: two). Returns ``model``.
    """
    if fp8_activations and fp8 is None:
        raise ValueError("fuse_lora_: fp8_activations needs fp8=torch.float8_e4m3fn (the fp8 × fp8 base product)")
    if fp8 is not None and pack:
        raise ValueError("fuse_lora_: fp8 base weights and pack=True exclude each other (pack shares W's buffer with B)")
    from ..nn.lora import LoRALinear
    targets = [(name, mod) for name, mod in model.named_modules() if is_peft_lora_linear(mod)]
    for name, mod in targets:
        new = LoRALinear.from_peft(mod, strategy=strategy)
        if pack and isinstance(new, LoRALinear):
            new.pack_()
        if fp8 is not None and isinstance(new, LoRALinear):
            new.quantize_weight_fp8_(fp8, activations=fp8_activations)
        model.set_submodule(name, new)
    return model


def _lora_pairs(lora: Mapping[str, torch.Tensor]) -> dict[str, tuple]:
    """path → (A [r, K], B [N, r], alpha or None) of every ``<path>.lora_A[.<adapter>].weight`` key."""
    pairs = {}
    for key in lora:
        # what the appended branch cannot express is refused, never dropped: DoRA's magnitudes, PEFT's lora_bias
        if "lora_magnitude_vector" in key:
            raise NotImplementedError(f"LoRA file: '{key}' is a DoRA magnitude; DoRA adapters are not supported")
        if ".lora_B" in key and key.endswith(".bias"):
            raise NotImplementedError(f"LoRA file: '{key}' is a lora_bias; adapters with lora_bias are not supported")
        hit = _LORA_KEY.match(key)
        if hit is None:
            continue
        path, adapter = hit["path"], hit["adapter"]
        b_key = f"{path}.lora_B.{adapter}.weight" if adapter else f"{path}.lora_B.weight"
        if b_key not in lora:
            raise ValueError(f"LoRA file: '{key}' has no matching '{b_key}'")
        if path in pairs:
            raise ValueError(f"LoRA file: more than one adapter for '{path}' (name one: keep only its keys)")
        alpha = lora.get(f"{path}.alpha")
        pairs[path] = (lora[key], lora[b_key], None if alpha is None else float(alpha))
    if not pairs:
        raise ValueError("LoRA file: no '<module>.lora_A.weight' keys (PEFT / diffusers names expected)")
    return pairs


def append_lora_weights_(model: nn.Module, lora: Mapping[str, torch.Tensor] | str | Path, *,
                         lora_alpha: float | None = None, use_rslora: bool = False, scale: float = 1.0,
                         prefix: str | None = None) -> list[str]:
    """Append a LoRA adapter file to the quantized layers of ``model`` (``SVDQLinear``: the adapter joins the fused
    low-rank branch, :meth:`~lowrank_gemm.nn.SVDQLinear.append_lora`; ``reset_lora()`` on a layer takes it off).

    ``lora``: tensors or a ``.safetensors`` path with PEFT / diffusers names, ``<path>.lora_A.weight`` [r, K] and
    ``<path>.lora_B.weight`` [N, r] (an adapter name between ``lora_A`` and ``weight`` is accepted). Scaling per
    layer: ``scale · alpha / r`` (``alpha / sqrt(r)`` with ``use_rslora``), alpha from a ``<path>.alpha`` tensor
    in the file, else ``lora_alpha`` (PEFT keeps it in adapter_config.json) — one of them is required, so a file
    is never applied with a guessed strength. ``prefix``: stripped from every path (default: the first of
    :data:`LORA_PREFIXES` under which every path names a module). Every layer is checked before any changes —
    the module exists, is an SVDQLinear (unquantized layers take PEFT itself, or :func:`fuse_lora_`), the shapes
    fit. Returns the module names, in the file's order."""
    from ..nn.multilora import peft_scaling
    from ..nn.svdq import SVDQLinear
    if not isinstance(lora, Mapping):
        import safetensors.torch
        lora = safetensors.torch.load_file(str(lora))
    pairs = _lora_pairs(lora)
    modules = dict(model.named_modules())
    candidates = (prefix,) if prefix is not None else LORA_PREFIXES
    chosen = next((p for p in candidates
                   if all(path.startswith(p) and path[len(p):] in modules for path in pairs)), None)
    if chosen is None:
        missing = sorted(path for path in pairs if not any(path.startswith(p) and path[len(p):] in modules
                                                              for p in candidates))[:5]
        raise ValueError(f"LoRA file: no module for {missing or sorted(pairs)[:5]} under the prefixes "
                         f"{list(candidates)}; pass prefix=")
    plan = []
    for path, (a, b, alpha) in pairs.items():
        name = path[len(chosen):]
        layer = modules[name]
        if not isinstance(layer, SVDQLinear):
            raise ValueError(f"LoRA file: '{name}' is a {type(layer).__name__}, not a quantized SVDQLinear (use PEFT, "
                             "or fuse_lora_ for unquantized layers)")
        r = a.shape[0] if a.dim() == 2 else -1
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != layer.in_features or b.shape != (layer.out_features, r):
            raise ValueError(f"LoRA file: '{name}' is [{layer.out_features}, {layer.in_features}]; got lora_A "
                             f"{list(a.shape)}, lora_B {list(b.shape)}")
        alpha = alpha if alpha is not None else lora_alpha
        if alpha is None:
            raise ValueError(f"LoRA file: no '{path}.alpha' in the file and no lora_alpha= given (PEFT's "
                             "adapter_config.json has it): the scaling alpha/r is unknown")
        plan.append((name, layer, a, b, scale * peft_scaling(alpha, r, use_rslora)))
    for _, layer, a, b, s in plan:
        layer.append_lora(a.to(layer.lora_down.device), b.to(layer.lora_up.device), s)
    return [name for name, *_ in plan]
