"""LoRA adapter files on quantized layers: append_lora_weights_ (integrations/peft.py), SVDQLinear.reset_lora."""

import pytest
import safetensors.torch
import torch
from torch import nn

from lowrank_gemm.integrations.peft import append_lora_weights_
from lowrank_gemm.nn import SVDQLinear
from lowrank_gemm.quant import SVDQuantConfig

from _models import Tiny

peft = pytest.importorskip("peft")


def _quantized(base: nn.Module) -> nn.Module:
    """A copy of ``base`` whose two Linears are SVDQLinear (rank 8, with smoothing from random calibration rows)."""
    q = Tiny(128, 192, 64)
    q.load_state_dict(base.state_dict())
    cfg = SVDQuantConfig(rank=8, refit=False, alpha_grid=(0.5,))
    q.up = SVDQLinear.from_linear(q.up, cfg, torch.randn(64, 128), name="up")
    q.down = SVDQLinear.from_linear(q.down, cfg, torch.randn(64, 192), name="down")
    for layer in (q.up, q.down):
        layer.act_bits = 16             # compare branches without activation-quantization noise
    return q


def _peft_adapter(base, r=4, alpha=8.0):
    model = peft.get_peft_model(base, peft.LoraConfig(target_modules=["up", "down"], r=r, lora_alpha=alpha))
    with torch.no_grad():
        for mod in model.modules():
            if hasattr(mod, "lora_B") and "default" in getattr(mod, "lora_B", {}):
                mod.lora_B["default"].weight.normal_(0, 0.1)        # PEFT starts B at zero
    return model, peft.get_peft_model_state_dict(model)


def test_peft_adapter_file_on_quantized_layers(tmp_path):
    base = Tiny(128, 192, 64)
    q = _quantized(base)
    model, state = _peft_adapter(Tiny(128, 192, 64).requires_grad_(False))
    x = torch.randn(5, 128, dtype=torch.float64)
    h = torch.randn(5, 192, dtype=torch.float64)
    before = {"up": q.up.forward_reference(x), "down": q.down.forward_reference(h)}
    path = tmp_path / "adapter_model.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    names = append_lora_weights_(q, path, lora_alpha=8.0)
    assert sorted(names) == ["down", "up"] and q.up.rank == 12 and q.up.base_rank == 8
    for name, inp in (("up", x), ("down", h)):
        peft_layer = model.base_model.model.get_submodule(name)
        a, b = (peft_layer.lora_A["default"].weight.detach().double(),
                peft_layer.lora_B["default"].weight.detach().double())
        want = float(peft_layer.scaling["default"]) * (inp @ a.t()) @ b.t()
        got = getattr(q, name).forward_reference(inp) - before[name]
        assert float((got - want).abs().max()) <= 2 ** -7 * float(want.abs().max())
    q.up.reset_lora()
    assert q.up.rank == 8 and torch.equal(q.up.forward_reference(x), before["up"])


def test_alpha_from_the_file_prefix_and_strength():
    q = _quantized(Tiny(128, 192, 64))
    a, b = torch.randn(4, 128) * 0.1, torch.randn(192, 4) * 0.1
    x = torch.randn(3, 128, dtype=torch.float64)
    before = q.up.forward_reference(x)
    append_lora_weights_(q, {"transformer.up.lora_A.weight": a, "transformer.up.lora_B.weight": b,
                             "transformer.up.alpha": torch.tensor(2.0)}, scale=0.5)
    want = 0.5 * (2.0 / 4) * (x @ a.double().t()) @ b.double().t()
    assert float((q.up.forward_reference(x) - before - want).abs().max()) <= 2 ** -7 * float(want.abs().max())


def test_bad_adapter_files_change_nothing():
    q = _quantized(Tiny(128, 192, 64))
    a, b = torch.randn(4, 128), torch.randn(192, 4)
    good = {"up.lora_A.weight": a, "up.lora_B.weight": b}
    with pytest.raises(ValueError, match="lora_alpha"):
        append_lora_weights_(q, good)
    with pytest.raises(ValueError, match="no module"):
        append_lora_weights_(q, {**good, "nope.lora_A.weight": a, "nope.lora_B.weight": b}, lora_alpha=4)
    with pytest.raises(ValueError, match="lora_A"):
        append_lora_weights_(q, {**good, "down.lora_A.weight": a, "down.lora_B.weight": b}, lora_alpha=4)
    with pytest.raises(ValueError, match="no matching"):
        append_lora_weights_(q, {"up.lora_A.weight": a}, lora_alpha=4)
    with pytest.raises(ValueError, match="no '<module>.lora_A.weight'"):
        append_lora_weights_(q, {"up.weight": a}, lora_alpha=4)
    with pytest.raises(NotImplementedError, match="DoRA"):
        append_lora_weights_(q, {**good, "up.lora_magnitude_vector": torch.ones(192)}, lora_alpha=4)
    with pytest.raises(NotImplementedError, match="lora_bias"):
        append_lora_weights_(q, {**good, "up.lora_B.bias": torch.ones(192)}, lora_alpha=4)
    plain = Tiny(128, 192, 64)
    with pytest.raises(ValueError, match="not a quantized SVDQLinear"):
        append_lora_weights_(plain, good, lora_alpha=4)
    assert q.up.rank == q.down.rank == 8                   # every file above was refused before any change
