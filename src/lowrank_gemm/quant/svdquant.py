"""The SVDQuant algorithm for one linear layer (pure functions; the module lives in ``nn/svdq.py``).

Given W [N, K] and calibration stats of its input x:

1. Smoothing search: for every candidate λ (λ = 1, plus λ_k = max|x_k|^α / max|w_k|^(1-α) for each α in
   the grid), fold it in (X̂ = X / λ, Ŵ = W · diag(λ)), fit the rank-r SVD branch L = up·down of Ŵ,
   quantize the residual R = Ŵ − L, and measure the layer's output error on the calibration sample,
   ``‖Q_a(X̂)·Q(R)ᵀ + (X̂·downᵀ)·upᵀ − X·Wᵀ‖``. The best candidate wins. λ = 1 is always a candidate,
   so smoothing is never worse than none on calibration data.
2. Refit: L ← SVD_r(Ŵ − Q(Ŵ − L)) repeatedly, keeping the best state by output error, stopping after
   ``refit_patience`` steps without gain. The unrefit state is the first candidate, so refit never loses.

Everything a candidate is scored with is the stored, rounded tensor (16-bit λ, scales and factors), and
the score uses the same math as the module's forward (:func:`lowrank_output`), so the calibration error
reported here is the error the converted layer reproduces. Q and Q_a are the config's weight format's
(``weight_format``: int4_g64, or the two-level int4_2l with its two-level activations).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats.int4 import (act_shift_vector, dequantize_int4, pack_int4, quantize_act_int4, quantize_act_uint4,
                            quantize_weight_int4)
from ..formats.int4_twolevel import dequantize_act_2l, dequantize_weight_2l, quantize_act_2l, quantize_weight_2l
from .calibrate import ActivationStats
from .config import SVDQuantConfig

_EPS = 1e-5  # floor for absmax statistics: dead channels must not give λ = 0 or ∞


def fake_quant_act(xs: torch.Tensor, act_bits: int, group_size: int, scale_dtype: torch.dtype,
                   shift: torch.Tensor | None = None, weight_format: str = "int4_g64") -> torch.Tensor:
    """Activations as the W4A4 GEMM sees them: ``xs`` [M, K] → dequant(quant_int4(xs)) (float32).

    ``act_bits == 16`` returns ``xs`` unchanged (W4A16); ``act_bits == 8``: per-token e4m3 (W4A8,
    ``formats.fp8.quantize_act_e4m3``). ``shift`` (float32 [K], ``formats.int4.act_shift_vector``):
    unsigned activations, dequant(quant_uint4(xs + shift)) − shift. ``weight_format="int4_2l"``: the two-level
    activations (``formats.int4_twolevel.quantize_act_2l``), act_bits 4 or 16 only.
    """
    if act_bits == 16:
        return xs
    if weight_format == "int4_2l":
        if act_bits != 4 or shift is not None:
            raise ValueError(f"int4_2l layers quantize their activations in the two-level format (act_bits 4, or 16 "
                             f"for none) and take no act_shift; got act_bits={act_bits}, act_shift="
                             f"{'set' if shift is not None else None}")
        return dequantize_act_2l(*quantize_act_2l(xs, group_size)).to(xs.dtype)
    if act_bits == 8:
        from ..formats.fp8 import dequantize_act_e4m3, quantize_act_e4m3
        return dequantize_act_e4m3(*quantize_act_e4m3(xs)).to(xs.dtype)
    if shift is not None:
        q, scales = quantize_act_uint4(xs, shift, group_size, scale_dtype)
        return (dequantize_int4(q, scales, group_size) - shift.to(xs.device)).to(xs.dtype)
    q, scales = quantize_act_int4(xs, group_size, scale_dtype)
    return dequantize_int4(q, scales, group_size).to(xs.dtype)


def lowrank_output(
    xa: torch.Tensor, xs: torch.Tensor, w_deq: torch.Tensor, lora_down: torch.Tensor, lora_up: torch.Tensor
) -> torch.Tensor:
    """The SVDQuant layer without bias: ``xa @ w_deqᵀ + (xs @ lora_downᵀ) @ lora_upᵀ``.

    xa [M, K]: quantized smoothed input; xs [M, K]: smoothed input; w_deq [N, K]; lora_down [r, K];
    lora_up [N, r]. All in one float dtype; returns [M, N].
    """
    y = xa @ w_deq.t()
    if lora_down.shape[0]:
        y = y + (xs @ lora_down.t()) @ lora_up.t()
    return y


@dataclass
class SVDQuantResult:
    """What the search produced for one layer (tensors on the layer's device).

    qweight uint8 [N, K/2] (packed Q(R)); wscales [K/G, N] (int4_2l: fp32 [N], the row scales s); wmul None
    (int4_2l: uint8 [K/G, N], the group multipliers u); smooth [K]; lora_down [r, K]; lora_up [N, r] (16-bit);
    alpha: chosen α (None = no smoothing); calib_error: relative output error on the calibration sample (or
    relative weight error without calibration); refit_steps: refits run.
    """

    qweight: torch.Tensor
    wscales: torch.Tensor
    smooth: torch.Tensor
    lora_down: torch.Tensor
    lora_up: torch.Tensor
    alpha: float | None
    calib_error: float
    refit_steps: int
    wmul: torch.Tensor | None = None


@dataclass
class _State:
    """One scored candidate: λ16, factors, quantized residual (q, scales, multipliers) and its error."""

    alpha: float | None
    smooth: torch.Tensor
    down: torch.Tensor
    up: torch.Tensor
    q: torch.Tensor
    scales: torch.Tensor
    mul: torch.Tensor | None
    w_deq: torch.Tensor
    error: float


class _Objective:
    """Output error on the calibration sample (or weight error if there is none), per smoothing λ."""

    def __init__(self, w: torch.Tensor, x: torch.Tensor | None, config: SVDQuantConfig, group: int):
        self.w, self.x, self.config, self.group = w, x, config, group
        self.y = x @ w.t() if x is not None else None
        self.ref_norm = float(torch.linalg.vector_norm(self.y if x is not None else w)) or 1.0
        self._cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def _inputs(self, smooth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(xa, xs) for this λ, cached because refits reuse the same λ."""
        if self._cache is None or self._cache[0] is not smooth:
            xs = self.x / smooth.float()
            shift = act_shift_vector(self.config.act_shift, smooth).to(xs.device) if self.config.act_shift else None
            xa = fake_quant_act(xs, self.config.act_bits, self.group, self.config.torch_scale_dtype, shift,
                                self.config.weight_format)
            self._cache = (smooth, xa, xs)
        return self._cache[1], self._cache[2]

    def __call__(self, smooth: torch.Tensor, w_deq: torch.Tensor, down: torch.Tensor, up: torch.Tensor) -> float:
        if self.x is None:  # weight-space error; λ is 1 here
            diff = w_deq + up.float() @ down.float() - self.w
        else:
            xa, xs = self._inputs(smooth)
            diff = lowrank_output(xa, xs, w_deq, down.float(), up.float()) - self.y
        return float(torch.linalg.vector_norm(diff)) / self.ref_norm


def svdquant_weight(w: torch.Tensor, config: SVDQuantConfig, stats: ActivationStats | None) -> SVDQuantResult:
    """Run smoothing search, SVD and refit on ``w`` [N, K] (see module doc). ``stats`` may be None
    (no smoothing; the objective is then the weight reconstruction error)."""
    out_device = w.device
    device = torch.device("cuda") if torch.cuda.is_available() else w.device
    w = w.detach().to(device, torch.float32)
    n, k = w.shape
    if config.rank > min(n, k):
        raise ValueError(f"rank {config.rank} exceeds min(N, K) = {min(n, k)} for a [{n}, {k}] weight")
    x = stats.sample.to(device) if stats is not None and stats.sample.shape[0] else None
    if config.smooth and x is None:
        raise ValueError("smoothing needs calibration data (pass calib_data / calib_inputs, or smooth=False)")
    objective = _Objective(w, x, config, config.group_for(k))

    candidates = _smoothing_candidates(w, stats, config) if config.smooth else [(None, _ones(k, config, device))]
    best = min((_fit(w, alpha, smooth, None, config, objective) for alpha, smooth in candidates), key=lambda s: s.error)
    steps = 0
    if config.refit and config.rank > 0:
        best, steps = _refit(w, best, config, objective)
    return SVDQuantResult(
        qweight=pack_int4(best.q).to(out_device),
        wscales=best.scales.to(out_device),
        wmul=None if best.mul is None else best.mul.to(out_device),
        smooth=best.smooth.to(out_device),
        lora_down=best.down.to(out_device),
        lora_up=best.up.to(out_device),
        alpha=best.alpha,
        calib_error=best.error,
        refit_steps=steps,
    )


def _ones(k: int, config: SVDQuantConfig, device) -> torch.Tensor:
    return torch.ones(k, dtype=config.torch_scale_dtype, device=device)


def _smoothing_candidates(w: torch.Tensor, stats: ActivationStats, config: SVDQuantConfig):
    """[(α, λ16 [K])]: λ = 1 first, then one λ per α, normalized to geometric mean ~1 and rounded to 16 bits."""
    xmax = stats.absmax.to(w.device).clamp_min(_EPS)
    wmax = w.abs().amax(dim=0).clamp_min(_EPS)
    out = [(None, _ones(w.shape[1], config, w.device))]
    for alpha in config.alpha_grid:
        lam = xmax.pow(alpha) / wmax.pow(1.0 - alpha)
        lam = lam / (lam.max() * lam.min()).sqrt()  # scale-free; keeps λ and 1/λ in range for 16 bits
        out.append((alpha, lam.to(config.torch_scale_dtype)))
    return out


def _fit(w, alpha, smooth, residual_deq, config: SVDQuantConfig, objective: _Objective) -> _State:
    """Score one state: L = SVD_r(Ŵ − residual_deq) (residual_deq None → SVD_r(Ŵ)), R = Ŵ − L quantized."""
    w_hat = w * smooth.float()
    target = w_hat if residual_deq is None else w_hat - residual_deq
    down, up = _top_r_factors(target, config)
    residual = w_hat - up.float() @ down.float() if config.rank else w_hat
    q, scales, mul, w_deq = quantize_residual(residual, config, config.group_for(w.shape[1]))
    return _State(alpha, smooth, down, up, q, scales, mul, w_deq, objective(smooth, w_deq, down, up))


def quantize_residual(residual: torch.Tensor, config: SVDQuantConfig, group: int):
    """``residual`` [N, K] in the config's weight format → (q int8 [N, K], scales, multipliers or None, Q(R) float32):
    int4_g64 16-bit group scales [K/G, N]; int4_2l row scales fp32 [N] and group multipliers uint8 [K/G, N]."""
    if config.weight_format == "int4_2l":
        q, mul, scales = quantize_weight_2l(residual, group)
        return q, scales, mul, dequantize_weight_2l(q, mul, scales, group)
    q, scales = quantize_weight_int4(residual, group, config.torch_scale_dtype)
    return q, scales, None, dequantize_int4(q, scales, group)


def _refit(w, state: _State, config: SVDQuantConfig, objective: _Objective) -> tuple[_State, int]:
    """L ← SVD_r(Ŵ − Q(Ŵ − L)) until ``refit_patience`` steps bring no gain; returns the best state."""
    best, current, stale, steps = state, state, 0, 0
    for steps in range(1, config.refit_iters + 1):
        current = _fit(w, state.alpha, state.smooth, current.w_deq, config, objective)
        if current.error < best.error:
            best, stale = current, 0
        else:
            stale += 1
            if stale >= config.refit_patience:
                break
    return best, steps


def _top_r_factors(mat: torch.Tensor, config: SVDQuantConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-r factors of ``mat`` [N, K]: down [r, K] = √S·Vᵀ, up [N, r] = U·√S, rounded to 16 bits.

    ``torch.linalg.svd`` for small layers, ``torch.svd_lowrank`` (randomized) above the threshold.
    """
    n, k, r = *mat.shape, config.rank
    dtype = config.torch_lowrank_dtype
    if r == 0:
        return mat.new_zeros(0, k, dtype=dtype), mat.new_zeros(n, 0, dtype=dtype)
    if min(n, k) > config.svd_lowrank_threshold:
        # seeded inside fork_rng: deterministic results, and the caller's RNG stream is left alone
        with torch.random.fork_rng(devices=[mat.device] if mat.is_cuda else []):
            torch.manual_seed(0)
            u, s, v = torch.svd_lowrank(mat, q=min(r + 16, min(n, k)), niter=4)
        vh = v.t()
    else:
        u, s, vh = torch.linalg.svd(mat, full_matrices=False)
    root = s[:r].sqrt()
    # LAPACK returns column-major U/V: make the stored factors row-major so a reloaded module matches bit for bit
    return (root[:, None] * vh[:r]).to(dtype).contiguous(), (u[:, :r] * root).to(dtype).contiguous()
