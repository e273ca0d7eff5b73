"""Tensor parallelism (nn/parallel.py): every rank's slice of every supported layer, simulated in one process
(column shards concatenated, row shards summed + bias = the unsharded layer), bad shardings, and one real
two-process run over gloo (``parallelize_`` on a small model: column → row, a gathered column, a row layer that
slices its own input, a multi-LoRA layer with adapters written after sharding).

    CPU:  PYTHONPATH=src python -m pytest -q tests/test_parallel.py
"""

import os
import sys
import tempfile

import pytest
import torch
from torch import nn

from lowrank_gemm.nn import AdapterBank, LoRALinear, MultiLoRALinear, SVDQLinear
from lowrank_gemm.nn.multilora import AdapterIds
from lowrank_gemm.nn.parallel import ColumnParallel, RowParallel, parallelize_, shard_columns, shard_rows
from lowrank_gemm.quant.config import SVDQuantConfig

K, N, R = 256, 96, 8


DT = torch.float16          # the fused ops take fp16 / bf16 (fp16: exact in the interpreter too)
TOL = dict(rtol=4e-3, atol=4e-3)   # row shards: each rank's fp16 output rounds once before the sum


def _linear(seed, k=K, n=N, bias=True):
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
        if bias:
            lin.bias.normal_(0, 0.1)
    return lin.to(DT)


def _layers(seed=0):
    """One of each supported layer, fp16 on the CPU (LoRA through the op's torch path, SVDQ its reference)."""
    g = torch.Generator().manual_seed(seed)
    lora = LoRALinear.from_linear(_linear(seed), torch.randn(R, K, generator=g) * 0.1,
                                  torch.randn(N, R, generator=g) * 0.1, 0.5, strategy="torch")
    ids = AdapterIds(mode="gather")
    multi = MultiLoRALinear(_linear(seed + 1), AdapterBank(4, R, K, N, dtype=DT), ids)
    for slot, r in ((0, R), (2, 4)):
        multi.bank.set_adapter(slot, torch.randn(r, K, generator=g) * 0.1, torch.randn(N, r, generator=g) * 0.1,
                               0.25 * (slot + 1))
    ids.set(torch.tensor([0, -1, 2, 2, 0]))
    calib = torch.randn(64, K, generator=g).to(DT)
    svdq = SVDQLinear.from_linear(_linear(seed + 2), SVDQuantConfig(rank=R, group_size=64), calib)
    svdq_2l = SVDQLinear.from_linear(_linear(seed + 6), SVDQuantConfig(rank=R, weight_format="int4_2l"), calib)
    lora8 = LoRALinear.from_linear(_linear(seed + 4), torch.randn(R, K, generator=g) * 0.1,
                                   torch.randn(N, R, generator=g) * 0.1, 0.5, strategy="torch")
    ids8 = AdapterIds(mode="gather")
    multi8 = MultiLoRALinear(_linear(seed + 5), AdapterBank(4, R, K, N, dtype=DT), ids8)
    multi8.bank.set_adapter(1, torch.randn(R, K, generator=g) * 0.1, torch.randn(N, R, generator=g) * 0.1, 0.5)
    ids8.set(torch.tensor([1, -1, 1, 1, -1]))
    return {"linear": _linear(seed + 3), "lora": lora, "multilora": multi, "svdq": svdq, "svdq_2l": svdq_2l,
            "lora_fp8": lora8.quantize_weight_fp8_(activations=True), "multilora_fp8": multi8.quantize_weight_fp8_(
                activations=2)}


KINDS = ["linear", "lora", "multilora", "svdq", "svdq_2l", "lora_fp8", "multilora_fp8"]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_column_shards_concatenate_to_the_layer(kind, world):
    layer = _layers()[kind]
    x = torch.randn(5, K).to(DT)
    want = layer(x)
    shards = [shard_columns(layer, i, world) for i in range(world)]
    assert all(type(s) is type(layer) and s.out_features == N // world for s in shards)
    got = torch.cat([s(x) for s in shards], dim=-1)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    if kind.endswith("fp8"):      # the fp8 base travels: each shard's own columns of the per-channel scale
        assert all(s.fp8_activations == layer.fp8_activations for s in shards)
        assert torch.equal(torch.cat([s.weight_scale for s in shards]), layer.weight_scale)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_row_shards_sum_to_the_layer(kind, world):
    """Σ over ranks of the whole fused op on each K slice, plus the bias once, is the layer: the low-rank branch
    splits by linearity, and the W4A4 activation groups never straddle a shard."""
    layer = _layers()[kind]
    x = torch.randn(5, K).to(DT)
    want = layer(x).float()
    width = K // world
    total = 0
    for i in range(world):
        shard, bias = shard_rows(layer, i, world)
        assert type(shard) is type(layer) and shard.in_features == width
        assert getattr(shard, "bias", None) is None and getattr(getattr(shard, "base", None), "bias", None) is None
        total = total + shard(x[:, i * width:(i + 1) * width]).float()
        if kind.endswith("fp8"):
            assert torch.equal(shard.weight_scale, layer.weight_scale) and shard.fp8_activations
    if kind == "lora_fp8":
        # fp8 x: each rank scales its tokens over its own K slice, so the sum is the layer on x quantized per
        # (token, slice): the layer on the 16-bit x plus each slice's quantization error times its W columns
        from lowrank_gemm.kernels.row_quant import fp8_rows
        w = layer.weight.double() * layer.weight_scale.double()[:, None]
        layer.fp8_activations = 0
        want = layer(x).double()
        for i in range(world):
            xi = x[:, i * width:(i + 1) * width]
            q, sc = fp8_rows(xi)
            want += (q.double() * sc.double()[:, None] - xi.double()) @ w[:, i * width:(i + 1) * width].T
        want = want.float()
    if kind == "svdq_2l":
        # two-level activations: one scale per token over the row, so each rank scales its tokens over its own
        # K slice — the sum is the float64 spec on each slice with the layer's own (sliced) weights
        from lowrank_gemm.reference import svdq_linear_ref
        g = layer.group_size
        want = sum(svdq_linear_ref(x[:, i * width:(i + 1) * width], layer.qweight[:, i * width // 2:(i + 1) * width // 2],
                                   layer.wscales, layer.smooth[i * width:(i + 1) * width],
                                   layer.lora_down[:, i * width:(i + 1) * width], layer.lora_up, None, g,
                                   fmt="int4_2l", wmul=layer.wmul[i * width // g:(i + 1) * width // g])
                   for i in range(world))
        want = (want + layer.bias.double()).float()
        assert torch.equal(shard.wscales, layer.wscales)
    torch.testing.assert_close(total + bias.float(), want, **TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_shards_are_copies_and_the_layer_is_untouched(kind):
    """No shard tensor shares storage with the full layer (a view of a dim-0 slice would keep the whole weight
    alive after the model is parallelized), and sharding leaves the layer as it was."""
    layer = _layers()[kind]
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    full = {t.untyped_storage().data_ptr() for t in layer.state_dict().values()}
    for rank in (0, 1):
        for shard in (shard_columns(layer, rank, 2), shard_rows(layer, rank, 2)[0]):
            for name, t in shard.state_dict().items():
                assert t.is_contiguous() and t.untyped_storage().data_ptr() not in full, (kind, name)
    assert all(torch.equal(before[k], v) for k, v in layer.state_dict().items())


def test_bad_shardings():
    layers = _layers()
    with pytest.raises(ValueError, match="out_features=96 must split into 5 shards"):
        shard_columns(layers["lora"], 0, 5)
    with pytest.raises(ValueError, match="in_features=256 must split into 8 shards of a multiple of 64"):
        shard_rows(layers["svdq"], 0, 8)                 # 32-wide shards would cut W4A4 groups
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2"):
        shard_columns(layers["linear"], 2, 2)
    with pytest.raises(TypeError, match="no column sharding for Conv1d"):
        shard_columns(nn.Conv1d(4, 4, 1), 0, 2)
    with pytest.raises(RuntimeError, match="torch.distributed initialized"):
        ColumnParallel(layers["linear"])


class _Block(nn.Module):
    """up: LoRA K → K (column) · relu · down: W4A4 K → K (row) · then head: Linear K → N (column, gathered) and
    multi: multi-LoRA K → N (row, slicing its own full input)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.up = LoRALinear.from_linear(_linear(3, n=K), torch.randn(R, K, generator=g) * 0.1,
                                         torch.randn(K, R, generator=g) * 0.1, 0.5, strategy="torch")
        self.down = SVDQLinear.from_linear(_linear(4, n=K), SVDQuantConfig(rank=R, group_size=64),
                                           torch.randn(64, K, generator=g).to(DT))
        self.head = _linear(6)
        self.multi = _layers(8)["multilora"]

    def trunk(self, x):
        return self.down(torch.relu(self.up(x)))


def _worker(rank, world, init_file, results, backend="gloo"):
    import copy
    import torch.distributed as dist
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        x = torch.randn(5, K).to(DT).to(dev)
        model = _Block().to(dev)
        y = model.trunk(x)
        want_head = model.head(y)
        g = torch.Generator().manual_seed(11)
        extra_a = (torch.randn(R, K, generator=g) * 0.1).to(DT).to(dev)
        extra_b = (torch.randn(N, R, generator=g) * 0.1).to(DT).to(dev)
        reference_multi = copy.deepcopy(model.multi)
        reference_multi.bank.set_adapter(1, extra_a, extra_b, 0.5)
        model.multi.adapter_ids.set(torch.tensor([1, -1, 2, 1, 0], device=dev))
        reference_multi.adapter_ids = model.multi.adapter_ids
        want_multi = reference_multi(y)
        parallelize_(model, {"up": "column", "down": "row", "head": ("column", {"gather_output": True}),
                             "multi": ("row", {"input_is_parallel": False})})
        assert isinstance(model.up, ColumnParallel) and isinstance(model.down, RowParallel)
        assert model.up.shard.out_features == K // world and model.down.shard.in_features == K // world
        model.multi.set_adapter(1, extra_a, extra_b, 0.5)      # a full-size adapter written after sharding
        y_tp = model.trunk(x)
        got_head, got_multi = model.head(y_tp), model.multi(y_tp)
        compiled = torch.compile(lambda v: model.head(model.trunk(v)), fullgraph=True, backend="aot_eager")
        assert torch.equal(compiled(x), got_head), "the parallel model traces whole under torch.compile"
        bare = _linear(12, bias=False).to(dev)
        want_bare = bare(y)
        got_bare = RowParallel(bare, input_is_parallel=False)(y)
        # the all-reduce is waited inside the layer (a CUDA graph ending here joins the collective's stream)
        assert type(got_bare) is torch.Tensor, type(got_bare)
        assert float((got_bare - want_bare).abs().max()) < 5e-3
        results[rank] = (float((y_tp - y).abs().max()), float((got_head - want_head).abs().max()),
                         float((got_multi - want_multi).abs().max()), tuple(got_head.shape), tuple(got_multi.shape))
        dist.barrier()      # every rank past its last collective before any closes its sockets
    finally:
        dist.destroy_process_group()
    # no interpreter finalization while gloo's threads may still free tensors (bench/tp.py's _exit_past_gloo: an
    # abort at exit otherwise); a failed rank raised above
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_two_processes_over_gloo():
    """parallelize_ on two ranks: the column layer's sharded output feeds the row layer directly (one all-reduce),
    the gathered column layer returns every feature, the row multi-LoRA layer slices its full input itself; both
    ranks reproduce the unsharded model."""
    _two_ranks("gloo")


@pytest.mark.gpu
def test_gpu_two_gpus_over_nccl():
    """The same on two GPUs over NCCL, through the fused CUDA kernels (needs the two-GPU machine)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    _two_ranks("nccl")


def _two_ranks(backend):
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as d:
        ctx = mp.get_context("spawn")
        results = ctx.Manager().dict()
        procs = [ctx.Process(target=_worker, args=(r, 2, os.path.join(d, "init"), results, backend))
                 for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    for rank in range(2):
        trunk_err, head_err, multi_err, head_shape, multi_shape = results[rank]
        assert head_shape == (5, N) and multi_shape == (5, N)
        assert max(trunk_err, head_err, multi_err) < 5e-3, (rank, trunk_err, head_err, multi_err)


def test_parallelize_plan_errors(monkeypatch):
    import torch.distributed as dist
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    model = nn.Sequential(_linear(0), nn.ReLU(), _linear(1, k=N, n=K))
    with pytest.raises(ValueError, match="matches no layer"):
        parallelize_(model, {"nothing.*": "column"})
    with pytest.raises(ValueError, match="style must be 'column' or 'row'"):
        parallelize_(model, {"0": "diagonal"})
    parallelize_(model, {"0": "column", "2": "row"})
    assert isinstance(model[0], ColumnParallel) and model[0].shard.out_features == N // 2
    assert isinstance(model[2], RowParallel) and model[2].shard.in_features == N // 2
