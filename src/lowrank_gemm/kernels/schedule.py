"""Tile order shared by every GEMM kernel (Triton and Gluon) and by the host.

Tiles are visited in *grouped* order: ``GROUP_M`` row-blocks of the output are walked column by
column, so the weight tiles a group reads stay hot in L2 while its ``GROUP_M`` activation row-blocks
are reused across the whole N extent. A persistent grid of ``min(#SMs, tiles)`` programs strides
through this order (``tile_id = pid, pid + grid, ...``).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["grouped_tile", "grouped_tile_host", "persistent_grid", "cdiv", "next_pow2", "device_index"]


# Host arithmetic in plain Python: triton.cdiv / triton.next_power_of_2 are constexpr functions whose Python call
# costs ~5 µs each, and a decode call's launch path used a dozen of them.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two ≥ n (0 for n ≤ 0, as triton.next_power_of_2)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


@triton.jit
def grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Map a linear tile id to (pid_m, pid_n) in grouped order."""
    tiles_per_group = GROUP_M * num_pid_n
    group_id = tile_id // tiles_per_group
    first_pid_m = group_id * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % group_rows)
    pid_n = (tile_id % tiles_per_group) // group_rows
    return pid_m, pid_n


def grouped_tile_host(tile_id: int, num_pid_m: int, num_pid_n: int, group_m: int) -> tuple[int, int]:
    """Host mirror of :func:`grouped_tile` (tests pin the device versions to it)."""
    tiles_per_group = group_m * num_pid_n
    group_id = tile_id // tiles_per_group
    first_pid_m = group_id * group_m
    group_rows = min(num_pid_m - first_pid_m, group_m)
    return first_pid_m + (tile_id % group_rows), (tile_id % tiles_per_group) // group_rows


_SM_COUNT: dict[int, int] = {}


def device_index(device) -> int:
    """The CUDA ordinal of ``device`` (the current device for a bare ``cuda``)."""
    import torch
    return device.index if device.index is not None else torch.cuda.current_device()


def num_sms(device) -> int:
    import torch
    if device.type != "cuda":
        return 4  # interpreter: a few programs, enough to exercise the persistent stride
    idx = device_index(device)
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def persistent_grid(num_tiles: int, device) -> int:
    """Programs in a persistent launch: one per SM, never more than there are tiles."""
    return max(1, min(num_tiles, num_sms(device)))


def short_programs(num_tiles: int, grid: int) -> int:
    """How many of a persistent grid's programs get one tile fewer than the rest when ``grid`` programs stride over
    ``num_tiles`` tiles (none where the tiles split evenly)."""
    rem = num_tiles % grid
    return grid - rem if rem else 0


# S row blocks one program with a tile's worth of slack runs whole in the flat kernel: a block's K loop streams an X
# and an A tile per step against the main loop's X and W tiles, (128 + r) / (128 + 256) of a 128×256 tile's bytes
# (0.375 at r16, 0.5 at r64) on its own pipeline depth, so two fit where the other programs run one tile more
FLAT_S_BLOCKS_PER_SLACK = 2


def flat_programs(num_tiles: int, num_pid_m: int, sms: int) -> int:
    """The flat kernel's programs: one per SM, and where the tiles do not fill the SMs, spare programs past them (up
    to one per S row block) that hold S tasks only, so S is off every tile's critical path."""
    return max(1, min(sms, num_tiles + num_pid_m)) if num_tiles < sms else sms


def flat_s_tasks(num_pid_m: int, tiles: int, grid: int, k_tiles: int) -> tuple[int, int]:
    """``(s_slices, s_programs)`` of the flat kernel's in-grid S tasks. The kernel walks tiles in reverse program
    order, so the programs with slack — one tile fewer (``grid − tiles mod grid`` of them, none where the tiles split
    evenly) or none at all (a grid wider than the tiles) — are the lowest ids: they run the S tasks as whole row
    blocks wherever each gets at most :data:`FLAT_S_BLOCKS_PER_SLACK`. Else every program runs about one short task:
    enough K slices for that (≤ 16 partials to sum), or whole blocks where there are more blocks than programs."""
    slack = grid - tiles if tiles < grid else short_programs(tiles, grid)
    if slack and -(-num_pid_m // slack) <= FLAT_S_BLOCKS_PER_SLACK:
        return 1, min(slack, num_pid_m)
    return max(1, min(16, grid // num_pid_m, k_tiles)), grid
