"""Quantized linear modules: ``SVDQLinear`` (W4A4/W4A16 + smoothing + low-rank branch) and ``W8A8Linear``.

The forward here is the reference path: pure torch, dequantize and matmul, the same math as
``reference.svdq_linear_ref`` (computed in float32, or float64 for float64 inputs):

    xs = x / smooth
    y  = dequant(quant_act_int4(xs)) @ dequant(qweight)ᵀ + (xs @ lora_downᵀ) @ lora_upᵀ + bias

in the layer's weight format: the SVDQuant-standard int4_g64, or the Hopper two-level int4_2l (weights and
activations both two-level, ``formats.int4_twolevel``).

A CUDA kernel path is installed by setting ``self._forward_kernel`` (see :meth:`SVDQLinear._use_kernels`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..formats.int4 import act_shift_vector, dequantize_int4, unpack_int4
from ..formats.int4_twolevel import dequantize_weight_2l
from ..formats.int8 import dequantize_rows_int8, quantize_rows_int8
from ..quant.calibrate import ActivationStats
from ..quant.config import SVDQuantConfig, W8A8Config, check_weight_format
from ..quant.svdquant import fake_quant_act, lowrank_output, svdquant_weight

_LINEAR_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def svdq_stored_bytes(out_features: int, in_features: int, rank: int, group_size: int,
                      scale_bytes: int = 2, lowrank_bytes: int = 2, weight_format: str = "int4_g64") -> int:
    """Bytes an SVDQLinear stores for its weight: packed int4 + scales + smooth + low-rank factors (no bias).
    int4_2l: an fp32 row scale per output channel and a uint8 multiplier per group instead of the group scales."""
    n, k = out_features, in_features
    scales = n * 4 + (k // group_size) * n if weight_format == "int4_2l" else (k // group_size) * n * scale_bytes
    return n * k // 2 + scales + k * scale_bytes + rank * (n + k) * lowrank_bytes


def check_linear(linear: nn.Module) -> None:
    """Raise a clear error unless ``linear`` is an nn.Linear with a supported float weight dtype."""
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"expected nn.Linear, got {type(linear).__name__}")
    if linear.weight.dtype not in _LINEAR_DTYPES:
        raise TypeError(f"unsupported weight dtype {linear.weight.dtype}; supported: {_LINEAR_DTYPES}")


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class SVDQLinear(nn.Module):
    """SVDQuant linear layer, ``y = x Wᵀ + b`` with W stored as smoothed int4 + 16-bit low rank.

    Buffers:
        qweight   uint8 [N, K/2]  packed Q(R), R = W·diag(smooth) − lora_up·lora_down (``formats.int4`` layout)
        wscales   [K/G, N]        16-bit group scales (group-major); int4_2l: float32 [N], the row scales s
        wmul      None            int4_2l: uint8 [K/G, N], the group multipliers u (``formats.int4_twolevel``)
        smooth    [K]             16-bit smoothing λ; the input is divided by it (1 = no smoothing)
        lora_down [r, K]          16-bit, applies to the SMOOTHED input x / λ
        lora_up   [N, r]          16-bit
        bias      [N] or None     the original bias, original dtype
    Attributes: in_features (K), out_features (N), group_size (G), rank (r), weight_format ("int4_g64" or "int4_2l",
    whose activations are two-level too: act_bits 4 or 16, no act_shift), act_bits (4, 8 or 16: int4 per-group,
    per-token e4m3 — ``formats.fp8``, W4A8, the same weights — or unquantized activations; may be set on a built
    layer), config,
    act_shift (0: signed int4 activations; c > 0: unsigned int4 of x + c, for inputs ≥ −c such as GELU outputs —
    ``formats.int4.quantize_act_uint4``; the branch and the bias see the plain x).

    Layers whose K is not a multiple of G are not converted by ``quantize_`` (skipped with a warning);
    :meth:`from_linear` raises ValueError for them, and for rank > min(N, K) or NaN/Inf calibration data.
    """

    def __init__(self, in_features: int, out_features: int, rank: int, group_size: int, bias: bool = True,
                 act_bits: int = 4, scale_dtype: torch.dtype = torch.bfloat16,
                 lowrank_dtype: torch.dtype = torch.bfloat16, bias_dtype: torch.dtype = torch.float32,
                 config: SVDQuantConfig | None = None, act_shift: float = 0.0, weight_format: str = "int4_g64"):
        super().__init__()
        if in_features % group_size or in_features % 64:
            raise ValueError(f"in_features={in_features} must be a multiple of group_size={group_size} and of 64")
        act_shift = float(act_shift)
        if act_bits not in (4, 8, 16):
            raise ValueError(f"act_bits must be 4, 8 or 16, got {act_bits}")
        if not (math.isfinite(act_shift) and act_shift >= 0) or (act_shift and act_bits != 4):
            raise ValueError(f"act_shift must be a finite value ≥ 0 (and 0 unless act_bits=4), got {act_shift} with "
                             f"act_bits={act_bits}")
        check_weight_format(weight_format, group_size, act_bits, act_shift)
        self.weight_format = weight_format
        self.act_shift = act_shift
        self._shift_cache = None
        self.in_features, self.out_features = in_features, out_features
        self.rank, self.group_size, self.act_bits = rank, group_size, act_bits
        self.base_rank = rank        # the quantizer's own branch; append_lora grows ``rank`` past it
        self.config = config
        n, k = out_features, in_features
        self.register_buffer("qweight", torch.zeros(n, k // 2, dtype=torch.uint8))
        if weight_format == "int4_2l":
            self.register_buffer("wscales", torch.ones(n, dtype=torch.float32))
            self.register_buffer("wmul", torch.ones(k // group_size, n, dtype=torch.uint8))
        else:
            self.register_buffer("wscales", torch.ones(k // group_size, n, dtype=scale_dtype))
            self.register_buffer("wmul", None)
        self.register_buffer("smooth", torch.ones(k, dtype=scale_dtype))
        self.register_buffer("lora_down", torch.zeros(rank, k, dtype=lowrank_dtype))
        self.register_buffer("lora_up", torch.zeros(n, rank, dtype=lowrank_dtype))
        self.register_buffer("bias", torch.zeros(n, dtype=bias_dtype) if bias else None)
        # CUDA path: None means the package's W4A4 kernels (kernels/w4a4_gemm.svdq_forward_cuda);
        # set a callable ``fn(layer, x)`` to override, or ``use_kernels = False`` to force the reference.
        self._forward_kernel = None
        self.use_kernels = True

    @classmethod
    def from_linear(cls, linear: nn.Linear, config: SVDQuantConfig,
                    calib_inputs: torch.Tensor | ActivationStats | None = None, name: str = "linear") -> "SVDQLinear":
        """Quantize ``linear`` with SVDQuant. ``calib_inputs``: inputs [..., K] or collected stats."""
        check_linear(linear)
        k, group = linear.in_features, config.group_for(linear.in_features)
        if k % group or k % 64:
            raise ValueError(f"layer '{name}': K={k} is not a multiple of group_size={group} (and of 64)")
        stats = calib_inputs
        if isinstance(calib_inputs, torch.Tensor):
            stats = ActivationStats.from_tensor(name, calib_inputs, config.calib_rows)
        try:
            res = svdquant_weight(linear.weight, config, stats)
        except ValueError as err:
            raise ValueError(f"layer '{name}': {err}") from None
        has_bias = linear.bias is not None
        mod = cls(k, linear.out_features, config.rank, group, has_bias, config.act_bits,
                  config.torch_scale_dtype, config.torch_lowrank_dtype,
                  linear.bias.dtype if has_bias else torch.float32, config, act_shift=config.act_shift,
                  weight_format=config.weight_format)
        for buf in ("qweight", "wscales", "wmul", "smooth", "lora_down", "lora_up"):
            setattr(mod, buf, getattr(res, buf))
        if has_bias:
            mod.bias = linear.bias.detach().clone()
        mod.calib_error, mod.alpha = res.calib_error, res.alpha
        return mod.to(linear.weight.device)        # (.to refreshes the act_shift state: _apply)

    def _use_kernels(self, x: torch.Tensor) -> bool:
        """The fused W4A4 kernels run on CUDA inputs; everything else takes the reference path."""
        return x.is_cuda and getattr(self, "use_kernels", True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._use_kernels(x):
            fn = self._forward_kernel
            if fn is None:
                from ..kernels.w4a4_gemm import svdq_forward_cuda as fn
            return fn(self, x)
        return self.forward_reference(x)

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        """Dequantize-and-matmul path ``x`` [..., K] → [..., N], computed in float32 (float64 for float64 x)."""
        dt = _compute_dtype(x)
        x2 = x.reshape(-1, self.in_features).to(dt)
        xs = x2 / self.smooth.to(dt)
        xa = fake_quant_act(xs, self.act_bits, self.group_size, self.wscales.dtype, self.act_shift_vec(),
                            self.weight_format)
        y = lowrank_output(xa, xs, self.dequantized_weight().to(dt), self.lora_down.to(dt), self.lora_up.to(dt))
        if self.bias is not None:
            y = y + self.bias.to(dt)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def act_shift_vec(self) -> torch.Tensor | None:
        """float32 [K] = RN(act_shift / λ) (``formats.int4.act_shift_vector``), or None for signed activations."""
        if not self.act_shift:
            return None
        return self._shift_state()[1]

    def kernel_bias(self) -> torch.Tensor | None:
        """The bias the W4A4 kernels add: ``bias`` itself, or with ``act_shift`` float32 ``bias − Q(W)·shift`` (the
        main product reads x/λ + shift; the fold takes the shift's share back out, computed once in float64)."""
        if not self.act_shift:
            return self.bias
        return self._shift_state()[2]

    def _shift_state(self):
        """(key, shift vector, kernel bias), recomputed in eager mode whenever qweight / wscales / smooth / bias
        changed (storage or version). Under torch.compile the stored pair is used as it is: the module refreshes it
        itself after from_linear, load_state_dict and .to(); after assigning buffers by hand, call
        :meth:`refresh_act_shift` before compiling."""
        if torch.compiler.is_compiling() and self._shift_cache is not None:
            return self._shift_cache
        if self._shift_cache is None or self._shift_cache[0] != self._shift_key():
            self.refresh_act_shift()
        return self._shift_cache

    def _shift_key(self):
        bufs = (self.qweight, self.wscales, self.smooth) + ((self.bias, ) if self.bias is not None else ())
        return tuple((t.data_ptr(), t._version, t.device) for t in bufs) + (self.act_shift, )

    @torch.no_grad()
    def refresh_act_shift(self) -> None:
        """Recompute the shift vector and the kernel bias from the current buffers (no-op without act_shift)."""
        if not self.act_shift:
            self._shift_cache = None
            return
        shift = act_shift_vector(self.act_shift, self.smooth)
        fold = torch.empty(self.out_features, dtype=torch.float64, device=self.qweight.device)
        for n0 in range(0, self.out_features, 4096):     # the dequantized weight in slices of rows
            sl = slice(n0, min(n0 + 4096, self.out_features))
            w = dequantize_int4(unpack_int4(self.qweight[sl]), self.wscales[:, sl], self.group_size)
            fold[sl] = w.double() @ shift.double()
        base = self.bias.double() if self.bias is not None else torch.zeros_like(fold)
        self._shift_cache = (self._shift_key(), shift, (base - fold).float())

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self.refresh_act_shift()

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        if self.act_shift:
            self.refresh_act_shift()
        return out

    def dequantized_weight(self) -> torch.Tensor:
        """Q(R) as float32 [N, K] (smoothing folded in, low-rank branch not included)."""
        if self.weight_format == "int4_2l":
            return dequantize_weight_2l(self.qweight, self.wmul, self.wscales, self.group_size)
        return dequantize_int4(unpack_int4(self.qweight), self.wscales, self.group_size)

    @torch.no_grad()
    def append_lora(self, lora_A: torch.Tensor, lora_B: torch.Tensor, scale: float = 1.0) -> None:
        """Concatenate a user LoRA onto the low-rank branch: ``y += scale · (x A₂ᵀ) B₂ᵀ``.

        lora_A [r2, K] applies to the raw input; the branch sees x / λ, so lora_A·diag(λ) is stored.
        lora_B [N, r2] is stored times ``scale``. The rank grows by r2; nothing is re-quantized. The factor
        tensors are replaced (not written in place): recapture CUDA graphs that hold the old ones.
        :meth:`reset_lora` drops every appended adapter.
        """
        r2 = lora_A.shape[0]
        if lora_A.shape != (r2, self.in_features) or lora_B.shape != (self.out_features, r2):
            raise ValueError(f"append_lora expects A [r, {self.in_features}] and B [{self.out_features}, r], "
                             f"got {list(lora_A.shape)} and {list(lora_B.shape)}")
        down = (lora_A.float() * self.smooth.float()).to(self.lora_down.dtype)
        up = (lora_B.float() * scale).to(self.lora_up.dtype)
        self.lora_down = torch.cat([self.lora_down, down.to(self.lora_down.device)])
        self.lora_up = torch.cat([self.lora_up, up.to(self.lora_up.device)], dim=1)
        self.rank += r2

    @torch.no_grad()
    def reset_lora(self) -> None:
        """Drop every adapter :meth:`append_lora` added: the branch goes back to the quantizer's ``base_rank``
        columns, bit for bit. (A checkpoint saved with appended adapters records them as part of the base.)"""
        r = self.base_rank
        self.lora_down = self.lora_down[:r].clone()
        self.lora_up = self.lora_up[:, :r].clone()
        self.rank = r

    def stored_bytes(self) -> int:
        """Bytes of the weight representation: qweight + wscales (+ wmul) + smooth + lora_down + lora_up (no bias)."""
        return sum(t.numel() * t.element_size()
                   for t in (self.qweight, self.wscales, self.wmul, self.smooth, self.lora_down, self.lora_up)
                   if t is not None)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
                f"group_size={self.group_size}, act_bits={self.act_bits}, bias={self.bias is not None}"
                + (f", weight_format={self.weight_format}" if self.weight_format != "int4_g64" else "")
                + (f", act_shift={self.act_shift}" if self.act_shift else ""))


class W8A8Linear(nn.Module):
    """int8 per-channel weights × int8 per-token activations (dynamic), reference forward.

    Buffers: qweight int8 [N, K]; wscales [N] 16-bit; bias [N] or None.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 scale_dtype: torch.dtype = torch.bfloat16, bias_dtype: torch.dtype = torch.float32,
                 config: W8A8Config | None = None):
        super().__init__()
        self.in_features, self.out_features, self.config = in_features, out_features, config
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("wscales", torch.ones(out_features, dtype=scale_dtype))
        self.register_buffer("bias", torch.zeros(out_features, dtype=bias_dtype) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, config: W8A8Config, calib_inputs=None, name: str = "linear"):
        check_linear(linear)
        has_bias = linear.bias is not None
        mod = cls(linear.in_features, linear.out_features, has_bias, config.torch_scale_dtype,
                  linear.bias.dtype if has_bias else torch.float32, config)
        mod.qweight, mod.wscales = quantize_rows_int8(linear.weight.detach(), config.torch_scale_dtype)
        if has_bias:
            mod.bias = linear.bias.detach().clone()
        return mod.to(linear.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = _compute_dtype(x)
        x2 = x.reshape(-1, self.in_features).to(dt)
        xa = dequantize_rows_int8(*quantize_rows_int8(x2, self.wscales.dtype)).to(dt)
        y = xa @ dequantize_rows_int8(self.qweight, self.wscales).to(dt).t()
        if self.bias is not None:
            y = y + self.bias.to(dt)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def stored_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.wscales))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
