"""LoRALinear and fuse_lora_: construction, PEFT equivalence (eval mode), refusals."""

import pytest
import torch
from torch import nn

from lowrank_gemm import reference
from lowrank_gemm.nn.lora import LoRALinear
from lowrank_gemm.integrations.peft import fuse_lora_, peft_branch

peft = pytest.importorskip("peft")

DT = torch.float16  # the interpreter's bf16 tl.dot is wrong; fp16 exercises the same kernels


def rel_err(y, ref):
    return ((y.double() - ref.double()).norm() / ref.double().norm()).item()


from _models import Tiny  # noqa: E402


def _randomize_lora(model):
    # PEFT initializes B = 0 (the branch starts at zero): a test on that would prove nothing.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.2)


def _peft_model(**cfg):
    base = Tiny().to(DT)
    model = peft.get_peft_model(base, peft.LoraConfig(target_modules=["up", "down"], **cfg))
    _randomize_lora(model)
    return model.eval()


def test_from_linear_matches_reference():
    lin = nn.Linear(72, 56).to(DT)
    a, b = torch.randn(8, 72, dtype=DT) * 0.1, torch.randn(56, 8, dtype=DT) * 0.1
    mod = LoRALinear.from_linear(lin, a, b, scale=1.5)
    x = torch.randn(3, 5, 72, dtype=DT)
    y = mod(x)
    assert y.shape == (3, 5, 56) and y.dtype == DT
    ref = reference.lora_linear_ref(x, lin.weight, a, b, 1.5, lin.bias)
    assert rel_err(y, ref) < 2e-3


def test_from_linear_rejects_bad_shapes():
    lin = nn.Linear(32, 16)
    with pytest.raises(ValueError, match=r"expected lora_a \[r, 32\]"):
        LoRALinear.from_linear(lin, torch.randn(4, 31), torch.randn(16, 4))
    with pytest.raises(ValueError, match="rank"):
        LoRALinear(32, 16, rank=0)


@pytest.mark.parametrize("cfg", [
    dict(r=8, lora_alpha=16),
    dict(r=4, lora_alpha=8, use_rslora=True),
    dict(r=6, lora_alpha=3, lora_bias=True),
])
def test_fuse_lora_matches_peft(cfg):
    model = _peft_model(**cfg)
    x = torch.randn(2, 7, 48, dtype=DT)
    with torch.no_grad():
        want = model(x)
        fuse_lora_(model)
        got = model(x)
    fused = [m for m in model.modules() if isinstance(m, LoRALinear)]
    assert len(fused) == 2
    assert rel_err(got, want) < 5e-3


def test_pack_keeps_values_and_survives_state_dict():
    lin = nn.Linear(72, 56).to(DT)
    a, b = torch.randn(8, 72, dtype=DT) * 0.1, torch.randn(56, 8, dtype=DT) * 0.1
    mod = LoRALinear.from_linear(lin, a, b, scale=1.5)
    x = torch.randn(9, 72, dtype=DT)
    before = mod(x)
    assert not mod.packed
    w, bb = mod.weight.clone(), mod.lora_b.clone()
    assert mod.pack_() is mod and mod.packed and "packed" in repr(mod)
    assert torch.equal(mod.weight, w) and torch.equal(mod.lora_b, bb)
    torch.testing.assert_close(mod(x), before, rtol=0, atol=0)      # small M: the same kernels, same bits
    sd = {k: v.clone() for k, v in mod.state_dict().items()}
    sd["lora_b"].mul_(2)
    mod.load_state_dict(sd)
    assert mod.packed and torch.equal(mod.lora_b, 2 * bb), "load_state_dict writes in place: the layout stays"
    assert not mod.to(torch.float32).packed, "moving makes separate tensors (documented: pack after moving)"


def test_fuse_lora_pack():
    model = _peft_model(r=8, lora_alpha=16)
    x = torch.randn(2, 7, 48, dtype=DT)
    with torch.no_grad():
        want = model(x)
        fuse_lora_(model, pack=True)
        got = model(x)
    fused = [m for m in model.modules() if isinstance(m, LoRALinear)]
    assert len(fused) == 2 and all(m.packed for m in fused)
    assert rel_err(got, want) < 5e-3


def test_multiple_active_adapters_concatenate():
    model = _peft_model(r=4, lora_alpha=8)
    model.add_adapter("second", peft.LoraConfig(target_modules=["up", "down"], r=2, lora_alpha=6))
    _randomize_lora(model)
    layer = model.base_model.model.up
    layer.set_adapter(["default", "second"])
    x = torch.randn(5, 48, dtype=DT)
    with torch.no_grad():
        want = layer(x)
        base, a, b, scale, _ = peft_branch(layer)
        assert a.shape[0] == 6 and scale == 1.0
        got = LoRALinear.from_peft(layer)(x)
    assert rel_err(got, want) < 5e-3


def test_disabled_adapter_becomes_base_linear():
    model = _peft_model(r=4, lora_alpha=4)
    layer = model.base_model.model.up
    layer.enable_adapters(False)
    assert type(LoRALinear.from_peft(layer)) is nn.Linear


def test_refuses_merged_and_dora():
    model = _peft_model(r=4, lora_alpha=4)
    model.merge_adapter()
    with pytest.raises(ValueError, match="unmerge"):
        fuse_lora_(model)
    dora = peft.get_peft_model(Tiny().to(torch.float32), peft.LoraConfig(target_modules=["up"], r=4, use_dora=True))
    with pytest.raises(NotImplementedError, match="variant"):
        fuse_lora_(dora)
