"""``LoRALinear``: an ``nn.Linear`` with one (unmerged) LoRA branch, run as one fused op.

    y = x·Wᵀ + scale·(x·Aᵀ)·Bᵀ + bias        W [N, K], A [r, K], B [N, r]  (PEFT layouts)

Inference module: there is no dropout and no autograd through the fused kernels.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LoRALinear"]


class LoRALinear(nn.Module):
    """Linear layer plus a low-rank branch, computed by :func:`lowrank_gemm.ops.lora_linear`.

    Parameters are frozen (``requires_grad=False``): ``weight [N, K]``, ``bias [N]`` or None,
    ``lora_a [r, K]``, ``lora_b [N, r]``; ``scale`` multiplies the branch (PEFT's ``alpha / r``,
    or ``alpha / sqrt(r)`` with rslora). ``strategy`` is passed to the op (``"auto"`` lets the planner pick).
    :meth:`quantize_weight_fp8_` stores W as fp8 with a per-output-channel scale (``weight_scale``): the kernels
    read half the bytes and widen W on chip; the branch and the bias stay 16-bit.
    """

    def __init__(self, in_features: int, out_features: int, rank: int, *, bias: bool = True,
                 scale: float = 1.0, strategy: str = "auto", device=None, dtype=None):
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRALinear needs rank ≥ 1, got {rank} (use nn.Linear for no branch)")
        kw = {"device": device, "dtype": dtype}
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **kw), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features, **kw), requires_grad=False) if bias else None
        self.lora_a = nn.Parameter(torch.empty(rank, in_features, **kw), requires_grad=False)
        self.lora_b = nn.Parameter(torch.empty(out_features, rank, **kw), requires_grad=False)
        self.scale = float(scale)
        self.strategy = strategy
        self.register_buffer("weight_scale", None)     # fp32 [N] once quantize_weight_fp8_ ran
        self.fp8_activations = 0

    @classmethod
    def from_linear(cls, linear: nn.Linear, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float = 1.0,
                    *, extra_bias: torch.Tensor | None = None, strategy: str = "auto") -> "LoRALinear":
        """Wrap ``linear`` (its weight and bias are shared, not copied) with the branch ``(lora_a, lora_b)``.

        lora_a [r, in_features], lora_b [out_features, r]; they are cast to the linear's dtype/device.
        ``extra_bias`` [out_features] is added to the linear's bias (PEFT's ``lora_bias``).
        """
        n, k = linear.weight.shape
        if lora_a.dim() != 2 or lora_b.dim() != 2:
            raise ValueError(f"lora_a and lora_b must be 2-D, got {tuple(lora_a.shape)} and {tuple(lora_b.shape)}")
        r = lora_a.shape[0]
        if lora_a.shape[1] != k or lora_b.shape != (n, r):
            raise ValueError(f"for a Linear({k} → {n}) expected lora_a [r, {k}] and lora_b [{n}, r]; "
                             f"got {tuple(lora_a.shape)} and {tuple(lora_b.shape)}")
        w = linear.weight
        from ..kernels.lora_gemm import FP8_WEIGHTS
        # an fp8 base (a tensor-parallel shard of a quantized layer; its scale is set after): the adapters and the
        # bias keep their 16-bit dtype
        dt = lora_a.dtype if w.dtype in FP8_WEIGHTS else w.dtype
        mod = cls.__new__(cls)
        nn.Module.__init__(mod)
        mod.in_features, mod.out_features, mod.rank = k, n, r
        mod.weight = nn.Parameter(w.detach(), requires_grad=False)
        bias = linear.bias.detach() if linear.bias is not None else None
        if extra_bias is not None:
            extra = extra_bias.detach().to(dt)
            bias = extra.clone() if bias is None else bias + extra
        mod.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        mod.lora_a = nn.Parameter(lora_a.detach().to(w.device, dt).contiguous(), requires_grad=False)
        mod.lora_b = nn.Parameter(lora_b.detach().to(w.device, dt).contiguous(), requires_grad=False)
        mod.scale, mod.strategy = float(scale), strategy
        mod.register_buffer("weight_scale", None)
        mod.fp8_activations = 0
        return mod

    @classmethod
    def from_peft(cls, layer: nn.Module, *, strategy: str = "auto") -> nn.Module:
        """Convert a PEFT ``lora.Linear`` (eval-mode semantics). See :func:`lowrank_gemm.integrations.peft.peft_branch`."""
        from ..integrations.peft import peft_branch
        base, lora_a, lora_b, scale, extra_bias = peft_branch(layer)
        if lora_a is None:
            return base
        return cls.from_linear(base, lora_a, lora_b, scale, extra_bias=extra_bias, strategy=strategy)

    def pack_(self) -> "LoRALinear":
        """Re-lay ``weight`` and ``lora_b`` as views of one ``[N, K + r_pad]`` buffer ``[W | B | 0]``
        (:func:`lowrank_gemm.kernels.lora_kcat.pack_lora_weights`): on it ``auto`` runs the ``kcat`` strategy at
        compute-bound sizes (M ≥ 1024, N ≥ 2·K: the base product by cuBLAS with the branch in its K), with no
        derived weight. Same values; W is copied into the new buffer (the old tensor is freed unless shared), plus
        N·r_pad zeros. ``.to()`` / ``.half()`` make separate tensors again: pack after moving. ``load_state_dict``
        and in-place writes keep the layout. Returns self."""
        from ..kernels.lora_kcat import pack_lora_weights
        wv, bv = pack_lora_weights(self.weight.detach(), self.lora_b.detach())
        self.weight = nn.Parameter(wv, requires_grad=False)
        self.lora_b = nn.Parameter(bv, requires_grad=False)
        return self

    @torch.no_grad()
    def quantize_weight_fp8_(self, dtype: torch.dtype = torch.float8_e4m3fn, *,
                             activations: bool | int = False) -> "LoRALinear":
        """Store W as ``dtype`` (e4m3 or e5m2) with a float32 scale per output channel, ``amax(|W[n]|) / fp8 max``
        (an all-zero row gets scale 1), so every row uses the format's whole range; x, the branch and the bias keep
        their dtype. The op then computes ``x·(W8·diag(scale))ᵀ + scale·(x·Aᵀ)·Bᵀ + bias``. ``activations`` (e4m3
        only): each call also quantizes x per token for the base product, an fp8 × fp8 product (the branch keeps the
        16-bit x): ``True`` one e4m3 term, ``2`` two (about 16-bit x's precision; ``lora_linear`` has the numbers). Refused on a packed layer (``pack_`` shares W's buffer with B) and on an fp8 layer
        already. Returns self."""
        check_fp8_request(self.weight, dtype, activations)
        if self.packed:
            raise ValueError("a packed LoRALinear (pack_) shares W's buffer with B; quantize before packing, or not")
        w8, scale = fp8_weight(self.weight, dtype)
        self.weight = nn.Parameter(w8, requires_grad=False)
        self.weight_scale = scale
        self.fp8_activations = int(activations)
        return self

    @property
    def packed(self) -> bool:
        from ..kernels.lora_kcat import packed_wcat
        return packed_wcat(self.weight, self.lora_b) is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ..ops import lora_linear
        return lora_linear(x, self.weight, self.lora_a, self.lora_b, self.scale, self.bias, self.strategy,
                           weight_scale=self.weight_scale, fp8_activations=self.fp8_activations)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
                f"scale={self.scale:g}, bias={self.bias is not None}, strategy={self.strategy!r}"
                + (", packed" if self.packed else "")
                + (f", weight={self.weight.dtype} per-channel scaled" if self.weight_scale is not None else "")
                + ({0: "", 1: ", fp8 activations", 2: ", fp8 activations in two terms"}[self.fp8_activations]))


def check_fp8_request(weight: torch.Tensor, dtype: torch.dtype, activations) -> None:
    """What ``quantize_weight_fp8_`` (single- and multi-adapter layers) refuses: another dtype than e4m3 / e5m2, a
    weight already fp8, ``activations`` not False / True / 2, fp8 activations with an e5m2 weight."""
    from ..kernels.lora_gemm import FP8_WEIGHTS
    if dtype not in FP8_WEIGHTS:
        raise ValueError(f"fp8 dtype must be one of {FP8_WEIGHTS}, got {dtype}")
    if weight.dtype in FP8_WEIGHTS:
        raise ValueError(f"the weight is already {weight.dtype}")
    if not isinstance(activations, int) or activations not in (0, 1, 2):
        raise ValueError(f"activations must be False, True or 2 (e4m3 terms of x), got {activations!r}")
    if activations and dtype != torch.float8_e4m3fn:
        raise ValueError(f"fp8 activations run the e4m3 × e4m3 product: dtype must be float8_e4m3fn, got {dtype}")


def fp8_weight(weight: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, float32 scale [N]) of W per output channel (``row_quant.fp8_rows``); refuses NaN / Inf weights."""
    from ..kernels.row_quant import fp8_rows
    w = weight.detach().float()
    if not bool(torch.isfinite(w).all()):
        raise ValueError("the weight holds NaN or Inf: no finite fp8 scale exists for those rows")
    return fp8_rows(w, dtype)
