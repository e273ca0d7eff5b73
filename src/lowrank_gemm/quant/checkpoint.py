"""Quantized checkpoints in safetensors: ``save_quantized(model, path)`` / ``load_quantized(path, skeleton)``.

File = the quantized model's full ``state_dict`` plus string metadata:

- ``format`` = ``"lowrank_gemm.quantized"``, ``format_version`` = ``"3"`` (version 2 added the unsigned
  activations, ``act_shift``, which a version-1 reader would drop; version 3 the two-level weight format,
  ``weight_format`` = ``"int4_2l"``, whose layers a version-2 reader would rebuild as int4_g64 ones; older files
  still load: version-1 layers as signed, version-1 and -2 layers as int4_g64);
- ``config``: JSON of the quantization config (the first converted layer's; ``modules`` has each one's);
- ``modules``: JSON ``{name: {"class", "in_features", "out_features", "rank", "group_size", "act_bits",
  "bias", "config"}}`` describing every quantized layer (version 2: SVDQLinear entries add ``"act_shift"``;
  version 3: ``"weight_format"`` where it is not int4_g64);
- ``checksums``: JSON ``{tensor name: sha256 of its raw bytes}``.

Loading validates everything (header, version, checksums, every module against the skeleton, every tensor
name, shape and dtype) before it touches the model; any problem raises :class:`CheckpointError` and the
skeleton is left unchanged.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from pathlib import Path

import safetensors.torch
import torch
from torch import nn

from ..nn.svdq import SVDQLinear, W8A8Linear
from .config import _BaseConfig, config_from_dict

FORMAT = "lowrank_gemm.quantized"
FORMAT_VERSION = 3
READ_VERSIONS = ("1", "2", "3")


class CheckpointError(ValueError):
    """A checkpoint is corrupted, truncated, of another version, or does not match the model."""


def save_quantized(model: nn.Module, path: str | Path) -> None:
    """Write ``model`` (after ``quantize_``) to ``path`` as safetensors with version, config and checksums."""
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    modules = {name: _describe(m) for name, m in model.named_modules() if isinstance(m, _QUANTIZED)}
    first_config = next((d["config"] for d in modules.values()), None)
    metadata = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "config": json.dumps(first_config, sort_keys=True),
        "modules": json.dumps(modules, sort_keys=True),
        "checksums": json.dumps({k: _sha256(t) for k, t in tensors.items()}, sort_keys=True),
    }
    safetensors.torch.save_file(tensors, str(path), metadata=metadata)


def load_quantized(path: str | Path, model_skeleton_or_factory: nn.Module | Callable[[], nn.Module]) -> nn.Module:
    """Rebuild a quantized model: swap the recorded layers of the (unquantized) skeleton for empty
    quantized modules and load every tensor. Returns the model; raises CheckpointError before any change."""
    data = _read(path)
    metadata = _read_metadata(data)
    try:
        tensors = safetensors.torch.load(data)
    except Exception as err:  # safetensors raises its own error type for malformed data
        raise CheckpointError(f"{path}: cannot decode tensors ({err})") from None
    _verify_checksums(tensors, metadata)
    model = model_skeleton_or_factory if isinstance(model_skeleton_or_factory, nn.Module) else model_skeleton_or_factory()
    replacements = _build_replacements(model, metadata["modules"])
    _verify_tensors(model, replacements, tensors)
    for name, module in replacements.items():
        model.set_submodule(name, module)
    model.load_state_dict(tensors, strict=True)
    return model


# --- describing and rebuilding quantized modules -------------------------------------------------------

_QUANTIZED = (SVDQLinear, W8A8Linear)


def _describe(m: nn.Module) -> dict:
    desc = {"class": type(m).__name__, "in_features": m.in_features, "out_features": m.out_features,
            "bias": m.bias is not None, "config": m.config.to_dict() if m.config is not None else None}
    if isinstance(m, SVDQLinear):
        desc.update(rank=m.rank, group_size=m.group_size, act_bits=m.act_bits)
        if m.act_shift:
            desc["act_shift"] = m.act_shift
        if m.weight_format != "int4_g64":
            desc["weight_format"] = m.weight_format
    return desc


def _empty_module(desc: dict, linear: nn.Linear) -> nn.Module:
    """An empty quantized module shaped as ``desc`` says, for the skeleton's ``linear``."""
    config: _BaseConfig = config_from_dict(desc["config"])
    bias_dtype = linear.bias.dtype if linear.bias is not None else torch.float32
    if desc["class"] == "SVDQLinear":
        return SVDQLinear(desc["in_features"], desc["out_features"], desc["rank"], desc["group_size"], desc["bias"],
                          desc["act_bits"], config.torch_scale_dtype, config.torch_lowrank_dtype, bias_dtype, config,
                          act_shift=float(desc.get("act_shift", 0.0)),
                          weight_format=desc.get("weight_format", "int4_g64"))
    if desc["class"] == "W8A8Linear":
        return W8A8Linear(desc["in_features"], desc["out_features"], desc["bias"], config.torch_scale_dtype,
                          bias_dtype, config)
    raise CheckpointError(f"unknown quantized module class {desc['class']!r}")


def _build_replacements(model: nn.Module, modules: dict) -> dict[str, nn.Module]:
    out = {}
    for name, desc in modules.items():
        try:
            linear = model.get_submodule(name)
        except AttributeError:
            raise CheckpointError(f"checkpoint layer '{name}' does not exist in the model") from None
        if not isinstance(linear, nn.Linear):
            raise CheckpointError(f"checkpoint layer '{name}' is a {type(linear).__name__} in the model, not nn.Linear")
        if (linear.in_features, linear.out_features, linear.bias is not None) != (
                desc["in_features"], desc["out_features"], desc["bias"]):
            raise CheckpointError(f"layer '{name}': checkpoint has [{desc['out_features']}, {desc['in_features']}] "
                                  f"bias={desc['bias']}, model has [{linear.out_features}, {linear.in_features}] "
                                  f"bias={linear.bias is not None}")
        try:
            out[name] = _empty_module(desc, linear)
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"layer '{name}': bad module description ({err})") from None
    return out


# --- validation ------------------------------------------------------------------------------------------


def _read(path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err}") from None


def _read_metadata(data: bytes) -> dict:
    """Parse the safetensors header ourselves, so truncation and header damage give clear messages."""
    if len(data) < 8:
        raise CheckpointError(f"checkpoint truncated: {len(data)} bytes, no safetensors header")
    (header_len,) = struct.unpack("<Q", data[:8])
    if 8 + header_len > len(data):
        raise CheckpointError(f"checkpoint truncated: header says {header_len} bytes, file has {len(data) - 8}")
    try:
        header = json.loads(data[8:8 + header_len])
        meta = header["__metadata__"]
        data_end = max((max(v["data_offsets"]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"checkpoint header is damaged or has no metadata ({err})") from None
    if 8 + header_len + data_end != len(data):
        raise CheckpointError(f"checkpoint truncated or padded: tensor data should end at byte "
                              f"{8 + header_len + data_end}, file has {len(data)} bytes")
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"not a {FORMAT} checkpoint (format={meta.get('format')!r})")
    if meta.get("format_version") not in READ_VERSIONS:
        raise CheckpointError(f"checkpoint format version {meta.get('format_version')!r} is not supported "
                              f"(this build reads versions {', '.join(READ_VERSIONS)})")
    try:
        return {k: json.loads(meta[k]) for k in ("config", "modules", "checksums")}
    except (ValueError, KeyError) as err:
        raise CheckpointError(f"checkpoint metadata is damaged ({err})") from None


def _verify_checksums(tensors: dict[str, torch.Tensor], metadata: dict) -> None:
    sums = metadata["checksums"]
    if set(sums) != set(tensors):
        raise CheckpointError(f"checksum table does not match the tensors: missing "
                              f"{sorted(set(tensors) - set(sums))[:5]}, extra {sorted(set(sums) - set(tensors))[:5]}")
    bad = [k for k, t in tensors.items() if _sha256(t) != sums[k]]
    if bad:
        raise CheckpointError(f"checksum mismatch (corrupted data) in {len(bad)} tensor(s): {bad[:5]}")


def _verify_tensors(model: nn.Module, replacements: dict[str, nn.Module], tensors: dict[str, torch.Tensor]) -> None:
    """Every expected state_dict entry (after the swap) is present with the same shape and dtype, and no more."""
    expected = {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()
                if not any(k.startswith(name + ".") for name in replacements)}
    for name, module in replacements.items():
        expected.update({f"{name}.{k}": (tuple(v.shape), v.dtype) for k, v in module.state_dict().items()})
    missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or extra:
        raise CheckpointError(f"checkpoint does not match the model: missing {missing[:5]}, unexpected {extra[:5]}")
    for key, (shape, dtype) in expected.items():
        got = tensors[key]
        if (tuple(got.shape), got.dtype) != (shape, dtype):
            raise CheckpointError(f"tensor '{key}': checkpoint has {got.dtype} {list(got.shape)}, "
                                  f"model expects {dtype} {list(shape)}")


def _sha256(t: torch.Tensor) -> str:
    raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(raw.tobytes()).hexdigest()
