"""Many LoRA adapters behind one Linear: an adapter bank, per-token adapter ids, PEFT loading.

- :class:`AdapterBank`: ``bank_a [L, r_max, K]``, ``bank_b [L, N, r_max]``, ``ranks [L] int32``,
  ``scales [L] fp32`` as buffers that are only ever written in place, so adding, replacing or removing
  an adapter needs no recompile and no CUDA-graph recapture.
- :class:`AdapterIds`: the per-token id tensor (−1 = base only) shared by every layer of a model,
  plus, in segment mode, the row order sorting tokens by adapter (computed once per batch, on device).
- :class:`MultiLoRALinear`: ``nn.Linear`` + bank + shared ids → ``lowrank_gemm::multi_lora_linear``.
- :func:`multilora_from_peft`: swap a PEFT model's LoRA Linear layers (several adapters loaded with
  ``load_adapter(..., adapter_name=...)`` / ``add_adapter``) for MultiLoRALinear sharing one AdapterIds.
"""

from __future__ import annotations

import math
from typing import Mapping

import torch
from torch import nn

from lowrank_gemm.integrations.peft import is_peft_lora_linear
from lowrank_gemm.kernels.multilora_gemm import SEGMENT_MIN_M, auto_mode, multi_lora_linear, sort_rows

__all__ = ["AdapterBank", "AdapterIds", "MultiLoRALinear", "multilora_from_peft", "peft_scaling"]


def peft_scaling(alpha: float, r: int, use_rslora: bool = False) -> float:
    """PEFT's LoRA scaling: alpha / r, or alpha / sqrt(r) with rslora."""
    return alpha / math.sqrt(r) if use_rslora else alpha / r


class AdapterBank(nn.Module):
    """L adapter slots of one layer. Slot ``l`` holds ``A[l, :rank]`` [rank, K] and ``B[l, :, :rank]``
    [N, rank]; slots past the rank are zeroed (and the kernels ignore them anyway)."""

    def __init__(self, num_slots: int, r_max: int, in_features: int, out_features: int,
                 dtype=torch.bfloat16, device=None):
        super().__init__()
        self.r_max, self.in_features, self.out_features = r_max, in_features, out_features
        self.register_buffer("bank_a", torch.zeros(num_slots, r_max, in_features, dtype=dtype, device=device))
        self.register_buffer("bank_b", torch.zeros(num_slots, out_features, r_max, dtype=dtype, device=device))
        self.register_buffer("ranks", torch.zeros(num_slots, dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.zeros(num_slots, dtype=torch.float32, device=device))
        self.names: dict[int, str] = {}

    @property
    def num_slots(self) -> int:
        return self.bank_a.shape[0]

    def _slot(self, slot: int) -> int:
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"adapter slot must be in [0, {self.num_slots - 1}], got {slot}")
        return slot

    # set_adapter / remove_adapter keep bank_b zero past each adapter's rank (and bank_a too): the fused
    # kernel relies on it to skip masking B by rank. Write adapters through these methods; a bank_b edited
    # by hand with NaN/Inf past a rank would leak them into that adapter's rows.
    B_ZERO_PADDED = True

    @torch.no_grad()
    def set_adapter(self, slot: int, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float = 1.0,
                    name: str | None = None) -> None:
        """Write adapter (lora_a [r, K], lora_b [N, r], scale) into ``slot``, in place."""
        slot = self._slot(slot)
        r = lora_a.shape[0]
        if lora_a.dim() != 2 or lora_a.shape[1] != self.in_features:
            raise ValueError(f"lora_a must be [r, K={self.in_features}], got {tuple(lora_a.shape)}")
        if tuple(lora_b.shape) != (self.out_features, r):
            raise ValueError(f"lora_b must be [N={self.out_features}, r={r}], got {tuple(lora_b.shape)}")
        if r > self.r_max:
            raise ValueError(f"adapter rank {r} exceeds the bank's r_max={self.r_max}")
        self.bank_a[slot, :r].copy_(lora_a)
        self.bank_a[slot, r:].zero_()
        self.bank_b[slot, :, :r].copy_(lora_b)
        self.bank_b[slot, :, r:].zero_()
        self.ranks[slot].fill_(r)
        self.scales[slot].fill_(float(scale))
        self.names[slot] = name if name is not None else f"slot{slot}"

    @torch.no_grad()
    def remove(self, slot: int) -> None:
        """Empty ``slot`` (rank 0): rows still pointing at it get the base output."""
        slot = self._slot(slot)
        self.bank_a[slot].zero_()
        self.bank_b[slot].zero_()
        self.ranks[slot].fill_(0)
        self.scales[slot].fill_(0.0)
        self.names.pop(slot, None)


class AdapterIds:
    """Per-token adapter ids shared by the layers of a model (−1 = base only).

    ``set(ids)`` copies into the existing tensor when the shape matches (a captured CUDA graph keeps
    reading the same memory). Where a layer may run in segment mode (``mode="segment"``, or ``"auto"`` from
    ``SEGMENT_MIN_M`` rows: each layer then asks :func:`~lowrank_gemm.kernels.multilora_gemm.auto_mode` for its own
    N) it also refreshes the row order sorted by adapter, on device, once for all layers (one launch, ~2.5 µs).
    """

    def __init__(self, mode: str = "auto"):
        if mode not in ("gather", "segment", "auto"):
            raise ValueError(f"AdapterIds: mode must be 'gather', 'segment' or 'auto', got {mode!r}")
        self.mode = mode
        self.ids: torch.Tensor | None = None
        self.row_order: torch.Tensor | None = None
        self.max_adapters: int | None = None

    def set(self, ids: torch.Tensor, max_adapters: int | None = None) -> None:
        """``max_adapters``: the serving loop's own count of distinct adapters in the batch (it knows it
        without a device sync); it selects the kernel plan and, with ``mode="auto"``, the mode."""
        self.max_adapters = max_adapters
        ids = ids.reshape(-1).to(torch.int32)
        if self.ids is not None and self.ids.shape == ids.shape and self.ids.device == ids.device:
            self.ids.copy_(ids)
        else:
            self.ids = ids.clone()
            self.row_order = None
        if self.mode == "segment" or (self.mode == "auto" and self.ids.numel() >= SEGMENT_MIN_M):
            order = sort_rows(self.ids)
            if self.row_order is None:
                self.row_order = order
            else:
                self.row_order.copy_(order)


class MultiLoRALinear(nn.Module):
    """``y = x·Wᵀ + bias + scale[l]·(x·A[l]ᵀ)·B[l]ᵀ`` with ``l`` the token's adapter id.

    x [..., K] → y [..., N]; ids [numel(x)/K] from the shared :class:`AdapterIds` (or one id per
    sequence when x is [B, T, K] and ids is [B]).
    """

    def __init__(self, base: nn.Linear, bank: AdapterBank, ids: AdapterIds | None = None):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"MultiLoRALinear wraps an nn.Linear, got {type(base).__name__}")
        if (bank.in_features, bank.out_features) != (base.in_features, base.out_features):
            raise ValueError(f"bank is for [{bank.out_features}, {bank.in_features}], linear is "
                             f"[{base.out_features}, {base.in_features}]")
        self.base = base
        self.bank = bank
        self.adapter_ids = ids if ids is not None else AdapterIds()
        self.register_buffer("weight_scale", None)
        self.fp8_activations = 0

    @classmethod
    def from_linear(cls, linear: nn.Linear, num_slots: int, r_max: int, ids: AdapterIds | None = None):
        bank = AdapterBank(num_slots, r_max, linear.in_features, linear.out_features,
                           dtype=linear.weight.dtype, device=linear.weight.device)
        return cls(linear, bank, ids)

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def set_adapter_ids(self, ids: torch.Tensor, max_adapters: int | None = None) -> None:
        self.adapter_ids.set(ids, max_adapters)

    def load_peft_adapter(self, name: str, peft_state_or_model, slot: int) -> None:
        """Load one PEFT LoRA adapter into ``slot``.

        ``peft_state_or_model``: a PEFT ``lora.Linear`` layer holding adapter ``name``, or a mapping
        with ``lora_A.weight`` [r, K], ``lora_B.weight`` [N, r] (keys may carry a prefix and the
        ``.<name>`` PEFT inserts) and either ``scaling`` or ``lora_alpha`` (+ optional ``use_rslora``).
        """
        a, b, scale = _peft_adapter(name, peft_state_or_model)
        dev, dt = self.bank.bank_a.device, self.bank.bank_a.dtype
        self.bank.set_adapter(slot, a.to(dev, dt), b.to(dev, dt), scale, name=name)

    def quantize_weight_fp8_(self, dtype: torch.dtype = torch.float8_e4m3fn, *,
                             activations: bool | int = False) -> "MultiLoRALinear":
        """The base weight as ``dtype`` (e4m3 / e5m2) with a float32 scale per output channel, as
        ``LoRALinear.quantize_weight_fp8_`` does; ``activations`` (e4m3): x per token in one (``True``) or two (``2``)
        e4m3 terms for an fp8 × fp8 base product. The adapters, the bias and x keep their dtype. Returns self."""
        from .lora import check_fp8_request, fp8_weight
        check_fp8_request(self.base.weight, dtype, activations)
        w8, scale = fp8_weight(self.base.weight, dtype)
        self.base.weight = nn.Parameter(w8, requires_grad=False)
        self.weight_scale = scale
        self.fp8_activations = int(activations)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = self.adapter_ids.ids
        if ids is None:
            raise RuntimeError("MultiLoRALinear: call set_adapter_ids(ids) before forward")
        rows = x.numel() // x.shape[-1]
        order = self.adapter_ids.row_order
        if ids.numel() != rows and x.dim() == 3 and ids.numel() == x.shape[0]:
            ids = ids[:, None].expand(x.shape[0], x.shape[1]).reshape(-1)   # one id per sequence
            order = None
        mode = self.adapter_ids.mode
        if mode == "auto":
            hint = self.adapter_ids.max_adapters
            mode = auto_mode(rows, self.base.weight.shape[0], hint if hint is not None else self.bank.bank_a.shape[0])
        if mode != "segment":
            order = None
        # the bank itself, not its tensors: the op then knows B is zero past each rank (AdapterBank.B_ZERO_PADDED)
        # and skips the rank masks on B's loads
        return multi_lora_linear(x, self.base.weight, self.bank, adapter_ids=ids, bias=self.base.bias, mode=mode,
                                 row_order=order, max_adapters=self.adapter_ids.max_adapters,
                                 weight_scale=self.weight_scale, fp8_activations=self.fp8_activations)

    def extra_repr(self) -> str:
        fp8 = "" if self.weight_scale is None else (f", weight={self.base.weight.dtype} per-channel scale"
                                                    + {0: "", 1: ", fp8 activations",
                                                       2: ", fp8 activations in two terms"}[self.fp8_activations])
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"slots={self.bank.num_slots}, r_max={self.bank.r_max}{fp8}")


def _peft_adapter(name: str, src) -> tuple[torch.Tensor, torch.Tensor, float]:
    if isinstance(src, nn.Module):
        if not is_peft_lora_linear(src):
            raise TypeError(f"expected a peft.tuners.lora.Linear, got {type(src).__name__}")
        if name not in src.lora_A:
            raise KeyError(f"PEFT layer has no adapter {name!r} (has {list(src.lora_A.keys())})")
        if name in getattr(src, "lora_variant", {}) or getattr(src, "use_dora", {}).get(name, False):
            raise NotImplementedError(f"adapter {name!r} is a LoRA variant (e.g. DoRA): not supported")
        if getattr(src.lora_B[name], "bias", None) is not None:
            raise NotImplementedError(f"adapter {name!r} has lora_bias: not supported by multi-LoRA")
        return (src.lora_A[name].weight.detach(), src.lora_B[name].weight.detach(), float(src.scaling[name]))
    if not isinstance(src, Mapping):
        raise TypeError(f"expected a PEFT lora.Linear or a state mapping, got {type(src).__name__}")

    def find(suffix):
        hits = [k for k in src if k.endswith(suffix) or k.endswith(suffix.replace(".weight", f".{name}.weight"))]
        if len(hits) != 1:
            raise KeyError(f"expected exactly one key ending in {suffix!r} for adapter {name!r}, got {hits}")
        return src[hits[0]]

    a, b = find("lora_A.weight"), find("lora_B.weight")
    if "scaling" in src:
        scale = float(src["scaling"])
    elif "lora_alpha" in src:
        scale = peft_scaling(float(src["lora_alpha"]), a.shape[0], bool(src.get("use_rslora", False)))
    else:
        raise KeyError("state needs 'scaling' or 'lora_alpha' (PEFT's alpha; scaling = alpha/r or alpha/sqrt(r))")
    return a, b, scale


def multilora_from_peft(model: nn.Module, adapters: list[str] | None = None, *, r_max: int | None = None,
                        mode: str = "auto") -> tuple[AdapterIds, dict[str, int]]:
    """Replace, in place, each PEFT LoRA Linear of ``model`` by a :class:`MultiLoRALinear` holding all
    its adapters (slot ``i`` = ``adapters[i]``, default: every adapter PEFT has, in load order).

    Returns the shared :class:`AdapterIds` (set it per batch: ``ids.set(per_token_ids)``) and the
    name → slot map. DoRA/variants, lora_bias, merged layers and non-Linear bases are refused.
    """
    targets = [(n, m) for n, m in model.named_modules() if is_peft_lora_linear(m)]
    if not targets:
        raise ValueError("model has no PEFT LoRA Linear layers")
    if adapters is None:
        adapters = []
        for _, m in targets:
            adapters += [a for a in m.lora_A.keys() if a not in adapters]
    slots = {a: i for i, a in enumerate(adapters)}
    ids = AdapterIds(mode)
    for name, m in targets:
        base = m.get_base_layer()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"{name}: PEFT layer wraps {type(base).__name__}; only nn.Linear is supported")
        if m.merged:
            raise ValueError(f"{name}: adapters are merged into the base; unmerge first")
        present = [a for a in adapters if a in m.lora_A]
        rmax = r_max or max([m.lora_A[a].weight.shape[0] for a in present] + [1])
        mod = MultiLoRALinear.from_linear(base, len(adapters), rmax, ids)
        for a in present:
            mod.load_peft_adapter(a, m, slots[a])
        model.set_submodule(name, mod)
    return ids, slots
