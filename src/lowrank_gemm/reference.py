"""The spec: every op of the package written in plain PyTorch, computed in float64.

Tests compare kernels against these functions; they are deliberately simple and slow.
Layouts follow ``nn.Linear`` and PEFT: ``weight [N, K]``, ``lora_a [r, K]``, ``lora_b [N, r]``.
"""

from __future__ import annotations

import torch

__all__ = ["lora_linear_ref", "multi_lora_linear_ref", "lowrank_epilogue_ref", "w4a4_gemm_ref", "svdq_linear_ref"]


def _f64(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().to(torch.float64)


def lowrank_epilogue_ref(main: torch.Tensor, s: torch.Tensor | None, lora_b: torch.Tensor | None,
                         col_scale: torch.Tensor | None = None, row_scale: torch.Tensor | None = None,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """The shared epilogue, in float64.

    ``y = main ⊙ row_scale[:, None] ⊙ col_scale[None, :] + s · lora_bᵀ + bias``

    The scales dequantize the *main* product only (per-token × per-channel for W8A8); the
    low-rank term is already in output units, so it is added after them.
    main [M, N], s [M, r], lora_b [N, r], col_scale/bias [N], row_scale [M].
    """
    y = _f64(main)
    if row_scale is not None:
        y = y * _f64(row_scale)[:, None]
    if col_scale is not None:
        y = y * _f64(col_scale)[None, :]
    if s is not None and lora_b is not None and s.shape[-1] > 0:
        y = y + _f64(s) @ _f64(lora_b).T
    if bias is not None:
        y = y + _f64(bias)
    return y


def lora_linear_ref(x: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                    scale: float = 1.0, bias: torch.Tensor | None = None,
                    weight_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``y = x·(W·diag(weight_scale))ᵀ + scale·(x·Aᵀ)·Bᵀ + bias`` in float64.

    x [..., K], weight [N, K] (16-bit, or fp8 with ``weight_scale`` [N] or one value), lora_a [r, K],
    lora_b [N, r], bias [N] → y [..., N] (float64). The scale multiplies the main product only.
    """
    x64 = _f64(x).reshape(-1, x.shape[-1])
    s = (x64 @ _f64(lora_a).T) * float(scale)
    w = _f64(weight)
    if weight_scale is not None:
        w = w * _f64(weight_scale).reshape(-1, 1)
    y = lowrank_epilogue_ref(x64 @ w.T, s, lora_b, bias=bias)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def multi_lora_linear_ref(x: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                          adapter_ids: torch.Tensor, scales: torch.Tensor | None = None,
                          ranks: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row adapters, in float64.

    x [M, K], weight [N, K], lora_a [L, r_max, K], lora_b [L, N, r_max], adapter_ids [M] (−1 = base only),
    scales [L] (default 1), ranks [L] (default r_max: rank slots ≥ ranks[l] are ignored), bias [N].
    """
    x64 = _f64(x)
    y = x64 @ _f64(weight).T
    a64, b64 = _f64(lora_a), _f64(lora_b)
    for row, l in enumerate(adapter_ids.tolist()):
        if l < 0:
            continue
        r = int(ranks[l]) if ranks is not None else a64.shape[1]
        sc = float(scales[l]) if scales is not None else 1.0
        s = (x64[row] @ a64[l, :r].T) * sc
        y[row] += b64[l, :, :r] @ s
    if bias is not None:
        y = y + _f64(bias)
    return y


# ---- W4A4 (SVDQuant) ------------------------------------------------------------------------------

def w4a4_gemm_ref(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                  lowrank_act: torch.Tensor | None = None, lora_up: torch.Tensor | None = None,
                  bias: torch.Tensor | None = None, *, w_mul: torch.Tensor | None = None,
                  group_size: int = 64, fmt: str = "int4_g64") -> torch.Tensor:
    """The W4A4 GEMM on already-quantized operands, in float64 (same arguments as ``ops`` ``w4a4_gemm``).

    fmt ``int4_g64``: x_q uint8 [M, K/2] packed, x_scale [K/G, M], w_q uint8 [N, K/2], w_scale [K/G, N].
    fmt ``int4_2l``:  x_q int8 [M, K] (expanded q·v), x_scale [M], w_q uint8 [N, K/2], w_scale [N],
                      w_mul uint8 [K/G, N].
    fmt ``int4_g64`` with per-token e4m3 activations (W4A8, ``formats.fp8``): x_q float8_e4m3fn [M, K], x_scale
                      float32 [M].
    ``y = deq(x)·deq(w)ᵀ + s·lora_upᵀ + bias`` with ``s = lowrank_act`` [M, r] rounded to lora_up's
    dtype first, as the shared epilogue does (``kernels.epilogue.lowrank_up``).
    """
    from .formats.int4 import dequantize_int4, unpack_int4
    from .formats.int4_twolevel import dequantize_act_2l, dequantize_weight_2l
    if fmt == "int4_g64" and x_q.dtype == torch.float8_e4m3fn and x_scale.dim() == 1:
        from .formats.fp8 import dequantize_act_e4m3
        xa = dequantize_act_e4m3(x_q, x_scale, torch.float64)
        wd = dequantize_int4(unpack_int4(w_q), w_scale, group_size)
    elif fmt == "int4_g64":
        xa = dequantize_int4(unpack_int4(x_q), x_scale, group_size)
        wd = dequantize_int4(unpack_int4(w_q), w_scale, group_size)
    elif fmt == "int4_2l":
        xa = dequantize_act_2l(x_q, x_scale)
        wd = dequantize_weight_2l(w_q, w_mul, w_scale, group_size)
    else:
        raise ValueError(f"unknown fmt {fmt!r}")
    s = None
    if lowrank_act is not None and lora_up is not None and lowrank_act.shape[-1] > 0:
        s = lowrank_act.to(lora_up.dtype)
    return lowrank_epilogue_ref(_f64(xa) @ _f64(wd).T, s, lora_up, bias=bias)


def svdq_linear_ref(x: torch.Tensor, qweight: torch.Tensor, wscales: torch.Tensor, smooth: torch.Tensor,
                    lora_down: torch.Tensor, lora_up: torch.Tensor, bias: torch.Tensor | None = None,
                    group_size: int = 64, act_shift: torch.Tensor | None = None, act_bits: int = 4, *,
                    fmt: str = "int4_g64", wmul: torch.Tensor | None = None) -> torch.Tensor:
    """The SVDQuant W4A4 layer, in float64 (arguments as the op ``w4a4_linear``).

    x [..., K], qweight uint8 [N, K/2], wscales [K/G, N], smooth [K], lora_down [r, K] (applies to x/λ),
    lora_up [N, r], bias [N] → y [..., N]:
    ``xs = x/λ; (qa, sa) = quantize_act_int4(xs, G); y = (qa·sa)·(qw·sw)ᵀ + (xs·Aᵀ)·Bᵀ + bias``.
    ``act_shift`` (float32 [K], ``formats.int4.act_shift_vector``): unsigned activations,
    ``(qa, sa) = quantize_act_uint4(xs, act_shift, G)`` and the main product reads ``qa·sa − act_shift``.
    ``act_bits=8``: per-token e4m3 activations (W4A8), ``(q, t) = formats.fp8.quantize_act_e4m3(xs)``, the main
    product reads ``q·t``.
    ``fmt="int4_2l"`` (``formats.int4_twolevel``): wscales fp32 [N] (s), ``wmul`` uint8 [K/G, N] (u), activations
    ``(e, t) = quantize_act_2l(xs, G)`` (act_bits 4, no act_shift), the main product reads ``e·t``.
    """
    from .formats.int4 import dequantize_int4, quantize_act_int4, quantize_act_uint4, unpack_int4
    from .formats.int4_twolevel import dequantize_act_2l, dequantize_weight_2l, quantize_act_2l
    k = x.shape[-1]
    xs = _f64(x).reshape(-1, k) / _f64(smooth)
    if fmt not in ("int4_g64", "int4_2l"):
        raise ValueError(f"fmt must be 'int4_g64' or 'int4_2l', got {fmt!r}")
    if (fmt == "int4_2l") != (wmul is not None):
        raise ValueError(f"wmul (the group multipliers) comes with fmt='int4_2l' and only with it, got fmt={fmt!r}, "
                         f"wmul={'set' if wmul is not None else None}")
    if fmt == "int4_2l":
        if act_bits != 4 or act_shift is not None:
            raise ValueError(f"int4_2l runs two-level int4 activations (act_bits=4, no act_shift), got act_bits="
                             f"{act_bits}, act_shift={'set' if act_shift is not None else None}")
        xa = _f64(dequantize_act_2l(*quantize_act_2l(xs, group_size)))
    elif act_bits == 8:
        from .formats.fp8 import dequantize_act_e4m3, quantize_act_e4m3
        if act_shift is not None:
            raise ValueError("act_shift (unsigned int4 activations) has no meaning with act_bits=8")
        xa = dequantize_act_e4m3(*quantize_act_e4m3(xs), torch.float64)
    elif act_bits != 4:
        raise ValueError(f"act_bits must be 4 or 8, got {act_bits}")
    elif act_shift is None:
        xa = _f64(dequantize_int4(*quantize_act_int4(xs, group_size, wscales.dtype), group_size))
    else:
        qa, sa = quantize_act_uint4(xs, act_shift, group_size, wscales.dtype)
        xa = _f64(dequantize_int4(qa, sa, group_size)) - _f64(act_shift)
    if fmt == "int4_2l":
        wd = _f64(dequantize_weight_2l(qweight, wmul, wscales, group_size))
    else:
        wd = _f64(dequantize_int4(unpack_int4(qweight), wscales, group_size))
    y = xa @ wd.T
    if lora_down.shape[0]:
        y = y + (xs @ _f64(lora_down).T) @ _f64(lora_up).T
    if bias is not None:
        y = y + _f64(bias)
    return y.reshape(*x.shape[:-1], qweight.shape[0])
