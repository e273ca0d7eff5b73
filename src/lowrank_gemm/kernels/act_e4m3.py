"""The W4A8 layer's activation side (``act_bits=8``): per-token e4m3 codes of x/λ and the low-rank S.

    (q, t) = formats.fp8.quantize_act_e4m3(x / λ)      one launch (row_quant.fp8_rows with the λ divisor)
    S = (x / λ) · lora_downᵀ                          act_quant's S (split-TF32, ≈ fp32), when r > 0

S comes from act_quant, which also writes int4 codes nobody reads here: two reads of x where one would do. A fused
quantizer (row maximum and S in one pass, the codes in a second, as act_quant's int4_2l passes do) is the known next
step; benchmarks/NOTES.md (session 41) has what the two launches cost.
"""

from __future__ import annotations

import torch

from .act_quant import act_quant
from .row_quant import fp8_rows

__all__ = ["act_quant_e4m3"]


def act_quant_e4m3(x2: torch.Tensor, smooth: torch.Tensor, lora_down: torch.Tensor, group_size: int = 64,
                   scale_dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """x2 [M, K] (bf16/fp16), smooth [K], lora_down [r, K] → (q float8_e4m3fn [M, K], t float32 [M], S float32
    [M, r] or None when r = 0), bit-identical to ``formats.fp8.quantize_act_e4m3(x2.float() / smooth.float())``."""
    q, t = fp8_rows(x2, divisor=smooth)
    s = None
    if lora_down.shape[0]:
        s = act_quant(x2, smooth, lora_down, group_size, "int4_g64", scale_dtype)[2]
    return q, t, s
