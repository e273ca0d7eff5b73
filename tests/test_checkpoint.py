"""save_quantized / load_quantized: bit-exact round trip; corrupted, truncated, wrong-version and
mismatched checkpoints raise CheckpointError and leave the skeleton untouched."""

import json
import struct

import pytest
import torch
from torch import nn

from lowrank_gemm.nn.svdq import SVDQLinear, W8A8Linear
from lowrank_gemm.quant import CheckpointError, SVDQuantConfig, load_quantized, quantize_, save_quantized, scheme_config


class Net(nn.Module):
    def __init__(self, hidden=128):
        super().__init__()
        self.norm = nn.LayerNorm(128)
        self.fc1 = nn.Linear(128, hidden)
        self.fc2 = nn.Linear(hidden, 64, bias=False)
        self.odd = nn.Linear(64, 48)  # K = 64 with group 128: skipped, stays nn.Linear

    def forward(self, x):
        return self.odd(self.fc2(torch.relu(self.fc1(self.norm(x)))))


def _fresh(hidden=128):
    torch.manual_seed(0)
    return Net(hidden)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = _fresh()
    x = torch.randn(64, 128)
    with pytest.warns(UserWarning):
        quantize_(model, SVDQuantConfig(rank=8, group_size=128, refit_iters=2), [x], progress=False)
    model.fc1.append_lora(torch.randn(4, 128) * 0.01, torch.randn(128, 4) * 0.01, 2.0)  # rank 12 now
    path = tmp_path_factory.mktemp("ckpt") / "net.safetensors"
    save_quantized(model, path)
    return model, x, path


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_round_trip_is_bit_exact(saved):
    model, x, path = saved
    loaded = load_quantized(path, _fresh)  # a factory works as well as a skeleton
    assert isinstance(loaded.fc1, SVDQLinear) and loaded.fc1.rank == 12 and type(loaded.odd) is nn.Linear
    assert _same(_state(loaded), _state(model))
    assert torch.equal(loaded(x), model(x))


def test_w8a8_round_trip(tmp_path):
    model = _fresh()
    quantize_(model, scheme_config("w8a8"), progress=False)
    save_quantized(model, tmp_path / "w8.safetensors")
    loaded = load_quantized(tmp_path / "w8.safetensors", _fresh())
    assert isinstance(loaded.fc2, W8A8Linear) and _same(_state(loaded), _state(model))


def _rejected(path, match, skeleton=None):
    skeleton = skeleton or _fresh()
    before = _state(skeleton)
    with pytest.raises(CheckpointError, match=match):
        load_quantized(path, skeleton)
    assert all(type(m) is nn.Linear for m in (skeleton.fc1, skeleton.fc2, skeleton.odd))  # nothing swapped
    assert _same(_state(skeleton), before)  # nothing loaded


def _header_len(data):
    return struct.unpack("<Q", data[:8])[0]


def test_flipped_byte_in_tensor_data(saved, tmp_path):
    data = bytearray(saved[2].read_bytes())
    data[8 + _header_len(data) + 100] ^= 0x01
    bad = tmp_path / "flip.safetensors"
    bad.write_bytes(bytes(data))
    _rejected(bad, "checksum mismatch")


def test_truncated(saved, tmp_path):
    data = saved[2].read_bytes()
    for cut, match in ((len(data) - 10, "truncated"), (200, "truncated"), (5, "truncated")):
        bad = tmp_path / f"cut{cut}.safetensors"
        bad.write_bytes(data[:cut])
        _rejected(bad, match)


def _rewrite_metadata(path, out, edit):
    data = path.read_bytes()
    n = _header_len(data)
    header = json.loads(data[8:8 + n])
    edit(header["__metadata__"])
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    out.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])
    return out


def test_wrong_version(saved, tmp_path):
    bad = _rewrite_metadata(saved[2], tmp_path / "v4.safetensors", lambda m: m.update(format_version="4"))
    _rejected(bad, "version '4' is not supported")


@pytest.mark.parametrize("version", ["1", "2"])
def test_older_versions_still_load(saved, tmp_path, version):
    """Version 1 (before act_shift) and 2 (before weight_format) had the same tensors and module entries for these
    layers; such files load as signed int4_g64 layers."""
    model, x, path = saved
    old = _rewrite_metadata(path, tmp_path / f"v{version}.safetensors", lambda m: m.update(format_version=version))
    loaded = load_quantized(old, _fresh)
    assert loaded.fc1.act_shift == 0 and loaded.fc1.weight_format == "int4_g64"
    assert torch.equal(loaded(x), model(x))


def test_two_level_round_trip(tmp_path):
    """int4_2l layers (row scales fp32 [N], group multipliers uint8 [K/G, N]) come back bit for bit; the module
    entry records the format."""
    model = _fresh()
    x = torch.randn(64, 128)
    quantize_(model, SVDQuantConfig(rank=8, refit_iters=2, weight_format="int4_2l"), [x], progress=False)
    assert model.fc1.weight_format == "int4_2l" and model.fc1.wmul.dtype == torch.uint8
    path = tmp_path / "two_level.safetensors"
    save_quantized(model, path)
    meta = json.loads(json.loads(path.read_bytes()[8:8 + _header_len(path.read_bytes())])["__metadata__"]["modules"])
    assert meta["fc1"]["weight_format"] == "int4_2l"
    loaded = load_quantized(path, _fresh)
    assert loaded.fc1.weight_format == "int4_2l" and torch.equal(loaded.fc1.wmul, model.fc1.wmul)
    assert torch.equal(loaded(x), model(x))


def test_act_shift_round_trip(tmp_path):
    """Unsigned-activation layers (act_shift) come back with their shift, bit for bit."""
    model = _fresh()
    x = torch.nn.functional.gelu(torch.randn(64, 128))
    quantize_(model, SVDQuantConfig(rank=8, refit_iters=2, include=("fc2",), act_shift=0.171875), [x],
              progress=False)
    assert model.fc2.act_shift == 0.171875 and type(model.fc1) is nn.Linear
    path = tmp_path / "shift.safetensors"
    save_quantized(model, path)
    loaded = load_quantized(path, _fresh)
    assert loaded.fc2.act_shift == 0.171875 and "act_shift=0.171875" in repr(loaded.fc2)
    assert _same(_state(loaded), _state(model)) and torch.equal(loaded(x), model(x))


def test_not_our_format(saved, tmp_path):
    bad = _rewrite_metadata(saved[2], tmp_path / "other.safetensors", lambda m: m.update(format="something"))
    _rejected(bad, "not a lowrank_gemm")


def test_mismatched_shape(saved):
    _rejected(saved[2], r"layer 'fc1'.*\[256, 128\]", skeleton=_fresh(hidden=256))


def test_missing_layer(saved):
    skeleton = _fresh()
    skeleton.fc2 = nn.Identity()
    with pytest.raises(CheckpointError, match="not nn.Linear"):
        load_quantized(saved[2], skeleton)


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="cannot read"):
        load_quantized(tmp_path / "nope.safetensors", _fresh())
