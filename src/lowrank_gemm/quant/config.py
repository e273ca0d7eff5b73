"""Quantization configs: frozen, validated, versioned, JSON round-trippable (torchao style).

Two config types, each with its own module handler (see :mod:`lowrank_gemm.quant.api`):

- :class:`SVDQuantConfig`: 4-bit grouped weights with optional smoothing and a low-rank branch; covers the
  schemes ``svdquant``, ``w4a4_smooth`` (rank 0), ``w4a4_rtn`` (no smoothing, rank 0) and ``w4a16``
  (``act_bits=16``: activations stay in floating point).
- :class:`W8A8Config`: per-channel int8 weights and per-token int8 activations.

``scheme_config(name, **overrides)`` builds the named presets used by the accuracy table.
"""

from __future__ import annotations

import dataclasses
import math
import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

import torch

CONFIG_VERSION = 1
_SCALE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHT_FORMATS = ("int4_g64", "int4_2l")


class Scheme(str, Enum):
    """Named quantization schemes of the accuracy table."""

    W8A8 = "w8a8"
    """int8 weights (per output channel) × int8 activations (per token)."""
    W4A16 = "w4a16"
    """int4 g64 weights, activations kept in floating point; no smoothing, no low rank."""
    W4A4_RTN = "w4a4_rtn"
    """int4 g64 weights and activations, round to nearest: no smoothing, no low rank."""
    W4A4_SMOOTH = "w4a4_smooth"
    """int4 g64 W4A4 with the per-layer smoothing search, rank 0."""
    SVDQUANT = "svdquant"
    """W4A4 with smoothing search, a 16-bit rank-r SVD branch and the iterative refit."""


@dataclass(frozen=True)
class _BaseConfig:
    """Shared fields: which modules to convert and how to name the config in JSON.

    ``include`` / ``exclude`` are patterns on the module's qualified name: an fnmatch glob
    (``"encoder.layer.*"``), or a regular expression when prefixed with ``"re:"``
    (``"re:.*\\.(query|key)$"``). Empty ``include`` means every ``nn.Linear``.
    """

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    version: int = CONFIG_VERSION

    needs_calibration: ClassVar[bool] = False

    def __post_init__(self) -> None:
        for field in ("include", "exclude"):
            value = getattr(self, field)
            if isinstance(value, str) or not all(isinstance(p, str) for p in value):
                raise ValueError(f"{field} must be a tuple of pattern strings, got {value!r}")
            object.__setattr__(self, field, tuple(value))
        if self.version != CONFIG_VERSION:
            raise ValueError(f"config version {self.version} is not supported (this build reads {CONFIG_VERSION})")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["type"] = type(self).__name__
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


@dataclass(frozen=True)
class SVDQuantConfig(_BaseConfig):
    """4-bit grouped weights, optional 4-bit activations, smoothing and a low-rank branch.

    Fields:
        weight_bits: 4 (the only packed weight width).
        weight_format: "int4_g64" (SVDQuant standard: a 16-bit scale per group, ``formats.int4``) or "int4_2l"
            (the Hopper two-level format, ``formats.int4_twolevel``: an fp32 scale per output channel times a 4-bit
            multiplier per group, and activations in the same two-level form — group_size 64, act_bits 4 or 16, no
            act_shift). The search (smoothing, refit) scores the chosen format's quantizers.
        act_bits: 4 (W4A4, per-token-group activations), 8 (W4A8: per-token e4m3 activations, ``formats.fp8``; the
            weights stay int4_g64) or 16 (W4A16, activations not quantized).
        group_size: 64 (SVDQuant standard), 128, or 0 meaning per-channel (group = K).
        rank: rank of the 16-bit low-rank branch; 0 disables it.
        smooth: run the per-layer smoothing search (needs calibration data).
        alpha_grid: migration strengths α of λ_k = max|x_k|^α / max|w_k|^(1-α); "no smoothing"
            (λ = 1) is always tried as well, so smoothing never loses to none on calibration data.
        refit: iterate L = SVD_r(Ŵ − Q(Ŵ − L)), keep the best by output error.
        refit_iters / refit_patience: at most this many refits; stop after ``patience`` without gain.
        calib_rows: cap on calibration rows kept per layer for the output-error objective.
        scale_dtype / lowrank_dtype: "bfloat16" or "float16" for scales+smooth and for the factors.
        svd_lowrank_threshold: use ``torch.svd_lowrank`` when min(N, K) exceeds this.
        act_shift: 0 (signed int4 activations), or c > 0: unsigned int4 activations of x + c (``SVDQLinear``'s
            ``act_shift``), for layers whose inputs have a floor at −c — after GELU c = 0.171875 (Nunchaku's fc2
            scheme). Select those layers with ``include`` (e.g. ``("*.output.dense",)``, ``("*mlp.fc2",)``) in a
            ``quantize_`` call of their own. The search (smoothing, refit) scores the unsigned quantizer.
    """

    weight_bits: int = 4
    weight_format: str = "int4_g64"
    act_bits: int = 4
    group_size: int = 64
    rank: int = 32
    smooth: bool = True
    alpha_grid: tuple[float, ...] = (0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    refit: bool = True
    refit_iters: int = 16
    refit_patience: int = 2
    calib_rows: int = 2048
    scale_dtype: str = "bfloat16"
    lowrank_dtype: str = "bfloat16"
    svd_lowrank_threshold: int = 256
    act_shift: float = 0.0

    needs_calibration: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "alpha_grid", tuple(float(a) for a in self.alpha_grid))
        _require(self.weight_bits == 4, f"weight_bits must be 4, got {self.weight_bits}")
        _require(self.act_bits in (4, 8, 16), f"act_bits must be 4, 8 or 16, got {self.act_bits}")
        _require(self.group_size in (0, 64, 128), f"group_size must be 64, 128 or 0 (per-channel), got {self.group_size}")
        _require(self.rank >= 0, f"rank must be >= 0, got {self.rank}")
        _require(all(0.0 <= a <= 1.0 for a in self.alpha_grid), f"alpha_grid values must lie in [0, 1]: {self.alpha_grid}")
        _require(self.refit_iters >= 0 and self.refit_patience >= 1, "refit_iters >= 0 and refit_patience >= 1 required")
        _require(self.calib_rows > 0, f"calib_rows must be positive, got {self.calib_rows}")
        object.__setattr__(self, "act_shift", float(self.act_shift))
        _require(math.isfinite(self.act_shift) and self.act_shift >= 0,
                 f"act_shift must be a finite value ≥ 0, got {self.act_shift}")
        _require(self.act_shift == 0 or self.act_bits == 4,
                 f"act_shift (unsigned activations) needs act_bits=4, got act_bits={self.act_bits}")
        check_weight_format(self.weight_format, self.group_size, self.act_bits, self.act_shift)
        for field in ("scale_dtype", "lowrank_dtype"):
            _require(getattr(self, field) in _SCALE_DTYPES, f"{field} must be one of {sorted(_SCALE_DTYPES)}")

    def group_for(self, k: int) -> int:
        """The group size used on a layer with ``k`` input features (0 means per-channel)."""
        return self.group_size or k

    @property
    def torch_scale_dtype(self) -> torch.dtype:
        return _SCALE_DTYPES[self.scale_dtype]

    @property
    def torch_lowrank_dtype(self) -> torch.dtype:
        return _SCALE_DTYPES[self.lowrank_dtype]


@dataclass(frozen=True)
class W8A8Config(_BaseConfig):
    """Per-channel int8 weights × per-token int8 activations (dynamic), 16-bit scales."""

    scale_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(self.scale_dtype in _SCALE_DTYPES, f"scale_dtype must be one of {sorted(_SCALE_DTYPES)}")

    @property
    def torch_scale_dtype(self) -> torch.dtype:
        return _SCALE_DTYPES[self.scale_dtype]


CONFIG_TYPES: dict[str, type[_BaseConfig]] = {c.__name__: c for c in (SVDQuantConfig, W8A8Config)}


def config_from_dict(d: dict[str, Any]) -> _BaseConfig:
    """Inverse of ``config.to_dict()``; raises ValueError on an unknown type, field or version."""
    d = dict(d)
    cls = CONFIG_TYPES.get(d.pop("type", None))
    if cls is None:
        raise ValueError(f"unknown config type in {d!r}; known: {sorted(CONFIG_TYPES)}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
    for key in ("include", "exclude", "alpha_grid"):
        if key in d:
            d[key] = tuple(d[key])
    return cls(**d)


_SCHEMES: dict[Scheme, tuple[type[_BaseConfig], dict[str, Any]]] = {
    Scheme.W8A8: (W8A8Config, {}),
    Scheme.W4A16: (SVDQuantConfig, dict(act_bits=16, rank=0, smooth=False, refit=False)),
    Scheme.W4A4_RTN: (SVDQuantConfig, dict(rank=0, smooth=False, refit=False)),
    Scheme.W4A4_SMOOTH: (SVDQuantConfig, dict(rank=0, refit=False)),
    Scheme.SVDQUANT: (SVDQuantConfig, {}),
}


def scheme_config(name: str | Scheme, **overrides: Any) -> _BaseConfig:
    """The preset config of a named scheme (see :class:`Scheme`), with field overrides."""
    cls, fields = _SCHEMES[Scheme(name)]
    return cls(**{**fields, **overrides})


def check_weight_format(weight_format: str, group_size: int, act_bits: int, act_shift: float) -> None:
    """The weight format and what it allows (the config and ``SVDQLinear`` both ask): int4_2l takes group 64,
    act_bits 4 (its two-level activations) or 16, and no act_shift."""
    _require(weight_format in WEIGHT_FORMATS, f"weight_format must be one of {WEIGHT_FORMATS}, got {weight_format!r}")
    _require(weight_format == "int4_g64" or (group_size == 64 and act_bits in (4, 16) and not act_shift),
             f"an int4_2l layer takes group_size=64, act_bits 4 (its two-level activations) or 16, and no act_shift; "
             f"got group_size={group_size}, act_bits={act_bits}, act_shift={act_shift}")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
