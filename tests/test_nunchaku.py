"""Nunchaku int4 checkpoints → SVDQLinear (integrations/nunchaku.py).

The layouts are checked against index formulas written here from the PTX ISA's mma.sync fragment layouts (an
independent derivation: the library writes them as reshapes and permutations), against the scale-order table in
Nunchaku's packer comments, and end to end: tensors packed here by those formulas, loaded by the library, give
Nunchaku's layer math (x/λ on the 4-bit path, the branch on the raw x, the GELU shift folded out of the bias).
"""

import pytest
import safetensors.torch
import torch
from torch import nn

from lowrank_gemm.formats.int4 import unpack_int4
from lowrank_gemm.integrations import nunchaku as nk
from lowrank_gemm.nn import SVDQLinear


# --- index formulas from the PTX fragment layouts ------------------------------------------------------------

def _qweight_nibble(n, k, K):
    """(byte, high nibble?) of element (n, k) in the stored qweight: mma.m16n8k64 .s4 B fragment — lane L holds
    column (row of W) L // 4 of an n8 tile, K = 8·(L % 4) + j in its first register and + 32 in its second; a lane
    loads both registers of both n8 halves of a 16-row tile as one 16-byte vector."""
    nb, nloc = n // 128, n % 128
    t, h, r = nloc // 16, (nloc % 16) // 8, nloc % 8
    kb, kloc = k // 64, k % 64
    e, c, j = kloc // 32, (kloc % 32) // 8, kloc % 8
    lane = r * 4 + c
    word = (((nb * (K // 64) + kb) * 8 + t) * 32 + lane) * 4 + h * 2 + e
    return word * 4 + j // 2, j % 2


def _scale_index(g, n, G):
    """Flat index of scale (group g, row n): per 128 rows and group, lane 4a + b holds rows 16a + 2b + {0, 1, 8, 9}."""
    nb, nloc = n // 128, n % 128
    a, h, b, p = nloc // 16, (nloc % 16) // 8, (nloc % 8) // 2, nloc % 2
    return ((nb * G + g) * 32 + a * 4 + b) * 4 + h * 2 + p


def _lowrank_index(row, col, rows, cols, down):
    """Flat index of element (row, col) of D [r, K] (down) or U [N, r]: mma.m16n8k16 f16 B fragment — lane
    4·gid + tid holds n = gid and k = 2·tid + {0, 1} (+ 8 in its second register), two n8 halves per 16 × 16 tile."""
    rb, rloc = row // 16, row % 16
    h, r = rloc // 8, rloc % 8
    cb, cloc = col // 16, col % 16
    e, c, p = cloc // 8, (cloc % 8) // 2, cloc % 2
    outer, inner, inner_n = (cb, rb, rows // 16) if down else (rb, cb, cols // 16)
    idx = outer * inner_n + inner
    for size, v in ((8, r), (4, c), (2, h), (2, e), (2, p)):
        idx = idx * size + v
    return idx


def _grid(*sizes):
    return torch.meshgrid(*[torch.arange(s) for s in sizes], indexing="ij")


def _pack_q_by_formula(q):
    n, k = q.shape
    nn_, kk = _grid(n, k)
    byte, hi = _qweight_nibble(nn_, kk, k)
    flat = torch.zeros(n * k // 2, dtype=torch.int16)
    nib = q.to(torch.int16) & 0xF
    flat.index_put_((byte[hi == 0],), nib[hi == 0], accumulate=True)
    flat.index_put_((byte[hi == 1],), nib[hi == 1] << 4, accumulate=True)
    return flat.to(torch.uint8).view(torch.int8).reshape(n, k // 2)


def _pack_scales_by_formula(s):
    g, n = s.shape
    gg, nn_ = _grid(g, n)
    flat = torch.empty(g * n, dtype=s.dtype)
    flat[_scale_index(gg, nn_, g).reshape(-1)] = s.reshape(-1)
    return flat.reshape(g, n)


def _pack_lowrank_by_formula(w, down):
    rows, cols = w.shape
    rr, cc = _grid(rows, cols)
    flat = torch.empty(rows * cols, dtype=w.dtype)
    flat[_lowrank_index(rr, cc, rows, cols, down).reshape(-1)] = w.reshape(-1)
    return flat.reshape(cols, rows) if down else flat.reshape(rows, cols)


def _operands(n=256, k=384, r=32, dtype=torch.bfloat16, seed=0):
    """Nunchaku's logical operands: codes q, scales s [K/64, N], λ, D [r, K] (raw input), U [N, r], bias."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int8)
    s = (torch.rand(k // 64, n, generator=g) * 0.02 + 0.005).to(dtype)
    lam = (torch.rand(k, generator=g) * 1.5 + 0.5).to(dtype)
    d = (torch.randn(r, k, generator=g) * 0.05).to(dtype)
    u = (torch.randn(n, r, generator=g) * 0.05).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    return q, s, lam, d, u, b


def _file_tensors(q, s, lam, d, u, b, prefix=""):
    return {prefix + "qweight": _pack_q_by_formula(q), prefix + "wscales": _pack_scales_by_formula(s),
            prefix + "smooth_factor": _pack_scales_by_formula(lam.reshape(1, -1)).reshape(-1),
            prefix + "proj_down": _pack_lowrank_by_formula(d, True),
            prefix + "proj_up": _pack_lowrank_by_formula(u, False),
            prefix + "bias": _pack_scales_by_formula(b.reshape(1, -1)).reshape(-1)}


def _nunchaku_math(x, q, s, lam, d, u, b, shift=0.0):
    """Nunchaku's layer on input x (float64, activations not quantized): y = ((x+σ)/λ)·(q·s)ᵀ + (x+σ)·Dᵀ·Uᵀ + b."""
    xs = x.double() + shift
    w = q.double() * s.double().t().repeat_interleave(64, dim=1)
    return (xs / lam.double()) @ w.t() + (xs @ d.double().t()) @ u.double().t() + b.double()


# --- layouts ---------------------------------------------------------------------------------------------------

def test_qweight_layout_matches_the_fragment_formula():
    q = torch.randint(-8, 8, (256, 384), dtype=torch.int8)
    assert torch.equal(nk.pack_qweight(q), _pack_q_by_formula(q))
    assert torch.equal(nk.unpack_qweight(_pack_q_by_formula(q)), q)
    assert torch.equal(nk.unpack_qweight(nk.pack_qweight(q).view(torch.uint8)), q)     # int8 or uint8 bytes


def test_scale_layout_matches_nunchakus_table():
    # the store order Nunchaku's packer documents for warp_n = 128: lane 0 loads rows 0 1 8 9, lane 1 2 3 10 11, …
    packed = nk.pack_vector(torch.arange(128)).reshape(32, 4)
    table = {0: [0, 1, 8, 9], 1: [2, 3, 10, 11], 3: [6, 7, 14, 15], 4: [16, 17, 24, 25], 7: [22, 23, 30, 31],
             28: [112, 113, 120, 121], 31: [118, 119, 126, 127]}
    for lane, rows in table.items():
        assert packed[lane].tolist() == rows
    s = torch.randn(6, 384)
    assert torch.equal(nk.pack_scales(s), _pack_scales_by_formula(s))
    assert torch.equal(nk.unpack_scales(nk.pack_scales(s)), s)
    v = torch.randn(256)
    assert torch.equal(nk.unpack_vector(nk.pack_vector(v)), v)


@pytest.mark.parametrize("down", [True, False])
def test_lowrank_layout_matches_the_fragment_formula(down):
    w = torch.randn(48, 256).bfloat16() if down else torch.randn(256, 48).bfloat16()
    stored = nk.pack_lowrank(w, down)
    assert stored.shape == ((256, 48) if down else (256, 48))
    assert torch.equal(stored, _pack_lowrank_by_formula(w, down))
    assert torch.equal(nk.unpack_lowrank(stored, down), w)


# --- one layer -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shift", [0.0, nk.GELU_SHIFT])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_layer_computes_nunchakus_math(shift, dtype):
    ops = _operands(dtype=dtype)
    q, s, lam, d, u, b = ops
    tensors = _file_tensors(*ops)
    file_bias = b
    if shift:       # the file's bias as Nunchaku writes it for a shifted input: b − W·σ
        w = q.double() * s.double().t().repeat_interleave(64, dim=1) / lam.double() + u.double() @ d.double()
        file_bias = (b.double() - shift * w.sum(1)).to(dtype)
        tensors["bias"] = _pack_scales_by_formula(file_bias.reshape(1, -1)).reshape(-1)
    layer = nk.svdq_linear_from_nunchaku(tensors, input_shift=shift)
    assert (layer.in_features, layer.out_features, layer.rank, layer.group_size) == (384, 256, 32, 64)
    assert torch.equal(unpack_int4(layer.qweight), q) and torch.equal(layer.wscales, s)
    assert torch.equal(layer.smooth, lam) and torch.equal(layer.lora_up, u)
    assert layer.wscales.dtype == layer.lora_up.dtype == dtype
    x = torch.randn(5, 384, dtype=torch.float64)
    layer.act_bits = 16                     # compare the linear maps exactly: no activation quantization
    got = layer.forward_reference(x)
    # Nunchaku on x + σ with the file's bias = the plain layer with bias b
    want = _nunchaku_math(x, q, s, lam, d, u, file_bias, shift=shift)
    assert torch.allclose(want, _nunchaku_math(x, q, s, lam, d, u, b), rtol=0, atol=0.05)
    # the branch's A = D·λ is rounded once to 16 bits; a shifted bias is rounded twice (file, fold)
    branch = float(((x @ d.double().t()) @ u.double().t()).abs().max())
    tol = 2 ** -7 * (branch + (float(b.abs().max()) + float(file_bias.abs().max()) if shift else 0.0)) + 1e-9
    assert float((got - want).abs().max()) <= tol


def test_layer_without_branch_smooth_or_bias_and_old_key_names():
    q, s, lam, d, u, b = _operands(r=16)
    t = _file_tensors(q, s, lam, d, u, b)
    old = {"qweight": t["qweight"], "wscales": t["wscales"], "smooth": t["smooth_factor"],
           "lora_down": t["proj_down"], "lora_up": t["proj_up"]}
    layer = nk.svdq_linear_from_nunchaku(old)
    assert layer.bias is None and layer.rank == 16 and torch.equal(layer.smooth, lam)
    bare = nk.svdq_linear_from_nunchaku({"qweight": t["qweight"], "wscales": t["wscales"]})
    assert bare.rank == 0 and bool((bare.smooth == 1).all())
    x = torch.randn(3, 384, dtype=torch.float64)
    bare.act_bits = 16
    assert torch.allclose(bare.forward_reference(x), _nunchaku_math(x, q, s, torch.ones(384), d[:0], u[:, :0],
                                                                     torch.zeros(256)), rtol=1e-12, atol=1e-12)


def test_export_round_trip():
    q, s, lam, d, u, b = _operands()
    original = _file_tensors(q, s, lam, d, u, b)
    layer = nk.svdq_linear_from_nunchaku(original)
    exported = nk.svdq_linear_to_nunchaku(layer)
    for key in ("qweight", "wscales", "smooth_factor", "proj_up", "bias"):      # the file comes back byte for byte
        assert torch.equal(exported[key], original[key]), key
    assert torch.allclose(exported["proj_down"].float(), original["proj_down"].float(), rtol=2 ** -6, atol=0)
    again = nk.svdq_linear_from_nunchaku(nk.svdq_linear_to_nunchaku(layer))
    for name in ("qweight", "wscales", "smooth", "lora_up", "bias"):
        assert torch.equal(getattr(again, name), getattr(layer, name)), name
    # lora_down goes through D = A/λ and back, each rounded to bf16
    assert torch.allclose(again.lora_down.float(), layer.lora_down.float(), rtol=2 ** -6, atol=0)
    shifted = nk.svdq_linear_from_nunchaku(nk.svdq_linear_to_nunchaku(layer, input_shift=0.5), input_shift=0.5)
    assert torch.allclose(shifted.bias.float(), layer.bias.float(), rtol=0, atol=0.05)


def test_crop_padding():
    q, s, lam, d, u, b = _operands()
    layer = nk.svdq_linear_from_nunchaku(_file_tensors(q, s, lam, d, u, b), in_features=320, out_features=200)
    assert (layer.in_features, layer.out_features) == (320, 200)
    assert torch.equal(unpack_int4(layer.qweight), q[:200, :320]) and torch.equal(layer.bias, b[:200])
    with pytest.raises(ValueError, match="cannot crop"):
        nk.svdq_linear_from_nunchaku(_file_tensors(q, s, lam, d, u, b), in_features=300)


def test_bad_input_is_refused_with_reasons():
    q, s, lam, d, u, b = _operands()
    t = _file_tensors(q, s, lam, d, u, b)
    with pytest.raises(ValueError, match="NVFP4"):
        nk.svdq_linear_from_nunchaku({**t, "wscales": t["wscales"].float().to(torch.float8_e4m3fn)})
    with pytest.raises(ValueError, match="NVFP4"):
        nk.svdq_linear_from_nunchaku({**t, "wcscales": torch.ones(256)})
    with pytest.raises(ValueError, match="AWQ"):
        nk.svdq_linear_from_nunchaku({**t, "wzeros": torch.zeros(6, 256)})
    with pytest.raises(ValueError, match="needs 'qweight' and 'wscales'"):
        nk.svdq_linear_from_nunchaku({"qweight": t["qweight"]})
    with pytest.raises(ValueError, match="multiple of 128"):
        nk.svdq_linear_from_nunchaku({**t, "qweight": t["qweight"][:200]})
    with pytest.raises(ValueError, match="do not match qweight"):
        nk.svdq_linear_from_nunchaku({**t, "wscales": t["wscales"][:5]})
    with pytest.raises(ValueError, match="both proj_down and proj_up"):
        nk.svdq_linear_from_nunchaku({k: v for k, v in t.items() if k != "proj_up"})
    with pytest.raises(ValueError, match="multiples of 16"):
        nk.svdq_linear_from_nunchaku({**t, "proj_down": t["proj_down"].reshape(-1)[:384 * 24].reshape(384, 24),
                                      "proj_up": t["proj_up"].reshape(-1)[:256 * 24].reshape(256, 24)})
    with pytest.raises(ValueError, match="smooth_factor"):
        nk.svdq_linear_from_nunchaku({**t, "smooth_factor": t["smooth_factor"][:100]})
    with pytest.raises(ValueError, match="zero"):
        nk.svdq_linear_from_nunchaku({**t, "smooth_factor": torch.zeros(384, dtype=torch.bfloat16)})
    with pytest.raises(ValueError, match="int8"):
        nk.svdq_linear_from_nunchaku({**t, "qweight": t["qweight"].float()})
    with pytest.raises(ValueError, match="group"):
        nk.svdq_linear_to_nunchaku(SVDQLinear(256, 256, 16, 128))


# --- a whole checkpoint ----------------------------------------------------------------------------------------

def _checkpoint(prefixes, n=256, k=256):
    tensors, ops = {}, {}
    for i, prefix in enumerate(prefixes):
        ops[prefix] = _operands(n=n, k=k, seed=i)
        tensors.update(_file_tensors(*ops[prefix], prefix=prefix + "."))
    return tensors, ops


def test_load_nunchaku_checkpoint(tmp_path):
    tensors, ops = _checkpoint(["transformer_blocks.0.mlp_fc1", "transformer_blocks.0.mlp_fc2"])
    tensors["transformer_blocks.0.norm1.linear.qweight"] = torch.zeros(64, 128, dtype=torch.int32)
    tensors["transformer_blocks.0.norm1.linear.wzeros"] = torch.zeros(4, 256)
    tensors["transformer_blocks.0.norm_q.weight"] = torch.ones(128)
    path = tmp_path / "svdq.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    got = nk.load_nunchaku(path, progress=False)
    assert sorted(got.layers) == ["transformer_blocks.0.mlp_fc1", "transformer_blocks.0.mlp_fc2"]
    assert list(got.skipped) == ["transformer_blocks.0.norm1.linear"] and "AWQ" in next(iter(got.skipped.values()))
    assert sorted(got.other) == ["transformer_blocks.0.norm1.linear.qweight", "transformer_blocks.0.norm1.linear.wzeros",
                                 "transformer_blocks.0.norm_q.weight"]
    fc1, fc2 = ops["transformer_blocks.0.mlp_fc1"], ops["transformer_blocks.0.mlp_fc2"]
    assert torch.equal(got.layers["transformer_blocks.0.mlp_fc1"].bias, fc1[5])       # not shifted
    assert not torch.equal(got.layers["transformer_blocks.0.mlp_fc2"].bias, fc2[5])   # GELU shift folded back
    plain = nk.load_nunchaku(tensors, shifted_inputs=(), progress=False)
    assert torch.equal(plain.layers["transformer_blocks.0.mlp_fc2"].bias, fc2[5])
    x = torch.randn(4, 256, dtype=torch.float64)
    layer = got.layers["transformer_blocks.0.mlp_fc2"]
    layer.act_bits = 16
    want = _nunchaku_math(x, *fc2, shift=nk.GELU_SHIFT)     # what Nunchaku computes on x + σ with the file's bias
    branch = float(((x @ fc2[3].double().t()) @ fc2[4].double().t()).abs().max())
    assert float((layer.forward_reference(x) - want).abs().max()) <= 2 ** -7 * (branch + float(want.abs().max()))


class _Attn(nn.Module):
    def __init__(self, dim, context):
        super().__init__()
        for name in ("to_q", "to_k", "to_v") + (("add_q_proj", "add_k_proj", "add_v_proj") if context else ()):
            setattr(self, name, nn.Linear(dim, dim))
        if context:
            self.to_out = nn.ModuleList([nn.Linear(dim, dim), nn.Dropout(0.0)])
            self.to_add_out = nn.Linear(dim, dim)


class _Proj(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.proj = nn.Linear(dim, hidden)


def _ff(dim, hidden):
    m = nn.Module()
    m.net = nn.ModuleList([_Proj(dim, hidden), nn.Dropout(0.0), nn.Linear(hidden, dim)])
    return m


def _flux_skeleton(dim=128, hidden=256):
    """The module names of diffusers' FluxTransformer2DModel (one double and one single block), small."""
    model = nn.Module()
    double = nn.Module()
    double.attn, double.ff, double.ff_context = _Attn(dim, True), _ff(dim, hidden), _ff(dim, hidden)
    single = nn.Module()
    single.attn = _Attn(dim, False)
    single.proj_mlp = nn.Linear(dim, hidden)
    single.proj_out = nn.Linear(dim + hidden, dim)
    model.transformer_blocks = nn.ModuleList([double])
    model.single_transformer_blocks = nn.ModuleList([single])
    return model


def _flux_checkpoint(dim=128, hidden=256):
    shapes = {"transformer_blocks.0.qkv_proj": (3 * dim, dim), "transformer_blocks.0.qkv_proj_context": (3 * dim, dim),
              "transformer_blocks.0.out_proj": (dim, dim), "transformer_blocks.0.out_proj_context": (dim, dim),
              "transformer_blocks.0.mlp_fc1": (hidden, dim), "transformer_blocks.0.mlp_fc2": (dim, hidden),
              "transformer_blocks.0.mlp_context_fc1": (hidden, dim), "transformer_blocks.0.mlp_context_fc2": (dim, hidden),
              "single_transformer_blocks.0.qkv_proj": (3 * dim, dim), "single_transformer_blocks.0.mlp_fc1": (hidden, dim),
              "single_transformer_blocks.0.out_proj": (dim, dim), "single_transformer_blocks.0.mlp_fc2": (dim, hidden)}
    tensors = {}
    for i, (name, (n, k)) in enumerate(shapes.items()):
        tensors.update(_file_tensors(*_operands(n=n, k=k, r=16, seed=i), prefix=name + "."))
    return tensors


def test_flux_to_diffusers_and_replace():
    got = nk.load_nunchaku(_flux_checkpoint(), progress=False)
    mapped = nk.flux_to_diffusers(got.layers)
    model = _flux_skeleton()
    names = nk.replace_linears_(model, mapped)
    assert len(names) == 17 and all(isinstance(model.get_submodule(n), SVDQLinear) for n in names)
    x = torch.randn(3, 128, dtype=torch.float64)
    qkv = got.layers["transformer_blocks.0.qkv_proj"].forward_reference(x)
    parts = [model.get_submodule(f"transformer_blocks.0.attn.to_{c}").forward_reference(x) for c in "qkv"]
    assert torch.allclose(torch.cat(parts, dim=1), qkv, rtol=1e-12, atol=1e-12)
    xa, xm = torch.randn(3, 128, dtype=torch.float64), torch.randn(3, 256, dtype=torch.float64)
    whole = model.single_transformer_blocks[0].proj_out.forward_reference(torch.cat([xa, xm], dim=1))
    split = (got.layers["single_transformer_blocks.0.out_proj"].forward_reference(xa)
             + got.layers["single_transformer_blocks.0.mlp_fc2"].forward_reference(xm))
    # the two biases add, rounded once to bf16 (Nunchaku's single-block out_proj has a zero bias: exact there)
    bias = model.single_transformer_blocks[0].proj_out.bias.double()
    assert torch.allclose(whole, split, rtol=0, atol=2 ** -8 * float(bias.abs().max()))


def test_load_nunchaku_flux_in_one_call():
    model = _flux_skeleton()
    got = nk.load_nunchaku_flux_(model, _flux_checkpoint(), progress=False)
    assert sorted(got.layers) == sorted(n for n, m in model.named_modules() if isinstance(m, SVDQLinear))
    assert len(got.layers) == 17


def test_flux_mapping_and_replacement_refuse_mismatches():
    got = nk.load_nunchaku(_flux_checkpoint(), progress=False)
    with pytest.raises(ValueError, match="no diffusers module for .*foo"):
        nk.flux_to_diffusers({**got.layers, "transformer_blocks.0.foo": got.layers["transformer_blocks.0.out_proj"]})
    model = _flux_skeleton()
    before = {n: type(m) for n, m in model.named_modules()}
    bad = {"transformer_blocks.0.attn.to_q": got.layers["transformer_blocks.0.mlp_fc2"]}     # [128, 256] ≠ [128, 128]
    with pytest.raises(ValueError, match="to_q"):
        nk.replace_linears_(model, {"transformer_blocks.0.attn.to_add_out": got.layers["transformer_blocks.0.out_proj"],
                                    **bad})
    assert {n: type(m) for n, m in model.named_modules()} == before      # checked first: nothing changed
    with pytest.raises(ValueError, match="no module"):
        nk.replace_linears_(model, {"nope": got.layers["transformer_blocks.0.out_proj"]})


def test_split_and_concat_refuse_bad_arguments():
    layer = nk.svdq_linear_from_nunchaku(_file_tensors(*_operands()))
    with pytest.raises(ValueError, match="sum to out_features"):
        nk.split_rows(layer, [100, 100])
    other = nk.svdq_linear_from_nunchaku(_file_tensors(*_operands(n=128)))
    with pytest.raises(ValueError, match="share out_features"):
        nk.concat_inputs([layer, other])


def test_converted_model_saves_and_loads(tmp_path):
    from lowrank_gemm.quant import load_quantized, save_quantized
    got = nk.load_nunchaku(_flux_checkpoint(), progress=False)
    model = _flux_skeleton().to(torch.bfloat16)
    nk.replace_linears_(model, nk.flux_to_diffusers(got.layers))
    save_quantized(model, tmp_path / "flux.safetensors")
    again = load_quantized(tmp_path / "flux.safetensors", _flux_skeleton().to(torch.bfloat16))
    for name, mod in model.named_modules():
        if isinstance(mod, SVDQLinear):
            for buf, t in mod.state_dict().items():
                assert torch.equal(again.get_submodule(name).state_dict()[buf], t), (name, buf)


@pytest.mark.gpu
def test_converted_layer_runs_the_w4a4_kernels():
    q, s, lam, d, u, b = _operands(n=3072, k=3072, r=32, seed=3)
    layer = nk.svdq_linear_from_nunchaku(_file_tensors(q, s, lam, d, u, b)).cuda()
    for m in (1, 16, 333):
        x = torch.randn(m, 3072, device="cuda").bfloat16()
        got = layer(x)
        ref = layer.forward_reference(x.double())
        assert got.dtype == torch.bfloat16
        assert float((got.double() - ref).norm() / ref.norm()) < 1e-2
        assert torch.equal(layer(x), got)
