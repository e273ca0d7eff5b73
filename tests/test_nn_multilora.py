"""AdapterBank / MultiLoRALinear / multilora_from_peft on CPU (interpreter, fp16) vs reference and PEFT."""

import pytest
import torch
from torch import nn

from lowrank_gemm.nn import multilora as nn_multilora
from lowrank_gemm.nn.multilora import AdapterBank, AdapterIds, MultiLoRALinear, multilora_from_peft, peft_scaling
from lowrank_gemm.reference import multi_lora_linear_ref

DT = torch.float16   # interpreter: fp16 dots (bf16 tl.dot is wrong there)


def rel_err(y, ref):
    return ((y.double() - ref.double()).norm() / ref.double().norm()).item()


def test_bank_set_replace_remove_in_place():
    bank = AdapterBank(3, 8, 24, 16, dtype=DT)
    ptrs = [t.data_ptr() for t in (bank.bank_a, bank.bank_b, bank.ranks, bank.scales)]
    a, b = torch.randn(5, 24, dtype=DT), torch.randn(16, 5, dtype=DT)
    bank.set_adapter(1, a, b, 0.5, name="x")
    assert bank.ranks.tolist() == [0, 5, 0] and bank.scales[1].item() == 0.5
    assert torch.equal(bank.bank_a[1, :5], a) and not bank.bank_a[1, 5:].any()
    bank.set_adapter(1, a[:2], b[:, :2], 2.0)          # replace with a smaller rank: tail re-zeroed
    assert bank.ranks[1].item() == 2 and not bank.bank_a[1, 2:].any() and not bank.bank_b[1, :, 2:].any()
    bank.remove(1)
    assert bank.ranks.tolist() == [0, 0, 0] and not bank.bank_a.any()
    assert ptrs == [t.data_ptr() for t in (bank.bank_a, bank.bank_b, bank.ranks, bank.scales)]
    with pytest.raises(ValueError, match="exceeds the bank's r_max=8"):
        bank.set_adapter(0, torch.randn(9, 24, dtype=DT), torch.randn(16, 9, dtype=DT))
    with pytest.raises(ValueError, match=r"lora_b must be \[N=16, r=5\]"):
        bank.set_adapter(0, a, b.T)
    with pytest.raises(IndexError):
        bank.remove(3)


def test_module_matches_reference_and_swaps():
    lin = nn.Linear(40, 28).to(DT)
    mod = MultiLoRALinear.from_linear(lin, num_slots=3, r_max=16)
    adapters = [(torch.randn(r, 40, dtype=DT) * 0.2, torch.randn(28, r, dtype=DT) * 0.2, s)
                for r, s in ((16, 0.5), (4, 2.0), (9, 1.0))]
    for slot, (a, b, s) in enumerate(adapters):
        mod.bank.set_adapter(slot, a, b, s)
    x = torch.randn(2, 7, 40, dtype=DT)
    ids = torch.randint(-1, 3, (2, 7), dtype=torch.int32)
    mod.set_adapter_ids(ids)
    ref = multi_lora_linear_ref(x.reshape(14, 40), lin.weight, mod.bank.bank_a, mod.bank.bank_b,
                                ids.reshape(-1), mod.bank.scales, mod.bank.ranks, lin.bias)
    y = mod(x)
    assert y.shape == (2, 7, 28) and rel_err(y.reshape(14, 28), ref) < 5e-3
    # swap slot 2 in place: the same module, same ids, now the new adapter
    a2, b2 = torch.randn(6, 40, dtype=DT) * 0.2, torch.randn(28, 6, dtype=DT) * 0.2
    mod.bank.set_adapter(2, a2, b2, 3.0)
    ref2 = multi_lora_linear_ref(x.reshape(14, 40), lin.weight, mod.bank.bank_a, mod.bank.bank_b,
                                 ids.reshape(-1), mod.bank.scales, mod.bank.ranks, lin.bias)
    assert rel_err(mod(x).reshape(14, 28), ref2) < 5e-3
    # one id per sequence
    mod.set_adapter_ids(torch.tensor([2, -1], dtype=torch.int32))
    y_seq = mod(x)
    ids_tok = torch.tensor([2] * 7 + [-1] * 7, dtype=torch.int32)
    ref3 = multi_lora_linear_ref(x.reshape(14, 40), lin.weight, mod.bank.bank_a, mod.bank.bank_b, ids_tok,
                                 mod.bank.scales, mod.bank.ranks, lin.bias)
    assert rel_err(y_seq.reshape(14, 28), ref3) < 5e-3


def test_module_one_adapter_hint_runs_bank_mode_on_the_clean_bank(monkeypatch):
    """set_adapter_ids(ids, max_adapters=1) routes the module's call to the single-adapter kernels in bank mode, and
    the module hands the op its AdapterBank, so the kernels may rely on B being zero past each rank (b_clean)."""
    from lowrank_gemm.kernels import multilora_gemm as mg
    seen = []
    real = mg.run_bank
    monkeypatch.setattr(mg, "run_bank", lambda *a, **k: seen.append(k) or real(*a, **k))
    lin = nn.Linear(48, 40).to(DT)
    mod = MultiLoRALinear.from_linear(lin, num_slots=4, r_max=16)
    mod.bank.set_adapter(2, torch.randn(7, 48, dtype=DT) * 0.2, torch.randn(40, 7, dtype=DT) * 0.2, 1.5)
    x = torch.randn(20, 48, dtype=DT)
    ids = torch.where(torch.arange(20) % 3 == 0, -1, 2).to(torch.int32)
    mod.set_adapter_ids(ids, max_adapters=1)
    y = mod(x)
    assert seen and seen[-1]["b_clean"] is True
    ref = multi_lora_linear_ref(x, lin.weight, mod.bank.bank_a, mod.bank.bank_b, ids, mod.bank.scales,
                                mod.bank.ranks, lin.bias)
    assert rel_err(y, ref) < 5e-3


def test_module_few_adapters_hint_runs_stacked_bank_mode(monkeypatch):
    """max_adapters=3 (of a rank-16 bank, M ≤ 64) routes the module's call to stacked bank mode (stack_d 4) on its
    clean bank; the result is the reference's."""
    from lowrank_gemm.kernels import multilora_gemm as mg
    seen = []
    real = mg.run_bank
    monkeypatch.setattr(mg, "run_bank", lambda *a, **k: seen.append(k) or real(*a, **k))
    lin = nn.Linear(48, 40).to(DT)
    mod = MultiLoRALinear.from_linear(lin, num_slots=5, r_max=16)
    for slot, r in ((0, 16), (2, 7), (4, 3)):
        mod.bank.set_adapter(slot, torch.randn(r, 48, dtype=DT) * 0.2, torch.randn(40, r, dtype=DT) * 0.2, 0.5 + slot)
    x = torch.randn(20, 48, dtype=DT)
    ids = torch.tensor([0, 2, 4, -1] * 5, dtype=torch.int32)
    mod.set_adapter_ids(ids, max_adapters=3)
    y = mod(x)
    assert seen and seen[-1]["stack_d"] == 4 and seen[-1]["b_clean"] is True
    ref = multi_lora_linear_ref(x, lin.weight, mod.bank.bank_a, mod.bank.bank_b, ids, mod.bank.scales,
                                mod.bank.ranks, lin.bias)
    assert rel_err(y, ref) < 5e-3


def test_adapter_ids_in_place_and_segment_order():
    ids = AdapterIds(mode="segment")
    ids.set(torch.tensor([2, 0, -1, 0], dtype=torch.int32))
    buf, order = ids.ids, ids.row_order
    ids.set(torch.tensor([1, 1, 0, -1]))
    assert ids.ids is buf and ids.row_order is order
    assert ids.ids.tolist() == [1, 1, 0, -1] and ids.row_order.tolist() == [3, 2, 0, 1]


def test_adapter_ids_auto_sorts_once_and_each_layer_picks_its_mode(monkeypatch):
    ids = AdapterIds()                                          # mode="auto"
    ids.set(torch.tensor([2, 0, -1, 0], dtype=torch.int32))
    assert ids.row_order is None                                # 4 rows: gather mode everywhere, nothing sorted
    big = torch.randint(-1, 4, (100,), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    ids.set(big, max_adapters=4)                                # 100 rows: sorted once, for every layer
    order = ids.row_order
    assert order is not None and torch.equal(order, torch.sort(big, stable=True).indices.to(torch.int32))
    ids.set(big.flip(0), max_adapters=4)
    assert ids.row_order is order and torch.equal(order, torch.sort(big.flip(0), stable=True).indices.to(torch.int32))
    seen = []
    monkeypatch.setattr(nn_multilora, "multi_lora_linear", lambda *a, **k: seen.append((k["mode"], k["row_order"])))
    for n, want in ((32, "segment"), (9000, "gather")):       # four adapters: a wide N runs gather at ≤ 256 rows
        mod = MultiLoRALinear.from_linear(nn.Linear(16, n).to(DT), 8, 4, ids=ids)
        mod(torch.randn(100, 16).to(DT))
        assert seen[-1][0] == want and (seen[-1][1] is order) == (want == "segment")
    with pytest.raises(ValueError, match="mode must be"):
        AdapterIds(mode="sorted")


def test_load_peft_state_dict_scaling():
    lin = nn.Linear(32, 24).to(DT)
    mod = MultiLoRALinear.from_linear(lin, 2, 8)
    a, b = torch.randn(8, 32), torch.randn(24, 8)
    mod.load_peft_adapter("u", {"base_model.model.fc.lora_A.u.weight": a, "base_model.model.fc.lora_B.u.weight": b,
                                "lora_alpha": 16, "use_rslora": True}, slot=1)
    assert mod.bank.scales[1].item() == pytest.approx(peft_scaling(16, 8, True)) == pytest.approx(16 / 8 ** 0.5)
    mod.load_peft_adapter("v", {"lora_A.weight": a[:4], "lora_B.weight": b[:, :4], "lora_alpha": 8}, slot=0)
    assert mod.bank.scales[0].item() == 2.0 and mod.bank.ranks.tolist() == [4, 8]
    with pytest.raises(KeyError, match="lora_alpha"):
        mod.load_peft_adapter("w", {"lora_A.weight": a, "lora_B.weight": b}, slot=0)


peft = pytest.importorskip("peft")


from _models import Tiny  # noqa: E402


def _randomize(model, name):
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "lora_" in pname and f".{name}." in pname:
                p.copy_(torch.randn_like(p) * 0.2)


def test_peft_model_transform_matches_per_adapter_forward(tmp_path):
    torch.manual_seed(0)
    base = Tiny().to(DT)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["up", "down"]),
                                adapter_name="u")
    _randomize(model, "u")
    # a second adapter saved and loaded back the way serving stacks do it; a third added in memory
    other = peft.get_peft_model(Tiny().to(DT), peft.LoraConfig(r=8, lora_alpha=4, use_rslora=True,
                                                               target_modules=["up", "down"]), adapter_name="v")
    other.base_model.model.load_state_dict(base.state_dict(), strict=False)
    _randomize(other, "v")
    other.save_pretrained(tmp_path / "v", selected_adapters=["v"])
    model.load_adapter(str(tmp_path / "v" / "v"), adapter_name="v")
    model.add_adapter("w", peft.LoraConfig(r=2, lora_alpha=2, target_modules=["up"]))
    _randomize(model, "w")
    model.eval()

    x = torch.randn(3, 5, 48, dtype=DT)
    want = {}
    with torch.no_grad():
        for name in ("u", "v", "w"):
            model.set_adapter(name)
            want[name] = model(x)
        with model.disable_adapter():
            want[None] = model(x)

    assert rel_err(want["v"], want[None]) > 1e-2      # the loaded adapter is really there
    ids, slots = multilora_from_peft(model, mode="auto")
    assert slots == {"u": 0, "v": 1, "w": 2}
    inner = model.base_model.model
    assert isinstance(inner.up, MultiLoRALinear) and isinstance(inner.down, MultiLoRALinear)
    assert inner.down.bank.ranks.tolist() == [4, 8, 0]   # adapter w only targets "up"
    tok = torch.randint(-1, 3, (3, 5), dtype=torch.int32)
    ids.set(tok)
    with torch.no_grad():
        got = inner(x)
    names = {-1: None, 0: "u", 1: "v", 2: "w"}
    for sid, name in names.items():
        rows = tok == sid
        if rows.any():
            assert rel_err(got[rows], want[name][rows]) < 1e-2, name
