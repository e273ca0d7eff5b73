"""The plain values the planner hands to a launcher."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

__all__ = ["KernelConfig", "SPLIT_MODES"]

SPLIT_MODES = ("reduce", "fixup")


@dataclass(frozen=True)
class KernelConfig:
    """Tile and pipeline choices of one launch. Every kernel family reads the fields it needs.

    block_m/n/k: output tile and K step; block_r: rank padded to the MMA's K granularity;
    group_m: rows of tiles per group in the grouped order; split_k: K slices reduced
    deterministically (no atomics); num_stages: main-operand pipeline depth; lowrank_stages:
    low-rank operand pipeline depth (warp-specialized kernels); persistent: grid of #SMs programs;
    split_mode (split_k > 1): "reduce" = partials summed by a second kernel, "fixup" = in the same
    launch, by the last program of each tile to arrive (kernels/splitk.py); swap_ab: the K loop
    multiplies W·Xᵀ (weight rows as the MMA's M, block_m tokens as its N — decode-sized M; the
    LoRA and multi-LoRA main kernels); s_producers (LoRA ``split``, > 0): the down projection's K slices
    are computed by this many extra programs at the head of the main grid, which the main tiles wait
    for after their K loop — one launch instead of the down kernel + the main kernel; epi_stages (LoRA
    persistent kernels): software-pipeline depth of the epilogue's rank-chunk loop, 0 = the compiler's choice
    (num_stages: S and B multi-buffered in shared memory even when the loop runs once, R ≤ block_r).
    """

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    block_r: int = 16
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    lowrank_stages: int = 1
    split_k: int = 1
    persistent: bool = False
    split_mode: str = "reduce"
    swap_ab: bool = False
    s_producers: int = 0
    epi_stages: int = 0

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k", "block_r"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"KernelConfig.{name} must be a power of two ≥ 16, got {v}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"KernelConfig.num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if (self.split_k < 1 or self.num_stages < 1 or self.group_m < 1 or self.lowrank_stages < 0
                or self.s_producers < 0 or self.epi_stages < 0):
            raise ValueError(f"invalid KernelConfig {self}")
        if self.split_mode not in SPLIT_MODES:
            raise ValueError(f"KernelConfig.split_mode must be one of {SPLIT_MODES}, got {self.split_mode!r}")

    def swap_ab_mismatch(self) -> str | None:
        """Why these tiles cannot run swap_ab (None if they can, or swap_ab is off): block_n is then the
        wgmma's M, 64 rows per warpgroup."""
        if self.swap_ab and (self.block_n < 64 or self.block_n < 16 * self.num_warps):
            return (f"swap_ab puts block_n on the wgmma's M: block_n ≥ 64 and ≥ 16·num_warps (the warps' rows), "
                    f"got block_n={self.block_n} with {self.num_warps} warps")
        return None

    def replace(self, **kw) -> "KernelConfig":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "KernelConfig":
        return cls(**d)
