"""SVDQuant W4A4 (and baseline) post-training quantization: calibration, search, ``quantize_``, checkpoints.

Exports resolve lazily (PEP 562) because ``nn/svdq.py`` imports the algorithm submodules of this package
while ``quant.api`` imports ``nn/svdq.py``; eager imports here would make that a cycle.
"""

from importlib import import_module

_EXPORTS = {
    "quantize_": "api",
    "register_quantize_module_handler": "api",
    "QuantizeSummary": "api",
    "SVDQuantConfig": "config",
    "W8A8Config": "config",
    "Scheme": "config",
    "scheme_config": "config",
    "config_from_dict": "config",
    "save_quantized": "checkpoint",
    "load_quantized": "checkpoint",
    "CheckpointError": "checkpoint",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
