"""``quantize_(model, config, calib_data)``: convert every eligible ``nn.Linear`` in place (torchao style).

The conversion of one layer is looked up in a handler registry keyed by the config type
(:func:`register_quantize_module_handler`). Layer selection: ``config.include`` / ``config.exclude``
patterns on the qualified name (fnmatch globs, or regexes prefixed with ``re:``) and an optional
``filter_fn(module, name) -> bool``.

Layers that cannot use the format are skipped, not failed: a K that is not a multiple of the group size
(or of the 64-wide packing block) leaves the layer as ``nn.Linear`` with a warning, and the returned
:class:`QuantizeSummary` lists it. Errors that mean the request is wrong (rank > min(N, K), an
unsupported weight dtype, NaN/Inf calibration data) raise ValueError/TypeError before any layer changes.
"""

from __future__ import annotations

import fnmatch
import re
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from torch import nn
from tqdm.auto import tqdm

from ..nn.svdq import SVDQLinear, W8A8Linear, check_linear
from .calibrate import ActivationStats, collect_activation_stats
from .config import SVDQuantConfig, W8A8Config, _BaseConfig

Handler = Callable[[nn.Linear, _BaseConfig, "ActivationStats | None", str], nn.Module]
_HANDLERS: dict[type, Handler] = {}


def register_quantize_module_handler(config_type: type) -> Callable[[Handler], Handler]:
    """Decorator: ``handler(linear, config, stats, name) -> nn.Module`` converts one layer for ``config_type``."""

    def wrap(handler: Handler) -> Handler:
        _HANDLERS[config_type] = handler
        return handler

    return wrap


@register_quantize_module_handler(SVDQuantConfig)
def _svdquant_handler(linear, config, stats, name):
    return SVDQLinear.from_linear(linear, config, stats, name=name)


@register_quantize_module_handler(W8A8Config)
def _w8a8_handler(linear, config, stats, name):
    return W8A8Linear.from_linear(linear, config, name=name)


@dataclass
class QuantizeSummary:
    """converted: names of converted layers; skipped: name → reason; seconds: wall time (incl. calibration)."""

    converted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def quantize_(model: nn.Module, config: _BaseConfig, calib_data: Iterable | None = None, *,
              filter_fn: Callable[[nn.Module, str], bool] | None = None, progress: bool = True) -> QuantizeSummary:
    """Replace eligible ``nn.Linear`` modules of ``model`` in place; returns a :class:`QuantizeSummary`.

    ``calib_data``: batches for :func:`~lowrank_gemm.quant.calibrate.collect_activation_stats`; needed
    when the config smooths, and used for the output-error objective of the low-rank refit.
    """
    start = time.perf_counter()
    handler = _HANDLERS.get(type(config))
    if handler is None:
        raise TypeError(f"no quantize handler registered for {type(config).__name__}")
    summary = QuantizeSummary()
    layers = _eligible_layers(model, config, filter_fn, summary)
    stats: dict[str, ActivationStats] = {}
    if isinstance(config, SVDQuantConfig) and (config.smooth or config.rank) and calib_data is not None and layers:
        stats = collect_activation_stats(model, layers, calib_data, config.calib_rows)
    elif isinstance(config, SVDQuantConfig) and config.smooth and layers:
        raise ValueError("this config smooths activations: pass calib_data (or use smooth=False)")
    for name, linear in tqdm(layers.items(), desc=f"quantize {type(config).__name__}", disable=not progress):
        model.set_submodule(name, handler(linear, config, stats.get(name), name))
        summary.converted.append(name)
    summary.seconds = time.perf_counter() - start
    return summary


def _eligible_layers(model, config, filter_fn, summary: QuantizeSummary) -> dict[str, nn.Linear]:
    """Selected plain nn.Linear layers, validated up front; format-incompatible ones go to ``summary.skipped``."""
    layers = {}
    for name, module in model.named_modules():
        if type(module) is not nn.Linear or not _selected(name, config):
            continue
        if filter_fn is not None and not filter_fn(module, name):
            continue
        check_linear(module)
        if isinstance(config, SVDQuantConfig):
            n, k = module.out_features, module.in_features
            group = config.group_for(k)
            if k % group or k % 64:
                reason = f"K={k} is not a multiple of group_size={group} (and of 64); left as nn.Linear"
                warnings.warn(f"quantize_: skipping '{name}': {reason}", stacklevel=3)
                summary.skipped[name] = reason
                continue
            if config.rank > min(n, k):
                raise ValueError(f"layer '{name}': rank {config.rank} exceeds min(N, K) = {min(n, k)}")
        layers[name] = module
    return layers


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], name) is not None
    return fnmatch.fnmatchcase(name, pattern)


def _selected(name: str, config: _BaseConfig) -> bool:
    included = not config.include or any(_matches(name, p) for p in config.include)
    return included and not any(_matches(name, p) for p in config.exclude)
