"""Host model of the v2 kernel's synchronization, with real mbarrier semantics, to find hangs on CPU.

An mbarrier completes a phase when its pending arrivals reach 0 and its transaction bytes are all
in; ``try_wait.parity(P)`` returns true iff the current (incomplete) phase's parity differs from P.
So a waiter more than one phase AHEAD of a barrier passes spuriously (it reads a slot that is not
filled yet) and one that falls two phases BEHIND blocks forever. Parity waits are only sound if
every waiter for phase n of a barrier starts waiting after phase n-1 completed.

:func:`simulate` runs the roles of ``w4a4_ws_kernel`` (loader, expander, two consumers, and a TMA
engine that lands copies in random order) under a random interleaving and reports a deadlock
(nobody can move) or a spurious pass (a consumer saw a slot holding another use's data).
:func:`simulate_coop` runs the LoRA v2 COOP schedule (``lora_ws``, ``num_warps`` 8): both consumers read every
MAIN and LOWRANK slot (empty barriers count both), one LOWRANK slot refilled during the next tile's K loop.
:func:`simulate_paired` runs its f8 decode-M variant: two expanders taking alternate K-step uses of MAIN and RAW,
and paired consumers whose K loops interleave on MAIN — the strided roles that need even rings (skeleton docstring,
"Strided roles"; an odd MAIN ring hung / faulted the H200 in session 26). ``slow`` weights let one role fall behind,
which is what exposes the hazard.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["MBarrier", "simulate", "simulate_paired", "simulate_coop", "SimResult"]


@dataclass
class MBarrier:
    count: int
    pending: int = -1
    tx: int = 0
    completed: int = 0      # phases completed so far; the current phase's parity is completed & 1

    def __post_init__(self):
        self.pending = self.count

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.completed += 1
            self.pending = self.count

    def arrive(self, expect_tx: int = 0):
        self.tx += expect_tx
        self.pending -= 1
        self._maybe_complete()

    def complete_tx(self, nbytes: int):
        self.tx -= nbytes
        self._maybe_complete()

    def try_wait(self, parity: int) -> bool:
        return (self.completed & 1) != parity


@dataclass
class SimResult:
    ok: bool
    why: str = ""
    steps: int = 0
    trace: list = field(default_factory=list)


class _Ring:
    def __init__(self, stages, ready_count, name, empty_count=1):
        self.n = stages
        self.ready = [MBarrier(ready_count) for _ in range(stages)]
        self.empty = [MBarrier(empty_count) for _ in range(stages)]
        self.content = [None] * stages   # use id written into each slot (per operand)
        self.name = name


def _wait(bar, parity):
    """A role's ``mbarrier.try_wait`` loop: yields "blocked" until ``bar``'s current phase parity differs from ``parity``."""
    while not bar.try_wait(parity):
        yield "blocked", bar, parity


def _state(use, n, producer):
    return use % n, ((use // n) & 1) ^ (1 if producer else 0)


RELEASES = ("now", "lagged", "stale")


def simulate(n_tiles: int, k_tiles: int, stages: int, lr_stages: int = 2, fmt: str = "int4_2l",
             has_lowrank: bool = True, order: bool = True, seed: int = 0, max_steps: int = 200000,
             stop_on_spurious: bool = True, release: str | None = None) -> SimResult:
    """One program's ``n_tiles`` local tiles. ``order``: consumers hand the MAIN ring to each other
    through the ORDER barriers (the fix); False models the original kernel. With
    ``stop_on_spurious=False`` a spurious pass is recorded and the run goes on (to see the hang).

    ``release`` — when a consumer frees its MAIN slots (default: what the kernel does per format):
    ``"now"`` (g: wgmma_wait(0), then release), ``"lagged"`` (2l: one wgmma in flight, slot of step
    kk-1 released after step kk's wgmma was issued, the last one after the loop), ``"stale"`` (2l as
    compiled before the fix: the ``prev = main`` alias was not loop-carried, so every release hit
    the slot of the tile's first K step)."""
    rng = random.Random(seed)
    two_l = fmt == "int4_2l"
    release = release or ("lagged" if two_l else "now")
    if release not in RELEASES:
        raise ValueError(f"release must be one of {RELEASES}, got {release!r}")
    main = _Ring(stages, 2 if two_l else 1, "main")
    raw = _Ring(2, 1, "raw")
    lrr = _Ring(lr_stages, 1, "lowrank")
    orderb = [MBarrier(1), MBarrier(1)]
    spurious = []
    main_x = [None] * stages    # 2l: the x tile lands in MAIN by TMA, w by the expander
    tma_q = []                  # (barrier, nbytes, on_land)

    def tma(bar, nbytes, on_land):
        tma_q.append((bar, nbytes, on_land))

    def loader():
        u = 0
        for t in range(n_tiles):
            if has_lowrank:
                i, ph = _state(t, lr_stages, True)
                yield from _wait(lrr.empty[i], ph)
                lrr.ready[i].arrive(expect_tx=1)
                tma(lrr.ready[i], 1, lambda i=i, t=t: lrr.content.__setitem__(i, t))
            for _ in range(k_tiles):
                if two_l:
                    i, ph = _state(u, stages, True)
                    yield from _wait(main.empty[i], ph)
                    main.ready[i].arrive(expect_tx=1)
                    tma(main.ready[i], 1, lambda i=i, u=u: main_x.__setitem__(i, u))
                j, ph = _state(u, 2, True)
                yield from _wait(raw.empty[j], ph)
                raw.ready[j].arrive(expect_tx=1)
                tma(raw.ready[j], 1, lambda j=j, u=u: raw.content.__setitem__(j, u))
                u += 1
                yield "ran", None, None

    def expander():
        for u in range(n_tiles * k_tiles):
            j, ph = _state(u, 2, False)
            yield from _wait(raw.ready[j], ph)
            if raw.content[j] != u:
                _spurious(spurious, stop_on_spurious, f"expander read raw slot {j} holding use {raw.content[j]}, wanted {u}")
            i, ph = _state(u, stages, True)
            yield from _wait(main.empty[i], ph)
            main.content[i] = u
            raw.empty[j].arrive()
            main.ready[i].arrive()
            yield "ran", None, None

    def consumer(c):
        for t in range(c, n_tiles, 2):
            if order and t > 0:
                yield from _wait(orderb[c], ((t - 1) // 2) & 1)
            first = t * k_tiles
            for kk in range(k_tiles):
                u = first + kk
                i, ph = _state(u, stages, False)
                yield from _wait(main.ready[i], ph)
                if main.content[i] != u or (two_l and main_x[i] != u):
                    _spurious(spurious, stop_on_spurious, f"consumer{c} tile {t} k {kk}: MAIN slot {i} holds use "
                                    f"{main.content[i]}/{main_x[i]}, wanted {u}")
                yield "ran", None, None
                if release == "now":
                    main.empty[i].arrive()
                elif kk > 0:
                    _release_read(main, main_x, two_l, u - 1 if release == "lagged" else first, stages, c,
                                  spurious, stop_on_spurious)
            if release != "now":
                _release_read(main, main_x, two_l, first + k_tiles - 1 if release == "lagged" else first,
                              stages, c, spurious, stop_on_spurious)
            if order:
                orderb[1 - c].arrive()
            if has_lowrank:
                i, ph = _state(t, lr_stages, False)
                yield from _wait(lrr.ready[i], ph)
                if lrr.content[i] != t:
                    _spurious(spurious, stop_on_spurious, f"consumer{c} epilogue of tile {t}: LOWRANK slot {i} holds {lrr.content[i]}")
                lrr.empty[i].arrive()
            yield "ran", None, None

    roles = {"loader": loader(), "expander": expander(), "consumer0": consumer(0), "consumer1": consumer(1)}
    return _run(roles, tma_q, spurious, rng, max_steps, lambda bar: _bar_name(bar, (main, raw, lrr), orderb))


def _run(roles, tma_q, spurious, rng, max_steps, name_of, weights=None) -> SimResult:
    """Step the role generators (each yields ("ran", …) or ("blocked", barrier, parity)) and the TMA engine under a
    random interleaving — ``weights`` [role name or "tma"] biases the pick — until all finish, nobody can move, or a
    spurious pass stops it."""
    status = {name: ("ran", None, None) for name in roles}
    trace = []
    for step in range(max_steps):
        live = [n for n in roles if status[n] is not None]
        runnable = [n for n in live if status[n][0] == "ran" or status[n][1].try_wait(status[n][2])]
        if tma_q:
            runnable.append("tma")
        if not live and not tma_q:
            if spurious:
                return SimResult(False, f"spurious passes ({len(spurious)}), first: {spurious[0]}", step, trace)
            return SimResult(True, "", step, trace)
        if not runnable:
            stuck = {n: f"{name_of(status[n][1])} parity {status[n][2]}" for n in live}
            extra = f" after {len(spurious)} spurious passes, first: {spurious[0]}" if spurious else ""
            return SimResult(False, f"deadlock: {stuck}{extra}", step, trace)
        who = rng.choices(runnable, [weights.get(n, 1.0) for n in runnable])[0] if weights else rng.choice(runnable)
        if who == "tma":
            bar, nbytes, on_land = tma_q.pop(rng.randrange(len(tma_q)))
            on_land()
            bar.complete_tx(nbytes)
            continue
        try:
            status[who] = next(roles[who])
            trace.append(who)
        except StopIteration:
            status[who] = None
        except _Spurious as e:
            return SimResult(False, f"spurious pass: {e}", step, trace)
    return SimResult(False, "step limit", max_steps, trace)


def simulate_paired(n_tiles: int, k_tiles: int, stages: int, raw_stages: int, lr_stages: int = 2, seed: int = 0,
                    slow: dict | None = None, max_steps: int = 400000, stop_on_spurious: bool = True) -> SimResult:
    """One program of the paired two-expander f8 kernel (``PAIRED``, ``EXPANDERS=2``): the loader walks tile pairs,
    per pair the two LOWRANK heads, then per K step both tiles' MAIN x fills (TMA, 2 arrivals with the expander's)
    and RAW fills; expander E takes flat uses E, E+2, … (RAW → MAIN); consumer c takes local tiles c, c+2, …, its
    MAIN uses interleaved with its partner's (stride 2; 1 for a lone last tile), then its LOWRANK slot
    (``advance(c)``, then ``advance(2)``). ``slow``: pick weights < 1 for roles that should lag (e.g. {"expander1":
    0.1}). Reports a deadlock, or a spurious pass — a role saw a slot that holds another use's data."""
    rng = random.Random(seed)
    main = _Ring(stages, 2, "main")
    raw = _Ring(raw_stages, 1, "raw")
    lrr = _Ring(lr_stages, 1, "lowrank")
    main_x = [None] * stages
    tma_q = []
    spurious = []

    def tma(bar, on_land):
        tma_q.append((bar, 1, on_land))

    def loader():
        u = lu = 0
        for t0 in range(0, n_tiles, 2):
            pair = [t0] + ([t0 + 1] if t0 + 1 < n_tiles else [])
            for t in pair:
                i, ph = _state(lu, lr_stages, True)
                yield from _wait(lrr.empty[i], ph)
                lrr.ready[i].arrive(expect_tx=1)
                tma(lrr.ready[i], lambda i=i, t=t: lrr.content.__setitem__(i, t))
                lu += 1
            for _ in range(k_tiles):
                for _t in pair:
                    i, ph = _state(u, stages, True)
                    yield from _wait(main.empty[i], ph)
                    main.ready[i].arrive(expect_tx=1)
                    tma(main.ready[i], lambda i=i, u=u: main_x.__setitem__(i, u))
                    j, ph = _state(u, raw_stages, True)
                    yield from _wait(raw.empty[j], ph)
                    raw.ready[j].arrive(expect_tx=1)
                    tma(raw.ready[j], lambda j=j, u=u: raw.content.__setitem__(j, u))
                    u += 1
                    yield "ran", None, None

    def expander(e):
        for u in range(e, n_tiles * k_tiles, 2):
            j, ph = _state(u, raw_stages, False)
            yield from _wait(raw.ready[j], ph)
            if raw.content[j] != u:
                _spurious(spurious, stop_on_spurious, f"expander{e}: RAW slot {j} holds use {raw.content[j]}, wanted {u}")
            i, ph = _state(u, stages, True)
            yield from _wait(main.empty[i], ph)
            yield "ran", None, None
            main.content[i] = u
            raw.empty[j].arrive()
            yield "ran", None, None
            main.ready[i].arrive()
            yield "ran", None, None

    def consumer(c):
        for t in range(c, n_tiles, 2):
            pair = t // 2
            stride = 2 if pair * 2 + 1 < n_tiles else 1
            u = pair * 2 * k_tiles + c
            for kk in range(k_tiles):
                i, ph = _state(u, stages, False)
                yield from _wait(main.ready[i], ph)
                if main.content[i] != u or main_x[i] != u:
                    _spurious(spurious, stop_on_spurious, f"consumer{c} tile {t} k {kk}: MAIN slot {i} holds use "
                                                          f"{main.content[i]}/{main_x[i]}, wanted {u}")
                yield "ran", None, None
                main.empty[i].arrive()
                u += stride
            i, ph = _state(t, lr_stages, False)
            yield from _wait(lrr.ready[i], ph)
            if lrr.content[i] != t:
                _spurious(spurious, stop_on_spurious, f"consumer{c} epilogue of tile {t}: LOWRANK slot {i} holds "
                                                      f"{lrr.content[i]}")
            lrr.empty[i].arrive()
            yield "ran", None, None

    roles = {"loader": loader(), "expander0": expander(0), "expander1": expander(1),
             "consumer0": consumer(0), "consumer1": consumer(1)}
    return _run(roles, tma_q, spurious, rng, max_steps, lambda bar: _bar_name(bar, (main, raw, lrr), []),
                weights=slow)


def simulate_coop(n_tiles: int, k_tiles: int, stages: int, lr_stages: int = 1, releasers: int = 2, seed: int = 0,
                  slow: dict | None = None, max_steps: int = 400000) -> SimResult:
    """One program of ``lora_ws_kernel`` with COOP: the loader fills per tile one MAIN slot per K step (x and W on one
    barrier) and the tile's LOWRANK slot (S and B on one barrier) just before K step ``min(k_tiles - 1, stages)``;
    both consumers take every tile's every K step, release step kk-1's slot after step kk (the last after the loop),
    then read the LOWRANK slot and release it. ``releasers``: arrivals that free a slot (2 in the kernel; 1 models
    a count that forgets a consumer — the other may still be reading when the loader refills)."""
    rng = random.Random(seed)
    main = _Ring(stages, 1, "main", releasers)
    lrr = _Ring(lr_stages, 1, "lowrank", releasers)
    tma_q, spurious = [], []
    lr_at = min(k_tiles - 1, stages)

    def tma(bar, on_land):
        tma_q.append((bar, 1, on_land))

    def fill(ring, use):
        """Producer side of one slot use: wait until it is free, expect one TMA, whose landing stores ``use``."""
        i, ph = _state(use, ring.n, True)
        yield from _wait(ring.empty[i], ph)
        ring.ready[i].arrive(expect_tx=1)
        tma(ring.ready[i], lambda: ring.content.__setitem__(i, use))

    def loader():
        for t in range(n_tiles):
            for kk in range(k_tiles):
                if kk == lr_at:
                    yield from fill(lrr, t)
                yield from fill(main, t * k_tiles + kk)
                yield "ran", None, None

    def consumer(c):
        def release(v):
            i = v % stages
            if main.content[i] != v:
                _spurious(spurious, True, f"consumer{c}: MAIN slot {i} was refilled ({main.content[i]}) while the "
                                          f"wgmma of use {v} could still read it")
            main.empty[i].arrive()
        for t in range(n_tiles):
            for kk in range(k_tiles):
                u = t * k_tiles + kk
                i, ph = _state(u, stages, False)
                yield from _wait(main.ready[i], ph)
                if main.content[i] != u:
                    _spurious(spurious, True, f"consumer{c} tile {t} k {kk}: MAIN slot {i} holds use "
                                              f"{main.content[i]}, wanted {u}")
                yield "ran", None, None
                if kk > 0:
                    release(u - 1)
            release(t * k_tiles + k_tiles - 1)
            i, ph = _state(t, lr_stages, False)
            yield from _wait(lrr.ready[i], ph)
            if lrr.content[i] != t:
                _spurious(spurious, True, f"consumer{c} epilogue of tile {t}: LOWRANK slot {i} holds {lrr.content[i]}")
            yield "ran", None, None
            if lrr.content[i] != t:
                _spurious(spurious, True, f"consumer{c} epilogue of tile {t}: LOWRANK slot {i} refilled during the "
                                          f"branch's MMA")
            lrr.empty[i].arrive()
            yield "ran", None, None

    roles = {"loader": loader(), "consumer0": consumer(0), "consumer1": consumer(1)}
    return _run(roles, tma_q, spurious, rng, max_steps, lambda bar: _bar_name(bar, (main, lrr), []), weights=slow)


def _release_read(main, main_x, two_l, v, stages, c, spurious, stop):
    """Free the MAIN slot of use ``v``; its data must still be there (the wgmma read it until now)."""
    i = v % stages
    if main.content[i] != v or (two_l and main_x[i] != v):
        _spurious(spurious, stop, f"consumer{c}: MAIN slot {i} was refilled ({main.content[i]}/{main_x[i]}) "
                                  f"while the wgmma of use {v} could still read it")
    main.empty[i].arrive()


class _Spurious(Exception):
    pass


def _spurious(sink, stop, msg):
    if stop:
        raise _Spurious(msg)
    sink.append(msg)


def _bar_name(bar, rings, orderb):
    for ring in rings:
        for kind in ("ready", "empty"):
            for i, b in enumerate(getattr(ring, kind)):
                if b is bar:
                    return f"{ring.name}.{kind}[{i}] (completed {b.completed})"
    for i, b in enumerate(orderb):
        if b is bar:
            return f"order[{i}] (completed {b.completed})"
    return "?"
