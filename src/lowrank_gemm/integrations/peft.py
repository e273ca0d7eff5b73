"""PEFT glue: read a PEFT LoRA layer's branch, and swap PEFT LoRA layers for fused modules."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["is_peft_lora_linear", "peft_branch", "fuse_lora_"]


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


def fuse_lora_(model: nn.Module, *, strategy: str = "auto", pack: bool = False) -> nn.Module:
    """Replace, in place, every PEFT LoRA Linear in ``model`` by :class:`~lowrank_gemm.nn.LoRALinear`.

    Layers whose adapters are disabled become their plain base ``nn.Linear``. ``pack``: lay each layer's W and B
    out as one buffer (:meth:`LoRALinear.pack_`), where ``auto`` runs the ``kcat`` strategy at prefill sizes.
    Returns ``model``.
    """
    from ..nn.lora import LoRALinear
    targets = [(name, mod) for name, mod in model.named_modules() if is_peft_lora_linear(mod)]
    for name, mod in targets:
        new = LoRALinear.from_peft(mod, strategy=strategy)
        if pack and isinstance(new, LoRALinear):
            new.pack_()
        model.set_submodule(name, new)
    return model
