"""Tensor parallelism over ``torch.distributed`` for the fused low-rank layers (Megatron-style column / row sharding).

Supported layers: ``nn.Linear``, :class:`~lowrank_gemm.nn.LoRALinear`, :class:`~lowrank_gemm.nn.MultiLoRALinear`
and :class:`~lowrank_gemm.nn.SVDQLinear` (W4A4 / W4A16). A sharded layer is the same class holding its slice, wrapped
in :class:`ColumnParallel` or :class:`RowParallel`, which does the communication; the kernels never see more than
one rank's slice, so every fused path (LoRA strategies, multi-LoRA, the W4A4 kernels) runs unchanged.

Column-parallel (the output features are split, ``y = [y_0 | y_1 | …]``): rank ``i`` keeps the rows
``[i·N/p, (i+1)·N/p)`` of everything indexed by N — W, bias, B / lora_up, the W4A4 group scales' columns, the
multi-LoRA ``bank_b`` — while A / lora_down / smooth / ``bank_a`` are replicated. The rank's branch
``(x·Aᵀ)·B_iᵀ`` is exactly its slice of the full branch. The output stays sharded (``gather_output=False``, the input
of a following row-parallel layer) or is all-gathered.

Row-parallel (the input features are split): rank ``i`` keeps the columns ``[i·K/p, (i+1)·K/p)`` of everything
indexed by K — W, A / lora_down, smooth, the packed int4 bytes and group-scale rows, ``bank_a`` — and B / lora_up /
``bank_b`` are replicated. By linearity ``Σ_i (x_i·A_iᵀ)·Bᵀ = (x·Aᵀ)·Bᵀ``, so each rank runs the whole fused op on its
slice and ONE all-reduce sums base and branch together — the low-rank branch costs no extra communication. The bias
is added once, after the reduction. For SVDQLinear the shard width is a multiple of the group size, so no activation
group straddles two ranks and every rank quantizes its slice exactly as the unsharded layer would (the outputs
differ from the unsharded layer only by the order of the final sum, and by the cast if ``reduce_dtype`` is the
output dtype) — except in the two-level format (``weight_format="int4_2l"``), whose activations carry one scale per
token over the whole row: a row shard scales each token over its own K slice (a finer scale, not the same bits; its
weights are exact, the row scales kept whole and the group multipliers sliced).

    import torch.distributed as dist
    from lowrank_gemm.nn.parallel import parallelize_
    dist.init_process_group("nccl")
    parallelize_(model, {"mlp.gate_up": "column", "mlp.down": "row", "attn.qkv": "column", "attn.o": "row"})

Shards are contiguous copies of the slices (never views), so the full weights can be freed afterwards. The wrappers use
functional collectives, so a parallel model traces whole under ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import fnmatch
from typing import Mapping

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch import nn

from .lora import LoRALinear
from .multilora import AdapterBank, MultiLoRALinear
from .svdq import SVDQLinear

__all__ = ["ColumnParallel", "RowParallel", "shard_columns", "shard_rows", "parallelize_"]


def _span(total: int, rank: int, world: int, unit: int, what: str) -> slice:
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    if total % (world * unit):
        raise ValueError(f"{what}={total} must split into {world} shards of a multiple of {unit}")
    width = total // world
    return slice(rank * width, (rank + 1) * width)


def _view(t: torch.Tensor, dim: int, span: slice) -> torch.Tensor:
    return t.narrow(dim, span.start, span.stop - span.start)


def _piece(t: torch.Tensor | None, dim: int, span: slice) -> torch.Tensor | None:
    """A contiguous copy of the slice (never a view: a view would keep the full tensor's storage alive)."""
    return None if t is None else _view(t.detach(), dim, span).clone(memory_format=torch.contiguous_format)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    lin.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        lin.bias = nn.Parameter(bias, requires_grad=False)
    return lin


def _bank(bank: AdapterBank, a: torch.Tensor, b: torch.Tensor) -> AdapterBank:
    out = AdapterBank.__new__(AdapterBank)
    nn.Module.__init__(out)
    out.r_max, out.in_features, out.out_features = bank.r_max, a.shape[2], b.shape[1]
    out.register_buffer("bank_a", a)
    out.register_buffer("bank_b", b)
    out.register_buffer("ranks", bank.ranks.clone())
    out.register_buffer("scales", bank.scales.clone())
    out.names = dict(bank.names)
    return out


def shard_columns(layer: nn.Module, rank: int, world: int) -> nn.Module:
    """Rank ``rank``'s column-parallel slice of ``layer`` (output features ``[rank·N/world, (rank+1)·N/world)``), a
    new module of the same class; ``layer`` is not modified."""
    if isinstance(layer, SVDQLinear):
        n = _span(layer.out_features, rank, world, 1, "out_features")
        out = _svdq_like(layer, layer.in_features, n.stop - n.start, layer.bias is not None)
        out.qweight = _piece(layer.qweight, 0, n)
        if layer.weight_format == "int4_2l":      # row scales s [N], group multipliers u [K/G, N]
            out.wscales, out.wmul = _piece(layer.wscales, 0, n), _piece(layer.wmul, 1, n)
        else:
            out.wscales = _piece(layer.wscales, 1, n)
        out.smooth, out.lora_down = layer.smooth.clone(), layer.lora_down.clone()
        out.lora_up, out.bias = _piece(layer.lora_up, 0, n), _piece(layer.bias, 0, n)
        out.refresh_act_shift()
        return out
    if isinstance(layer, MultiLoRALinear):
        n = _span(layer.out_features, rank, world, 1, "out_features")
        base = _linear(_piece(layer.base.weight, 0, n), _piece(layer.base.bias, 0, n))
        return _fp8_like(layer, MultiLoRALinear(base, _bank(layer.bank, layer.bank.bank_a.clone(),
                                                            _piece(layer.bank.bank_b, 1, n)), layer.adapter_ids), n)
    if isinstance(layer, LoRALinear):
        n = _span(layer.out_features, rank, world, 1, "out_features")
        base = _linear(_piece(layer.weight, 0, n), _piece(layer.bias, 0, n))
        return _fp8_like(layer, LoRALinear.from_linear(base, _copy(layer.lora_a), _piece(layer.lora_b, 0, n),
                                                       layer.scale, strategy=layer.strategy), n)
    if isinstance(layer, nn.Linear):
        n = _span(layer.out_features, rank, world, 1, "out_features")
        return _linear(_piece(layer.weight, 0, n), _piece(layer.bias, 0, n))
    raise TypeError(f"no column sharding for {type(layer).__name__} (nn.Linear, LoRALinear, MultiLoRALinear, "
                    f"SVDQLinear)")


def shard_rows(layer: nn.Module, rank: int, world: int) -> tuple[nn.Module, torch.Tensor | None]:
    """Rank ``rank``'s row-parallel slice of ``layer`` (input features ``[rank·K/world, (rank+1)·K/world)``) without
    its bias, and the bias (added once, after the all-reduce, by :class:`RowParallel`)."""
    if isinstance(layer, SVDQLinear):
        # whole groups and whole 64-wide packing blocks per shard: the activation quantization does not change
        unit = max(layer.group_size, 64)
        k = _span(layer.in_features, rank, world, unit, "in_features")
        out = _svdq_like(layer, k.stop - k.start, layer.out_features, False)
        out.qweight = _piece(layer.qweight, 1, slice(k.start // 2, k.stop // 2))
        groups = slice(k.start // layer.group_size, k.stop // layer.group_size)
        if layer.weight_format == "int4_2l":      # each output channel keeps its row scale, the slice its groups' u
            out.wscales, out.wmul = _copy(layer.wscales), _piece(layer.wmul, 0, groups)
        else:
            out.wscales = _piece(layer.wscales, 0, groups)
        out.smooth, out.lora_down = _piece(layer.smooth, 0, k), _piece(layer.lora_down, 1, k)
        out.lora_up = layer.lora_up.clone()
        out.refresh_act_shift()
        return out, _copy(layer.bias)
    if isinstance(layer, MultiLoRALinear):
        k = _span(layer.in_features, rank, world, 1, "in_features")
        base = _linear(_piece(layer.base.weight, 1, k), None)
        bank = _bank(layer.bank, _piece(layer.bank.bank_a, 2, k), layer.bank.bank_b.clone())
        return _fp8_like(layer, MultiLoRALinear(base, bank, layer.adapter_ids)), _copy(layer.base.bias)
    if isinstance(layer, LoRALinear):
        k = _span(layer.in_features, rank, world, 1, "in_features")
        base = _linear(_piece(layer.weight, 1, k), None)
        return (_fp8_like(layer, LoRALinear.from_linear(base, _piece(layer.lora_a, 1, k), _copy(layer.lora_b),
                                                        layer.scale, strategy=layer.strategy)), _copy(layer.bias))
    if isinstance(layer, nn.Linear):
        k = _span(layer.in_features, rank, world, 1, "in_features")
        return _linear(_piece(layer.weight, 1, k), None), _copy(layer.bias)
    raise TypeError(f"no row sharding for {type(layer).__name__} (nn.Linear, LoRALinear, MultiLoRALinear, "
                    f"SVDQLinear)")


def _copy(t):
    return None if t is None else t.detach().clone()


def _fp8_like(layer: nn.Module, out: nn.Module, n: slice | None = None) -> nn.Module:
    """An fp8 base (``quantize_weight_fp8_``) carried into a shard: the per-output-channel scale sliced with the
    columns (``n``) or whole (a row shard keeps every output channel), and the fp8-activation mode. Row shards with
    fp8 x then scale each token per K slice, i.e. each rank quantizes its own slice of x (a finer scale than the
    unsharded layer's, not the same bits)."""
    ws = getattr(layer, "weight_scale", None)
    if ws is not None:
        out.weight_scale = _copy(ws) if n is None or ws.numel() == 1 else _piece(ws.reshape(-1), 0, n)
        out.fp8_activations = layer.fp8_activations
    return out


def _svdq_like(layer: SVDQLinear, k: int, n: int, bias: bool) -> SVDQLinear:
    out = SVDQLinear(k, n, layer.rank, layer.group_size, bias, layer.act_bits, layer.wscales.dtype,
                     layer.lora_down.dtype, layer.bias.dtype if layer.bias is not None else torch.float32,
                     layer.config, act_shift=layer.act_shift,   # a shard's shift vector follows its λ slice
                     weight_format=layer.weight_format)
    out._forward_kernel, out.use_kernels = layer._forward_kernel, getattr(layer, "use_kernels", True)
    return out.to(layer.qweight.device)


# functional collectives: they return new tensors and trace under torch.compile(fullgraph=True)
_all_gather = getattr(fc, "all_gather_single", None) or fc.all_gather_tensor


def _group(group):
    return group if group is not None else dist.group.WORLD


def _group_info(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("tensor parallelism needs torch.distributed initialized (dist.init_process_group)")
    return dist.get_rank(group), dist.get_world_size(group)


class ColumnParallel(nn.Module):
    """A column-parallel slice (:func:`shard_columns`) of ``layer`` on this rank of ``group``: ``forward(x)`` with the
    full input gives this rank's output features, or all of them (all-gathered, rank order) with
    ``gather_output=True``."""

    def __init__(self, layer: nn.Module, group=None, *, gather_output: bool = False):
        super().__init__()
        self.group, self.gather_output = group, gather_output
        self.rank, self.world = _group_info(group)
        self.out_features = layer.out_features
        self.shard = shard_columns(layer, self.rank, self.world)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.shard(x)
        if not self.gather_output or self.world == 1:
            return y
        return _all_gather(y.contiguous(), y.dim() - 1, _group(self.group))

    def set_adapter(self, slot: int, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float = 1.0,
                    name: str | None = None) -> None:
        """Write a full-size adapter (A [r, K], B [N, r]) into a sharded MultiLoRALinear's bank: this rank's rows of
        B, all of A."""
        n = _span(self.out_features, self.rank, self.world, 1, "out_features")
        self.shard.bank.set_adapter(slot, lora_a, _view(lora_b, 0, n), scale, name=name)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, world={self.world}, gather_output={self.gather_output}"


class RowParallel(nn.Module):
    """A row-parallel slice (:func:`shard_rows`) of ``layer`` on this rank of ``group``: ``forward(x)`` takes this
    rank's input features (``input_is_parallel=True``, the output of a column-parallel layer) or the full input
    (sliced here), runs the fused op on the slice, all-reduces (in ``reduce_dtype``, default the output dtype) and
    adds the bias once."""

    def __init__(self, layer: nn.Module, group=None, *, input_is_parallel: bool = True,
                 reduce_dtype: torch.dtype | None = None):
        super().__init__()
        self.group, self.input_is_parallel, self.reduce_dtype = group, input_is_parallel, reduce_dtype
        self.rank, self.world = _group_info(group)
        self.in_features = layer.in_features
        self.shard, bias = shard_rows(layer, self.rank, self.world)
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.shard.in_features
        if not self.input_is_parallel:
            x = _view(x, x.dim() - 1, _span(x.shape[-1], self.rank, self.world, 1, "input features")).contiguous()
        if x.shape[-1] != k:
            raise ValueError(f"RowParallel rank {self.rank}: expected {k} input features (this rank's slice of "
                             f"{self.in_features}), got {x.shape[-1]}")
        y = self.shard(x)
        out_dtype = y.dtype
        if self.reduce_dtype is not None:
            y = y.to(self.reduce_dtype)
        if self.world > 1:
            # waited here, not at the first use: a CUDA graph captured around a model that ends in this layer (no
            # bias, no cast after it) must join the collective's stream inside the capture
            y = fc.wait_tensor(fc.all_reduce(y, "sum", _group(self.group)))
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.to(out_dtype)

    def set_adapter(self, slot: int, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float = 1.0,
                    name: str | None = None) -> None:
        """Write a full-size adapter (A [r, K], B [N, r]) into a sharded MultiLoRALinear's bank: this rank's columns
        of A, all of B."""
        k = _span(self.in_features, self.rank, self.world, 1, "in_features")
        self.shard.bank.set_adapter(slot, _view(lora_a, 1, k), lora_b, scale, name=name)

    def extra_repr(self) -> str:
        return (f"rank={self.rank}, world={self.world}, input_is_parallel={self.input_is_parallel}, "
                f"reduce_dtype={self.reduce_dtype}")


def parallelize_(model: nn.Module, plan: Mapping[str, str | tuple[str, dict]], group=None) -> nn.Module:
    """Replace the layers of ``model`` named by ``plan`` (fnmatch patterns over ``named_modules`` names) with their
    parallel slices on this rank, in place: ``"column"`` / ``"row"``, or ``("column", {"gather_output": True})`` /
    ``("row", {"input_is_parallel": False, "reduce_dtype": torch.float32})``. Every pattern must match at least one
    layer. Returns ``model``."""
    styles = {"column": ColumnParallel, "row": RowParallel}
    names = [n for n, _ in model.named_modules() if n]
    todo = []
    for pattern, spec in plan.items():
        style, kwargs = (spec, {}) if isinstance(spec, str) else spec
        if style not in styles:
            raise ValueError(f"plan[{pattern!r}]: style must be 'column' or 'row', got {style!r}")
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise ValueError(f"plan[{pattern!r}] matches no layer of the model")
        todo += [(n, styles[style], kwargs) for n in hits]
    for name, cls, kwargs in todo:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, cls(getattr(parent, attr), group, **kwargs))
    return model
