"""Strategy and launch configuration per shape: the user's own tuned table first (``python -m lowrank_gemm tune
lora``, :mod:`.autotune`), then the shipped tuned table, heuristic fallback.

One small pure function per knob (``block_r_for``, ``tile_for``, ``split_k_for``,
``stages_for``, ``group_m_for``) so other kernel families can reuse them; per-family planning
functions (``plan_lora``) combine them and filter with the family's ``can_implement``.

The only override is the scoped :func:`pinned` context manager (a ``ContextVar``), for tests and
benchmarks; there is no other module state besides the read-only tuned-table cache.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Sequence

import torch

from ..kernels.env import getenv
from ..kernels.epilogue import rank_block
from ..kernels.schedule import cdiv, device_index, next_pow2
from .config import SPLIT_MODES, KernelConfig
from .smem import SmemError, SmemLedger, solve_stages
from .tuned import TUNED_DIR, table_entries, tuned_file, user_tuned_file

__all__ = ["LoraStrategy", "LORA_STRATEGIES", "plan_lora", "can_implement", "pinned", "Pinned",
           "block_r_for", "tile_for", "split_k_for", "stages_for", "group_m_for", "m_bucket",
           "r_bucket", "tuned_key", "load_tuned", "clear_plan_cache", "heuristic_lora", "MAX_FUSED_RANK", "TUNED_DIR",
           "SPLIT_BLOCK_R", "split_mode_override", "SPLIT_MODE_ENV", "FIXUP_STRATEGIES",
           "fixup_dp_tiles", "wave_split", "fixup_makespan", "makespan_split", "PIECE_OVERHEAD", "measured_tile",
           "wide_tiles_pay", "takes_wide_tiles", "one_wave_kloop_tile", "one_wave_persistent_tile", "entry_serves",
           "WIDE_TILE_SPEEDUP", "user_plan", "table_plan", "resolve_device"]

MAX_FUSED_RANK = 128      # S lives in registers ([BM, BLOCK_R] fp32) in kloop / persistent
# split's epilogue walks the rank in BLOCK_R chunks (unrolled). ptxas -v, 128×256×64 8 warps
# GLOBAL: one 64-wide chunk 255 regs + 460 B spill stores; 2×32: 48 B; 4×16: 253 regs, no spill
SPLIT_BLOCK_R = 16
M_BUCKETS = (1, 16, 64, 256, 1024, 4096)
R_BUCKETS = (16, 64, 128)


class LoraStrategy(str, Enum):
    """How the low-rank branch is fused (DESIGN.md §3)."""

    STREAMS = "streams"
    """Base GEMM (our kernel, rank 0) ‖ S = X·Aᵀ on a side stream, then Y += scale·S·Bᵀ (addmm)."""
    SPLIT = "split"
    """S = scale·X·Aᵀ by a small kernel (fp32 [M, r]); the main kernel adds S·Bᵀ in its epilogue."""
    KLOOP = "kloop"
    """One kernel: S tile accumulated from the X tiles the main loop already loads; epilogue S·Bᵀ."""
    CONCAT = "concat"
    """One GEMM over the cached [W; A] into fp32 [Y | S], then an epilogue kernel adds S·Bᵀ."""
    PERSISTENT_STATIC = "persistent_static"
    """Persistent grid, S tasks first then main tiles in grouped order, static stripes."""
    PERSISTENT_DYNAMIC = "persistent_dynamic"
    """Same, tasks handed out by an atomic work counter (results stay deterministic)."""
    FLAT = "flat"
    """Persistent grid of plain tiles whose tile loop and K loop are one software-pipelined loop (the next tile's
    loads overlap this tile's epilogue); S tasks first in the same grid, up to two whole row blocks on each program
    with one tile fewer or none (spare programs past the tiles), K-sliced over every program where they do not fit
    there, waited for once after each program's first tile; the branch after the K loop by TMA, the rank in one chunk
    (r ≤ block_r ≤ 64, r a multiple of 8). Sessions 49–51; ``auto`` routes it on wide layers at r > 16 and on
    narrow ones (N ≤ 4096) at every rank (:func:`flat_plan`)."""
    STREAMK = "streamk"
    """Stream-K: #SMs programs split tiles × K steps evenly; split tiles are summed in segment
    order by their last arriver (ticket). A probe candidate only: never chosen by the heuristic."""
    MERGED = "merged"
    """W' = W + scale·B·A, cached by the tensors' identity and version; then a plain GEMM."""
    KCAT = "kcat"
    """The branch in the base GEMM's K: [x | scale·x·Aᵀ]·[W | B]ᵀ by cuBLAS (:mod:`..kernels.lora_kcat`), x and S
    concatenated by one memory-bound kernel; [W | B] is the packed layout's view (``pack_lora_weights``) or cached."""
    TORCH = "torch"
    """Unfused PyTorch in fp32 (the fallback on CPU without the Triton interpreter)."""
    UNFUSED = "unfused"
    """Three library GEMMs in the input dtype — x·Wᵀ (+ bias), S = x·Aᵀ, then Y += scale·S·Bᵀ —, what PyTorch runs
    without this package. Never planned by the rules: only a user's own tuned table (:mod:`.autotune`) routes it, where
    it measured fastest on that GPU for that shape."""


LORA_STRATEGIES = tuple(s.value for s in LoraStrategy)
_FUSED_RANK_LIMITED = ("kloop", "persistent_static", "persistent_dynamic", "streamk", "flat")
_NO_SPLIT_K = ("persistent_static", "persistent_dynamic", "streamk", "torch", "unfused", "kcat", "flat")
# strategies whose main kernel is lora_main_kernel (KernelConfig.swap_ab reaches its K loop); kloop's S = A·Xᵀ is
# then a wgmma with block_r on its M, so block_r ≥ 64 (an mma.sync of block_m rows instead: ptxas serializes every
# wgmma, C7515, sm_90 AOT)
SWAP_AB_STRATEGIES = ("kloop", "split", "concat", "streams", "merged")
# strategies whose split-K can reduce in the main launch (split_mode "fixup"); concat's epilogue
# needs the summed S columns of every N-tile, so it keeps the reduce kernel
FIXUP_STRATEGIES = ("kloop", "split", "streams", "merged")
# "reduce" | "fixup": forces the split-K mode of every plan with split_k > 1 (tuned entries
# included); unset: tuned entries keep theirs, the heuristic uses "fixup"
SPLIT_MODE_ENV = "LOWRANK_GEMM_SPLITK_MODE"


def split_mode_override() -> str | None:
    v = getenv(SPLIT_MODE_ENV, "").strip().lower()
    if v in ("", "auto"):
        return None
    if v not in SPLIT_MODES:
        raise ValueError(f"{SPLIT_MODE_ENV} must be one of {SPLIT_MODES} (or unset), got {v!r}")
    return v


# ---------------------------------------------------------------------------- knobs (pure)

def block_r_for(r: int) -> int:
    """Rank padded to the MMA K granularity (16), as a power of two (``tl.arange``), ≤ 128."""
    return min(MAX_FUSED_RANK, rank_block(r))


def tile_for(M: int, N: int, K: int, *, gpu: bool = True, sms: int = 132
             ) -> tuple[int, int, int, int]:
    """(block_m, block_n, block_k, num_warps). Decode M (≤ 64) is a stream over W: the smallest
    wgmma M (64); when N has ≥ one wave of 128-wide tiles, 256-wide tiles so the grid is ONE
    wave (N=28672: 112 CTAs all streaming from t=0, instead of 224 CTAs = 1.7 waves whose second,
    partial wave re-fills the pipeline), 5 stages × 40 KB in flight per SM; otherwise 128-wide,
    deep K steps. Larger M: 128×256 with two warpgroups (wgmma m64n256 per warpgroup)."""
    if not gpu:  # interpreter: small tiles keep CPU tests fast
        return 32, 32, 32, 4
    if M <= 64:
        if cdiv(N, 128) >= sms:
            return 64, 256, 64, 4
        return 64, 128, 128, 4
    return 128, 256, 64, 8


def split_k_for(num_tiles: int, k_tiles: int, sms: int, *, max_split: int = 8,
                min_k_tiles_per_split: int = 4) -> int:
    """Deterministic split-K when the output tiles cannot fill the SMs: double the split (a power
    of two) while the CTAs still fit in about one wave, keeping ≥ ``min_k_tiles_per_split`` K
    tiles each (the fp32 partials cost a write + read of [split, M, N], so no more than needed)."""
    split = 1
    while (num_tiles * split * 2 <= sms * 1.1 and split * 2 <= max_split
           and k_tiles // (split * 2) >= min_k_tiles_per_split):
        split *= 2
    return split


# a split piece's fixed cost (pipeline refill, partial store + reload, ticket) in tile-times
PIECE_OVERHEAD = 0.05


def wave_split(num_tiles: int, k_tiles: int, sms: int, *, max_split: int = 8,
               min_k_tiles_per_split: int = 4) -> int:
    """Split-K of a one-launch (``fixup``) plan, by predicted makespan in tile-times: the whole
    waves run unsplit (:func:`fixup_dp_tiles`), the rest in ``split`` pieces of 1/split +
    ``PIECE_OVERHEAD`` each; the smallest power of two ≤ ``max_split`` that minimizes it, keeping
    ≥ ``min_k_tiles_per_split`` K tiles per piece. Below one wave this is :func:`split_k_for`'s
    fill-the-SMs rule (K=N=4096, M=256, 128×256 tiles: 32 tiles → 4); above it, a split only where
    the last wave is short (N=28672, M=256: 224 tiles → 4, 1.9 tile-times instead of 2; 512 or
    1024 tiles, 97 % of their last wave full → 1)."""
    powers = [1 << i for i in range(1, max_split.bit_length()) if 1 << i <= max_split]
    return _least_makespan(num_tiles, k_tiles, sms, powers, min_k_tiles_per_split)


def _least_makespan(num_tiles: int, k_tiles: int, sms: int, splits: Sequence[int], min_k_tiles_per_split: int) -> int:
    """The first of ``splits`` (ascending) with the least :func:`fixup_makespan`, 1 unless one is strictly better;
    splits leaving a piece fewer than ``min_k_tiles_per_split`` K tiles are not tried."""
    best = 1
    for split in splits:
        if k_tiles // split < min_k_tiles_per_split:
            break
        if fixup_makespan(num_tiles, split, sms) < fixup_makespan(num_tiles, best, sms) - 1e-9:
            best = split
    return best


def fixup_makespan(num_tiles: int, split: int, sms: int) -> float:
    """Predicted makespan in tile-times of a one-launch split-K: whole waves unsplit (:func:`fixup_dp_tiles`), the
    rest in ``split`` pieces of 1/split + :data:`PIECE_OVERHEAD` each (:func:`wave_split`'s model)."""
    if split == 1:
        return float(cdiv(num_tiles, sms))
    whole = fixup_dp_tiles(num_tiles, split, sms)
    pieces = (num_tiles - whole) * split
    return whole // sms + cdiv(pieces, sms) * (1.0 / split + PIECE_OVERHEAD)


def makespan_split(num_tiles: int, k_tiles: int, sms: int, *, max_split: int = 8,
                   min_k_tiles_per_split: int = 4) -> int:
    """:func:`wave_split` over every integer split, not only powers of two — 86 tiles of 128×256 on 132 SMs
    (M = 256, N = 11008): 3 pieces each are 2 rounds of a third of a tile (0.77 tile-times), where 2 or 4 give 1.1 /
    0.9. A tuning candidate (:mod:`.autotune`); the rules keep :func:`wave_split`, as measured."""
    return _least_makespan(num_tiles, k_tiles, sms, range(2, max_split + 1), min_k_tiles_per_split)


def fixup_dp_tiles(tiles: int, split_k: int, sms: int | None) -> int:
    """Tiles a one-launch (FIXUP) split-K runs whole before the split pieces of the others: every
    whole wave when there is one (tiles ≥ sms), else none (every tile split). Split-K is for the
    partial last wave: 224 tiles on 132 SMs take 2 tile-times (1.70 waves); with the 92 tiles past
    the first wave cut in 4 K pieces, 1 + ⌈368/132⌉/4 = 1.75, and only those 92 pay for partials."""
    if split_k <= 1 or not sms or tiles < sms:
        return 0
    return tiles // sms * sms


def stages_for(build, *, min_stages: int = 2, max_stages: int = 6) -> int:
    """Deepest main pipeline whose ledger fits (``build(stages) -> SmemLedger``)."""
    main, _, _ = solve_stages(lambda s, _lr: build(s), min_main=min_stages, max_main=max_stages)
    return main


def group_m_for(num_pid_m: int) -> int:
    return 8 if num_pid_m >= 8 else max(1, num_pid_m)


def m_bucket(M: int) -> int:
    for b in M_BUCKETS:
        if M <= b:
            return b
    return M_BUCKETS[-1]


def r_bucket(r: int) -> int:
    for b in R_BUCKETS:
        if r <= b:
            return b
    return next_pow2(r)


# ---------------------------------------------------------------------------- feasibility

@dataclass(frozen=True)
class Feasibility:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def lora_ledger(strategy: str, config: KernelConfig, dtype_bits: int = 16) -> SmemLedger:
    """The strategy's main-kernel ledger as the op launches it (Y by TMA where the op stores it so)."""
    from ..kernels._lora_kernels import smem_ledger
    from ..kernels.lora_gemm import y_store_pieces
    return smem_ledger(config, dtype_bits, strategy, y_pieces=y_store_pieces(strategy, config))


def can_implement(strategy: str, shape: tuple[int, int, int, int], config: KernelConfig,
                  dtype_bits: int = 16) -> Feasibility:
    """Whether ``strategy`` with ``config`` can run ``shape = (M, N, K, r)``; falsy with a reason if not."""
    if strategy not in LORA_STRATEGIES:
        return Feasibility(False, f"unknown strategy {strategy!r}; expected one of {LORA_STRATEGIES}")
    M, N, K, r = shape
    c = config
    if strategy in ("torch", "unfused"):
        return Feasibility(True)
    if max(c.block_m, c.block_n, c.block_k, c.block_r) > 256:
        return Feasibility(False, f"TMA boxes are at most 256 per dim, got block "
                                  f"{c.block_m}x{c.block_n}x{c.block_k} r{c.block_r}")
    if strategy in _FUSED_RANK_LIMITED and r > c.block_r:
        return Feasibility(False, f"{strategy} keeps S in registers: rank {r} > block_r {c.block_r}")
    if c.block_r > MAX_FUSED_RANK and strategy in _FUSED_RANK_LIMITED:
        return Feasibility(False, f"block_r {c.block_r} > {MAX_FUSED_RANK} (register budget of S)")
    if strategy == "flat" and c.block_r > 64:
        return Feasibility(False, f"flat adds the rank in one chunk: block_r {c.block_r} > 64")
    if strategy == "flat" and r % 8:
        return Feasibility(False, f"flat reads B [N, r] and S [·, M, r] by TMA (16-byte rows): rank a multiple of 8, "
                                  f"got {r}")
    if c.split_k > 1 and strategy in _NO_SPLIT_K:
        return Feasibility(False, f"{strategy} does not split K (split_k={c.split_k})")
    if c.split_k > 1 and c.split_mode == "fixup" and strategy not in FIXUP_STRATEGIES:
        return Feasibility(False, f"{strategy} has no in-launch split-K reduction (split_mode='fixup'); "
                                  f"expected one of {FIXUP_STRATEGIES} or split_mode='reduce'")
    if c.swap_ab:
        if strategy not in SWAP_AB_STRATEGIES:
            return Feasibility(False, f"swap_ab is a lora_main_kernel option; {strategy} does not take it "
                                      f"(expected one of {SWAP_AB_STRATEGIES})")
        if (why := c.swap_ab_mismatch()) is not None:
            return Feasibility(False, why)
        if strategy == "kloop" and (c.block_r < 16 * c.num_warps or c.block_r < 64):
            return Feasibility(False, f"kloop with swap_ab puts block_r on the S wgmma's M: block_r ≥ 64 and "
                                      f"≥ 16·num_warps, got block_r={c.block_r} with {c.num_warps} warps")
    if c.s_producers and (strategy != "split" or c.split_k > 1 or r > c.block_r):
        return Feasibility(False, f"s_producers (in-grid S producers) is a split option for one unsplit launch with the "
                                  f"whole rank in one block: strategy split, split_k 1, rank ≤ block_r; got {strategy}, "
                                  f"split_k {c.split_k}, rank {r}, block_r {c.block_r}")
    k_tiles = cdiv(max(K, 1), c.block_k)
    if c.split_k > k_tiles:
        return Feasibility(False, f"split_k {c.split_k} > {k_tiles} K tiles")
    ledger = lora_ledger(strategy, c, dtype_bits)
    if not ledger.fits():
        return Feasibility(False, f"shared memory {ledger.total()} B > {ledger.limit} B:\n{ledger.table()}")
    return Feasibility(True)


# ---------------------------------------------------------------------------- tuned table

def tuned_key(M: int, N: int, K: int, r: int, dtype: torch.dtype | str, *, exact: bool = False) -> str:
    """A tuned table's key: M and r by bucket (:func:`m_bucket`, :func:`r_bucket`), or as they are (``exact``: a
    user's tuning measured that very shape; the same key where M and r are bucket values)."""
    d = str(dtype).replace("torch.", "")
    if exact:
        return f"m{M}_n{N}_k{K}_r{r}_{d}"
    return f"m{m_bucket(M)}_n{N}_k{K}_r{r_bucket(r)}_{d}"


def entry_serves(M: int, N: int, strategy: str, cfg: KernelConfig, sms: int) -> bool:
    """Whether a tuned entry, measured at its bucket's own M (:func:`m_bucket`), also serves ``M``: where its grid
    at ``M`` has as many CTAs (tiles × K pieces) as at the bucket's M, or at least two waves of them. Elsewhere the
    entry's tile was chosen for another grid, and the rules (which count waves) plan ``M``.

    Measured (``probes/s20/call1``, grid shapes, the rules' plan against the bucket's entry, × cuBLAS): where the
    grid shrinks to under two waves the entry lost by up to 35 % — M=512, 4096² 1.67 / 1.75 (r16 / r64) against
    1.08 / 1.17 (the M=1024 entry's 256×128 / 128×256 tiles: half a wave), M=128, 4096² r64 1.85 vs 1.53,
    M=768, 8192² 1.19 / 1.17 vs 1.08 / 1.00 (1.45 waves of 128×256) — and won by ≤ 7 % (M=128, 8192²: 1.07 / 1.43
    vs 0.98 / 1.48 after :func:`one_wave_kloop_tile`'s K = 8192 case; M=512, 8192²: 1.00 / 0.95 vs 1.01 / 1.01);
    from two waves on (N=28672 at M ≥ 512, 8192² at M=2048) the two were within 3 %."""
    Mb = m_bucket(M)
    if M == Mb:
        return True
    pieces = 1 if strategy in _NO_SPLIT_K else cfg.split_k
    per_row = cdiv(N, cfg.block_n) * pieces
    at_m = cdiv(M, cfg.block_m) * per_row
    return at_m == cdiv(Mb, cfg.block_m) * per_row or at_m >= 2 * sms


# flat_plan's floor for wide layers: the programs' tile counts (waves of 128×256 tiles)
FLAT_MIN_WAVES = 4
# flat_plan's narrow layers (N ≤ this): from about one wave of tiles, every rank
FLAT_NARROW_N = 4096


def flat_plan(M: int, N: int, K: int, r: int, dtype_bits: int, sms: int) -> tuple[str, KernelConfig] | None:
    """``flat`` where it measured ahead of the tuned table and the rules (H100, × cuBLAS paired): 16-bit, r a multiple
    of 8 up to 64 (the rank in one TMA chunk), every S row block whole on the programs with slack
    (:func:`~lowrank_gemm.kernels.schedule.flat_s_tasks`), and either
    - r > 16 on at least :data:`FLAT_MIN_WAVES` waves of tiles (session 50, ``probes/s50/s50c``, side by side with the
      tuned ``persistent_static``: 4096×28672×4096 1.07 vs 1.10, 4096×8192² 1.05 vs 1.10, 1024×28672×4096 1.03 vs
      1.10 — one rank chunk by TMA where persistent_static walks the rank in chunks; at r8 / r16 level within the
      noise, so those stay with the table; 1024×8192², ~2 waves: level), or
    - N ≤ :data:`FLAT_NARROW_N` from about one wave of tiles (spare programs counted), every rank (session 51,
      ``probes/s51/s51b``, two processes, after the S tasks went onto the slack at two blocks each with their own
      pipeline depth): 4096³ r8 / r16 / r64 1.03–1.04 / 1.07–1.08 / 1.09–1.10 against the tuned ``split``'s
      1.12–1.14 / 1.11–1.13 / 1.13–1.17; 1024×4096² r64 1.08 against 1.18–1.19, r16 1.06–1.07 against 1.07 (level).
    None elsewhere."""
    if dtype_bits != 16 or r % 8 or not 0 < r <= 64:
        return None
    from ..kernels.schedule import flat_programs, flat_s_tasks
    strategy, cfg = heuristic_lora(M, N, K, r, dtype_bits, gpu=True, sms=sms, strategy="flat")
    num_pid_m = cdiv(M, cfg.block_m)
    tiles = num_pid_m * cdiv(N, cfg.block_n)
    grid = flat_programs(tiles, num_pid_m, sms)
    slices, s_programs = flat_s_tasks(num_pid_m, tiles, grid, cdiv(K, cfg.block_k))
    if slices != 1 or s_programs == grid:       # sliced, or whole blocks on every program: not on the slack
        return None
    wide = r > 16 and tiles >= FLAT_MIN_WAVES * sms
    narrow = N <= FLAT_NARROW_N and tiles + num_pid_m >= sms
    if not (wide or narrow) or not can_implement(strategy, (M, N, K, r), cfg, dtype_bits):
        return None
    return strategy, cfg


def load_tuned(path: Path | None) -> dict:
    """``{key: {"strategy": str, "config": {...}}}`` from a LoRA table (``plan/tuned/lora_<gpu>.json``; the H100's
    ``extends`` the H200's: :func:`~lowrank_gemm.plan.tuned.table_entries`)."""
    return {} if path is None else table_entries(str(path), "lora")


def table_plan(path: Path | None, M: int, N: int, K: int, r: int, dtype, bits: int, sms: int
               ) -> tuple[str, KernelConfig] | None:
    """The entry of the LoRA table at ``path`` for this very shape (an exact key: :func:`tuned_key`), else for its
    bucket where the entry serves this M (:func:`entry_serves`) — either only where it can run the shape; else None.
    An entry with an unknown strategy or a config that is not a KernelConfig is an error naming the file and the
    key (a hand-edited or corrupted table), never skipped in silence."""
    entries = load_tuned(path)
    exact = tuned_key(M, N, K, r, dtype, exact=True)
    key = exact if exact in entries else tuned_key(M, N, K, r, dtype)
    hit = entries.get(key)
    if hit is None:
        return None
    strategy = hit.get("strategy") if isinstance(hit, dict) else None
    if strategy not in LORA_STRATEGIES:
        raise ValueError(f"{path}: entry {key}: unknown strategy {strategy!r}; expected one of {LORA_STRATEGIES}")
    try:
        cfg = KernelConfig.from_dict(hit["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: entry {key}: config is not a KernelConfig ({type(exc).__name__}: {exc})") from None
    if key != exact and swaps_past_bucket(M, r, bits, cfg):
        return None
    if can_implement(strategy, (M, N, K, r), cfg, bits) and (key == exact or entry_serves(M, N, strategy, cfg, sms)):
        return strategy, cfg
    return None


def swaps_past_bucket(M: int, r: int, bits: int, cfg: KernelConfig) -> bool:
    """Whether the rules' swap-AB plan replaces a bucket's unswapped entry at this M: 16 < M ≤ :data:`SWAP_AB_MAX_M`
    (where :func:`swap_plan_applies`) falls in the M = 64 bucket, whose entries were tuned on full 64-row tiles; at
    M ≤ 32 those tiles are at least half TMA zero fill."""
    return M > 16 and swap_plan_applies(M, r, bits) and not cfg.swap_ab and cfg.block_m >= 2 * M


def resolve_device(device: torch.device | str) -> torch.device:
    """``device`` as a torch.device with its CUDA ordinal (the current device for a bare ``cuda``): one key per GPU
    for the memoized plans."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", device_index(device))
    return device


def user_plan(M: int, N: int, K: int, r: int, dtype: torch.dtype, device: torch.device | str
              ) -> tuple[str, KernelConfig] | None:
    """The plan the user's own tuned table (:func:`~lowrank_gemm.plan.tuned.user_tuned_file`) holds for this shape,
    or None. Memoized with the plans (:func:`clear_plan_cache`)."""
    return _user_plan(M, N, K, r, dtype, resolve_device(device))


@functools.lru_cache(maxsize=4096)
def _user_plan(M, N, K, r, dtype, device):
    if device.type != "cuda":
        return None
    from ..kernels.schedule import num_sms
    bits = torch.finfo(dtype).bits if dtype.is_floating_point else 16
    return table_plan(user_tuned_file("lora", device), M, N, K, r, dtype, bits, num_sms(device))


# ---------------------------------------------------------------------------- pinning

@dataclass(frozen=True)
class Pinned:
    strategy: str | None = None
    config: KernelConfig | None = None


_PINNED: contextvars.ContextVar[Pinned | None] = contextvars.ContextVar("lowrank_gemm_pinned",
                                                                         default=None)


@contextlib.contextmanager
def pinned(strategy: str | None = None, config: KernelConfig | None = None):
    """Force the planner's strategy and/or config inside the block (tests, benchmarks, tuning)."""
    if strategy is not None and strategy not in LORA_STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; expected one of {LORA_STRATEGIES}")
    token = _PINNED.set(Pinned(strategy, config))
    try:
        yield
    finally:
        _PINNED.reset(token)


def current_pin() -> Pinned | None:
    return _PINNED.get()


# ---------------------------------------------------------------------------- planning

# H200, session 6 (NOTES.md): split + swap_ab beat every unswapped plan at M ≤ 16 on all three issue-2 shape
# families (4–16 %) and lost at M = 64; measured for 16-bit inputs and ranks ≤ 64. Session 60 (H100,
# ``probes/s60/s60a``, r16): at 17–32 tokens the 64-row tile is at least half TMA zero fill every K step — the
# same tile on x padded to 64 real rows runs as fast as at M = 64, 2–5 µs less — and swap_ab on 32-token tiles
# (the tokens on the wgmma's N) beat the 64-row kloop / split on all five families probed, 1–10 % (5120² M = 24:
# 23.7 against 26.5 µs; 4096→28672: 84.5 against 94.0); at M = 48 / 64 it lost again
SWAP_AB_MAX_M = 32
# Session 61 (H100, ``probes/s61/s60b``, ``s61b``): at r32 / r64 the 32-token swap tiles beat the 64-row split
# by 5–9 % on 5120², 4096→28672 and 4096² and tie it on 8192²; the plans they replaced at r64 (the M = 64
# bucket's kloop / persistent entries) ran 25.3 µs on 4096² M = 24 against swap's 19.5, 31.8 against 25.9 on 5120²,
# level on 4096→28672, 8192² and 2048→5632; so 17–32 tokens swap up to r64, as M ≤ 16 does
SWAP_AB_MAX_R = 64


def swap_plan_applies(M: int, r: int, dtype_bits: int) -> bool:
    """Whether the rules plan ``split`` + swap_ab here: 16-bit inputs, M ≤ :data:`SWAP_AB_MAX_M`,
    r ≤ :data:`SWAP_AB_MAX_R`."""
    return dtype_bits == 16 and M <= SWAP_AB_MAX_M and r <= SWAP_AB_MAX_R


# 128-row swap tiles from 0.8 of a wave of them: N=14336 (112 tiles) M=16 16x128x64 1.064× cuBLAS vs 16x64x256 1.114×
# (r16; r64 1.138 vs 1.221), probes/s17/families
SWAP_WIDE_WAVE = 0.8


def _swap_split_plan(M: int, N: int, r: int, dtype_bits: int, sms: int) -> KernelConfig:
    """The decode-size split plan with swap_ab, as the H200 table's winners (the tokens, 16 or 32, on the wgmma's N:
    a power of two ≥ M, so the x tile is no more than half TMA zero fill): 128 weight rows × 64-wide K steps
    when N fills most of a wave of 128-row tiles (two such CTAs share an SM, so every tile is resident at once;
    N=28672: 16x128x64, 6 stages), else 64 rows × 256-wide K steps (4096², 8192²: 16x64x256, 5 stages)."""
    bn, bk = (128, 64) if cdiv(N, 128) >= SWAP_WIDE_WAVE * sms else (64, 256)
    base = KernelConfig(block_m=max(16, next_pow2(M)), block_n=bn, block_k=bk, block_r=block_r_for(r), group_m=1,
                        num_warps=4, num_stages=2, swap_ab=True)
    return base.replace(num_stages=stages_for(lambda s: lora_ledger("split", base.replace(num_stages=s), dtype_bits)))


def measured_tile(M: int, N: int, K: int, sms: int) -> tuple[int, int, int, int, int, str]:
    """(block_m, block_n, block_k, num_warps, split_k, split_mode) on a GPU for 16 < M, from the H200 tuned
    winners and the untuned Llama-3-8B projections (``probes/s17/families``, × cuBLAS, r16):

    - 16 < M ≤ 64, the weight stream: 64 rows × the widest N tile that still gives about a wave of tiles —
      64×256×64 from a full wave of 128-wide tiles (N=28672), 64×128×128 from 3/4 of one (N=14336: 0.97×),
      64×64×128 from 0.7 of a wave of 64-wide tiles (N=6144: 1.09×, where 64×32 read 1.45× and the old
      fixup split 64×64 sk4 1.87×; 8192²'s tuned tile) or where 64×32 tiles would need two rounds to 64×64's one
      (N=5632, K=2048, 0.67 of a wave: 1.12× against 64×32×256's 1.39×, H100, ``probes/s58/s58h``), else
      64×32×256 (4096²'s tuned tile: one round of 64×32 tiles, half the time of one round of 64×64), split 2 in the
      launch when even those are under half a wave (N=1024: 1.23× vs 1.41× unsplit); at K ≥ 8192 64×64
      split 2 instead (K=14336, N=4096: 1.05× vs 64×32 1.09×).
    - M > 64: 128×256 tiles (8 warps) from half a wave of them, unless their last wave is so empty that 128×128
      tiles finish in fewer waves (:func:`wide_tiles_pay`); otherwise 128×128 (4 warps), K split in two
      through the reduce kernel when even those are under half a wave (M=256, N=1024 / K=14336 N=4096: 1.91× /
      1.18× vs unsplit 2.49× / 1.35×; one-launch fixup 2.22× / 1.21×). No split-K on 128×256 tiles: the old
      one-launch split of M=256, N=6144 into 8 pieces read 3.6× (128×128 unsplit: 1.25×)."""
    if M <= 64:
        if cdiv(N, 128) >= sms:
            return 64, 256, 64, 4, 1, "reduce"
        if cdiv(N, 128) >= 0.75 * sms:
            return 64, 128, 128, 4, 1, "reduce"
        if cdiv(N, 64) >= 0.7 * sms:
            return 64, 64, 128, 4, 1, "reduce"
        if K >= 8192:
            return 64, 64, 128, 4, 2, "fixup"
        if cdiv(cdiv(N, 32), sms) >= 2:     # 64×32 tiles would take two rounds where 64×64 take one
            return 64, 64, 128, 4, 1, "reduce"
        return 64, 32, 256, 4, (2 if cdiv(N, 32) < sms // 2 else 1), "fixup"
    if takes_wide_tiles(M, N, sms):
        return 128, 256, 64, 8, 1, "reduce"
    return 128, 128, 64, 4, (2 if cdiv(M, 128) * cdiv(N, 128) < sms // 2 else 1), "reduce"


# Work per SM-second of a 128×256 tile (8 warps) over a 128×128 one (4 warps), bracketed by the wave counts where
# either won (probes/s17/families, s18/first, × cuBLAS, r16 / r64): 448 and 592 wide tiles (4 / 5 waves against
# 7 / 9 waves of narrow ones, so the wide tile wins iff it is ≥ 8/7, 10/9 faster) read 128×256 0.96 / 0.99 of
# 128×128; 148 and 192 (2 waves against 3: ≥ 4/3 needed) read 1.09–1.16. Any value in [8/7, 4/3) splits them.
WIDE_TILE_SPEEDUP = 1.25


def wide_tiles_pay(wide_tiles: int, narrow_tiles: int, sms: int) -> bool:
    """Whether ``wide_tiles`` 128×256 tiles beat ``narrow_tiles`` 128×128 ones once both are rounded up to whole
    waves: a wave of wide tiles does twice the work at :data:`WIDE_TILE_SPEEDUP` the rate. The band where they lose
    is 1–1.5 waves of wide tiles (M=256 at N=18944: 148 tiles, 1.59× cuBLAS against 128×128's 1.37×)."""
    return 2 * cdiv(wide_tiles, sms) <= WIDE_TILE_SPEEDUP * cdiv(narrow_tiles, sms)


def takes_wide_tiles(M: int, N: int, sms: int) -> bool:
    """128-row tiles 256 wide rather than 128: from half a wave of them, where :func:`wide_tiles_pay` (the rule of
    :func:`measured_tile` at M > 64, and of the multi-LoRA heuristic's tile width)."""
    pm = cdiv(M, 128)
    return pm * cdiv(N, 256) >= sms // 2 and wide_tiles_pay(pm * cdiv(N, 256), pm * cdiv(N, 128), sms)


def one_wave_kloop_tile(M: int, N: int, K: int, sms: int) -> tuple[int, int, int, int, int, str] | None:
    """64 < M ≤ 256 with at most a wave of 64-row tiles: one kloop launch (S recomputed per N tile) on 64×128
    (unsplit or K split 2 in the launch) or 64×64 (split 2) tiles, whichever puts the most CTAs in one wave
    (ties: the wider tile, the smaller split); None where none fits a wave.

    cuBLAS takes 10–20 µs on these shapes, and ``split``'s three launches (down, main split 2, reduce) cost ~1.5–2×
    that. Measured in one process each (× cuBLAS, r16 / r64): M=256 N=1024 64×64 split 2 1.36 / 1.46 against
    split's 1.93 / 2.32 (``probes/s18/narrow``; K = 8192 too); and ``probes/s19/call1`` at K=4096 — 4096² M=256
    64×128 1.14 / 1.56 (split 2 on 128×128: 1.35 / persistent 1.58), M=128 64×128 split 2 1.28 / 1.53 (1.42 /
    1.86), 4096→2048 M=256 64×128 split 2 1.43 / 1.73 (split 1.67 / 2.03), M=128 64×64 split 2 1.33 / 1.45 (the
    same plan). The 64×128 tiles were measured at K ≤ 4096, and unsplit on a full wave at K = 8192 (``probes/s20/call1``:
    8192² M=128 0.98 / 1.48 against 128×128 split 2's 1.12 / 1.52). At M=1024 one launch lost (S recomputed for each
    of 16 N tiles: 2.4–2.8×)."""
    if not 64 < M <= 256:
        return None
    rows, best = cdiv(M, 64), None
    for bn, split in ((128, 1), (128, 2), (64, 2)):
        ctas = rows * cdiv(N, bn) * split
        measured_k = bn == 64 or K <= 4096 or (split == 1 and ctas >= 0.9 * sms)
        if measured_k and ctas <= sms and (best is None or ctas > best[0]):
            best = (ctas, bn, split)
    if best is None:
        return None
    return 64, best[1], 128, 4, best[2], "fixup"


def one_wave_persistent_tile(M: int, N: int, sms: int) -> int | None:
    """64 < M ≤ 256: the N width (128 or 64) of 64-row tiles whose tiles plus one S task per row block fill the most
    of one wave without passing it — ``persistent_static`` on them computes S once per row block where kloop on the
    same wave recomputes it per N tile (+r/BN of the MMA: +50 % at r64 on 64×128); None where neither fits a wave.

    Measured in one process (``probes/s20/call2/heldout``, × cuBLAS, r16 / r64; against the best kloop plan): 4096²
    M=256 64×128 1.12 / 1.18 (1.17 / 1.56); M=128 64×64 1.11 / 1.20 (1.27 / 1.53); 4096→2048 M=256 64×64 1.18 / 1.29
    (1.42 / 1.73); 14336→4096 M=256 64×128 1.11 / 1.08 (split 1.19 / 1.25, kloop 1.42 / 1.69); 5120² M=192 1.07 /
    1.10 (1.12 / 1.46); 8192² M=128 1.10 / 1.03 (1.09 / 1.34), M=96 1.17 / 1.16 (1.15 / 1.45); 4096→1024 M=128
    64×64 1.51 / 1.54 (1.60 / 1.55). Best or within 1.3 % of the best table-eligible plan at all 20 points."""
    if not 64 < M <= 256:
        return None
    rows, best = cdiv(M, 64), None
    for bn in (128, 64):
        tasks = rows * cdiv(N, bn) + rows
        if tasks <= sms and (best is None or tasks > best[0]):
            best = (tasks, bn)
    return None if best is None else best[1]


def _measured_plan(M: int, N: int, K: int, r: int, dtype_bits: int, sms: int, strategy: str, free: bool
                   ) -> tuple[str, KernelConfig] | None:
    """``strategy`` (or, when the caller left it ``free``, ``persistent_static`` where it won) on the tiles of
    :func:`measured_tile` — where a wave of 64-row tiles fits at 64 < M ≤ 256 (r ≤ 64), ``persistent_static`` on
    :func:`one_wave_persistent_tile`'s tiles (strategy free) or kloop on :func:`one_wave_kloop_tile`'s (strategy
    kloop) instead; None when the ledger rejects them (wider operands): the caller's older rules then shrink."""
    bm, bn, bk, warps, split, mode = measured_tile(M, N, K, sms)
    one_wave_ps = one_wave_persistent_tile(M, N, sms) if free and r <= 64 else None
    one_launch = one_wave_kloop_tile(M, N, K, sms) if r <= 64 and (free or strategy == "kloop") else None
    if one_wave_ps is not None:
        strategy, free = "persistent_static", False
        bm, bn, bk, warps, split = 64, one_wave_ps, 128, 4, 1
    elif one_launch is not None:
        strategy, free = "kloop", False
        bm, bn, bk, warps, split, mode = one_launch
    if bk == 256 and block_r_for(r) >= 64:
        # the A tile [64, 256] leaves the ring 2 stages: 4096² M=64 r64 on 64×32×256 read 1.98× cuBLAS where the
        # tuned 64×32×128 (5 stages) reads 1.20–1.22× (probes/s20/call3/ps_m64; s17/s18: 64×32×256 at r64 2.2–4.0×)
        bk = 128
    split = max(1, min(split, cdiv(K, bk) // 4))        # ≥ 4 K tiles per piece (split_k_for's rule)

    def plan(strat):
        br = block_r_for(r) if strat != "split" else min(block_r_for(r), SPLIT_BLOCK_R)
        sk = 1 if strat in _NO_SPLIT_K else split
        base = KernelConfig(block_m=bm, block_n=bn, block_k=bk, block_r=br, group_m=group_m_for(cdiv(M, bm)),
                            num_warps=warps, num_stages=2, split_k=sk,
                            split_mode=(mode if strat in FIXUP_STRATEGIES else "reduce") if sk > 1 else "reduce")
        return base.replace(num_stages=stages_for(lambda s: lora_ledger(strat, base.replace(num_stages=s), dtype_bits)))

    tiles, s_tasks = cdiv(M, bm) * cdiv(N, bn), cdiv(M, bm)
    if free and r <= 64 and M > 64 and (
            # the tuned winners from a wave of 128×256 tiles at N ≥ 8192 (28672, 8192², and 14336: M=1024 / 4096
            # 1.10× / 1.01× vs split 1.14× / 1.06×); below N=8192 split wins there (N=6144, M=4096: 1.03 vs 1.05)
            (bn == 256 and N >= 8192 and tiles >= 0.9 * sms)
            # M ≤ 1024 unsplit, where the S tasks (one per row block) add no round of tiles: computing S inside
            # the kernel beat split's down kernel at r=64 by 5–10 % (probes/s18/down, same tiles: M=1024 18944→3584
            # 1.05 vs 1.16, N=6144 1.20 vs 1.29; M=256 N=14336 1.11 vs 1.20) and tied at r=16 (−1…+3 %); where the
            # S tasks spill into a new round split won (M=1024 14336→4096: 128 + 8 tasks, 1.37 vs 1.15)
            or (M <= 1024 and split == 1 and cdiv(tiles + s_tasks, sms) == cdiv(tiles, sms))):
        # Measured at ranks ≤ 64 only (at 128 its epilogue buffers leave the main ring 2 stages).
        try:
            return "persistent_static", plan("persistent_static")
        except SmemError:
            pass
    try:
        return strategy, plan(strategy)
    except SmemError:
        return None


def heuristic_lora(M: int, N: int, K: int, r: int, dtype_bits: int, *, gpu: bool, sms: int,
                   strategy: str | None = None, split_mode: str | None = None
                   ) -> tuple[str, KernelConfig]:
    """Shape rules for unseen shapes/GPUs. Decode M (≤ 64): kloop (one launch; S recomputed per
    N-tile costs r/BLOCK_N extra MMA, free while memory-bound). Larger M: split — the main loop
    is the plain GEMM (kloop's extra m64n16 wgmma + A-tile TMA per K step cost ~30% at M=256 on
    the H200) and S comes once from a K-sliced down kernel.

    On a GPU above M = 16, where the swap-AB plan below does not apply (strategy free, ``split`` or ``kloop``; no
    split-mode override): the tiles and split of :func:`measured_tile`, and ``persistent_static`` for a free
    strategy from ~a wave of 128×256 tiles at N ≥ 8192. Session 17 measured the older rules below on untuned
    Llama-3-8B shapes at 1.75–4.2× cuBLAS (one-launch split-K of 128×256 tiles at M = 256, of 64×64 at M = 64),
    slower than torch's unfused branch.

    Otherwise (pinned persistent / concat / …, the env's split mode, the interpreter): few tiles keep 128-wide
    tiles with the in-launch split-K (``split_mode="fixup"``) at M ≤ 16 and split K up to ~1 wave; 17 ≤ M ≤ 64,
    or the "reduce" mode, first narrows the tiles to 64 columns. The fixup split is :func:`wave_split` (the
    partial last wave only; below one wave the same as ``split_k_for``).

    On a GPU where :func:`swap_plan_applies` (strategy free or ``split``): ``split`` with swap_ab
    (:func:`_swap_split_plan`)."""
    if (gpu and swap_plan_applies(M, r, dtype_bits) and strategy in (None, "split")
            and split_mode in (None, "fixup")):
        return "split", _swap_split_plan(M, N, r, dtype_bits, sms)
    free = strategy is None
    if strategy is None:
        # r > 64: S [BM, BLOCK_R] fp32 beside the [BM, BN] accumulator would spill registers
        strategy = "kloop" if (M <= 64 and r <= 64) else "split"
    if gpu and M > 16 and split_mode is None and strategy in ("split", "kloop"):
        planned = _measured_plan(M, N, K, r, dtype_bits, sms, strategy, free)
        if planned is not None:
            return planned
    bm, bn, bk, warps = tile_for(M, N, K, gpu=gpu, sms=sms)
    mode = split_mode or "fixup"
    if strategy not in FIXUP_STRATEGIES:
        mode = "reduce"
    br = block_r_for(r)
    if strategy == "split" and gpu:
        br = min(br, SPLIT_BLOCK_R)
    num_pid_m, num_pid_n = cdiv(max(M, 1), bm), cdiv(N, bn)
    narrow_first = not (mode == "fixup" and M <= 16)
    if gpu and M <= 64 and num_pid_m * num_pid_n < sms // 2 and narrow_first:
        bn = 64  # small N: more, narrower tiles before resorting to split-K
        num_pid_n = cdiv(N, bn)
    k_tiles = cdiv(K, bk)
    tiles = num_pid_m * num_pid_n
    if strategy in _NO_SPLIT_K:
        split = 1
    elif mode == "fixup":       # one launch: whole waves unsplit, the partial last wave split
        split = wave_split(tiles, k_tiles, sms)
    else:                       # every tile split, partials through the reduce kernel
        split = split_k_for(tiles, k_tiles, sms)
    base = KernelConfig(block_m=bm, block_n=bn, block_k=bk, block_r=br, group_m=group_m_for(num_pid_m),
                        num_warps=warps, num_stages=2, split_k=split,
                        split_mode=mode if split > 1 else "reduce")
    if not gpu:
        return strategy, base
    stages = stages_for(lambda s: lora_ledger(strategy, base.replace(num_stages=s), dtype_bits))
    return strategy, base.replace(num_stages=stages)


def plan_lora(M: int, N: int, K: int, r: int, dtype: torch.dtype, device: torch.device | str
              ) -> tuple[str, KernelConfig]:
    """(strategy, KernelConfig) for ``y[M, N] = x[M, K]·Wᵀ + (x·Aᵀ)[M, r]·Bᵀ``.

    Order: :func:`pinned` override → the user's own tuned table (:func:`user_plan`) → :func:`flat_plan` → the shipped
    tuned table (``plan/tuned/lora_<gpu>.json``) → heuristic. Every candidate is filtered with
    :func:`can_implement`; ``split`` (any rank) is the last resort.
    Memoized per (shape, dtype, device, pin): the op calls this on every launch.
    """
    return _plan_lora(M, N, K, r, dtype, resolve_device(device), current_pin(), split_mode_override())


def clear_plan_cache() -> None:
    """Forget memoized plans and tables (after swapping or writing a tuned table, e.g. in tests or after tuning)."""
    _plan_lora.cache_clear()
    _user_plan.cache_clear()
    table_entries.cache_clear()


def _with_mode(strategy: str, cfg: KernelConfig, mode: str | None) -> KernelConfig:
    """Apply the env's split-K mode where it means something (split_k > 1, a fixup strategy)."""
    if mode is None or cfg.split_k == 1 or cfg.split_mode == mode:
        return cfg
    if mode == "fixup" and strategy not in FIXUP_STRATEGIES:
        return cfg
    return cfg.replace(split_mode=mode)


@functools.lru_cache(maxsize=4096)
def _plan_lora(M: int, N: int, K: int, r: int, dtype: torch.dtype, device: torch.device,
               pin: Pinned | None, env_mode: str | None = None) -> tuple[str, KernelConfig]:
    strategy, cfg = _plan_lora_inner(M, N, K, r, dtype, device, pin, env_mode)
    if pin and pin.config is not None:
        return strategy, cfg       # a pinned config is taken as given
    return strategy, _with_mode(strategy, cfg, env_mode)


def _plan_lora_inner(M, N, K, r, dtype, device, pin, env_mode):
    from ..kernels.schedule import num_sms
    gpu = device.type == "cuda"
    bits = torch.finfo(dtype).bits if dtype.is_floating_point else 16
    sms = num_sms(device)
    shape = (M, N, K, r)
    pin_strategy = pin.strategy if pin else None
    if pin and pin.config is not None:
        strategy = pin_strategy or heuristic_lora(M, N, K, r, bits, gpu=gpu, sms=sms)[0]
        ok = can_implement(strategy, shape, pin.config, bits)
        if not ok:
            raise ValueError(f"pinned config cannot run {strategy} on (M,N,K,r)={shape}: {ok.reason}")
        return strategy, pin.config
    if pin_strategy is None and gpu:
        planned = _user_plan(M, N, K, r, dtype, device) or flat_plan(M, N, K, r, bits, sms)
        if planned is not None:
            return planned
    if pin_strategy is None:
        planned = table_plan(tuned_file("lora", device), M, N, K, r, dtype, bits, sms)
        if planned is not None:
            return planned
    strategy, cfg = heuristic_lora(M, N, K, r, bits, gpu=gpu, sms=sms, strategy=pin_strategy,
                                   split_mode=env_mode)
    if r > cfg.block_r and strategy in _FUSED_RANK_LIMITED and pin_strategy is None:
        strategy = "split"
        if cfg.split_mode == "fixup" and strategy not in FIXUP_STRATEGIES:
            cfg = cfg.replace(split_mode="reduce")
    ok = can_implement(strategy, shape, cfg, bits)
    if not ok:
        if pin_strategy is not None:
            raise ValueError(f"pinned strategy {strategy} cannot run (M,N,K,r)={shape}: {ok.reason}")
        strategy, cfg = heuristic_lora(M, N, K, r, bits, gpu=gpu, sms=sms, strategy="split",
                                       split_mode=env_mode)
    return strategy, cfg
