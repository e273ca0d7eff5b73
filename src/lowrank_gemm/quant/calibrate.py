"""Calibration: forward hooks that record what the smoothing search and the output-error objective need.

Per converted ``nn.Linear`` we keep :class:`ActivationStats`: the per-input-channel absmax over every
calibration row, and a capped uniform random sample of the layer's input rows (bottom-k reservoir on
random keys, so every row has the same chance of being kept whatever the batch order).

``calib_data`` is an iterable of batches: a dict (model kwargs), a tuple/list (positional args) or a
tensor. When a dict batch holds an ``attention_mask`` [B, T] and a layer input is [B, T, K], only the
rows of real tokens are recorded: padding rows would otherwise distort absmax and the objective.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import contextmanager

import torch
from torch import nn


class ActivationStats:
    """Calibration record of one layer's input.

    Attributes:
        name: the layer's qualified name (used in error messages).
        absmax: float32 [K], max |x_k| over every calibration row seen.
        rows_seen: number of rows recorded.
        sample: float32 [S, K], S ≤ cap, a uniform random subset of the rows.
    """

    def __init__(self, name: str, in_features: int, cap: int, seed: int = 0):
        self.name = name
        self.cap = cap
        self.absmax = torch.zeros(in_features)
        self.rows_seen = 0
        self._rows = torch.empty(0, in_features)
        self._keys = torch.empty(0)
        self._gen = torch.Generator().manual_seed(seed)

    def add(self, x: torch.Tensor) -> None:
        """Record rows ``x`` [M, K]; raises ValueError naming the layer on NaN/Inf."""
        x = x.detach().float().cpu()
        if not torch.isfinite(x).all():
            raise ValueError(f"calibration input of layer '{self.name}' contains NaN or Inf")
        if x.shape[0] == 0:
            return
        self.absmax = torch.maximum(self.absmax, x.abs().amax(dim=0))
        self.rows_seen += x.shape[0]
        keys = torch.rand(x.shape[0], generator=self._gen)
        self._rows = torch.cat([self._rows, x])
        self._keys = torch.cat([self._keys, keys])
        if self._rows.shape[0] > self.cap:
            keep = torch.topk(self._keys, self.cap, largest=False).indices.sort().values
            self._rows, self._keys = self._rows[keep], self._keys[keep]

    @property
    def sample(self) -> torch.Tensor:
        return self._rows

    @classmethod
    def from_tensor(cls, name: str, x: torch.Tensor, cap: int) -> "ActivationStats":
        """Stats of a given input tensor [..., K] (used by ``SVDQLinear.from_linear``)."""
        stats = cls(name, x.shape[-1], cap)
        stats.add(x.reshape(-1, x.shape[-1]))
        return stats


def collect_activation_stats(
    model: nn.Module, layers: dict[str, nn.Linear], calib_data: Iterable, cap: int
) -> dict[str, ActivationStats]:
    """Run ``model`` over ``calib_data`` once with hooks on ``layers``; returns stats by layer name."""
    stats = {name: ActivationStats(name, m.in_features, cap, seed=i) for i, (name, m) in enumerate(layers.items())}
    mask_box: list[torch.Tensor | None] = [None]

    def make_hook(record: ActivationStats):
        def hook(_module, args):
            x = args[0]
            mask = mask_box[0]
            if mask is not None and x.dim() == 3 and tuple(x.shape[:2]) == tuple(mask.shape):
                record.add(x[mask.bool()])
            else:
                record.add(x.reshape(-1, x.shape[-1]))

        return hook

    with _hooks([m.register_forward_pre_hook(make_hook(stats[n])) for n, m in layers.items()]):
        run_batches(model, calib_data, mask_box)
    return stats


@torch.no_grad()
def run_batches(model: nn.Module, batches: Iterable, mask_box: list | None = None) -> None:
    """Feed each batch to ``model`` (dict → kwargs, tuple → args, tensor → one arg)."""
    for batch in batches:
        if mask_box is not None:
            mask_box[0] = batch.get("attention_mask") if isinstance(batch, dict) else None
        if isinstance(batch, dict):
            model(**batch)
        elif isinstance(batch, (tuple, list)):
            model(*batch)
        else:
            model(batch)


@contextmanager
def _hooks(handles):
    try:
        yield
    finally:
        for h in handles:
            h.remove()
