"""bench/common.py's graph timing: every implementation's graph holds the same number of calls, so the replay's fixed
cost is divided equally (before session 9 a one-set implementation carried all of it and a four-set one a quarter)."""

import pytest
import torch

from lowrank_gemm.bench import common


def _fake(monkeypatch, replay_us=80.0):
    seen = []

    def capture(fn, captured=None):
        fn()                                   # records the calls the graph would hold
        return None, type("G", (), {"replay": staticmethod(lambda: None)}), None
    monkeypatch.setattr(common, "capture_graph", capture)
    monkeypatch.setattr(common, "_bench", lambda fn: common.Timing(replay_us, replay_us * 0.9, replay_us * 1.1))
    return seen


def test_graph_calls_are_the_same_for_one_or_many_sets(monkeypatch):
    _fake(monkeypatch)
    for n_sets in (1, 3, 4):
        seen = []
        t = common.time_graph(lambda a: seen.append(a), [(i, ) for i in range(n_sets)])
        assert len(seen) == common.GRAPH_CALLS, "same number of calls per graph whatever the rotation"
        assert seen == [i % n_sets for i in range(common.GRAPH_CALLS)], "cycling through the sets in order"
        assert t == common.Timing(80.0 / common.GRAPH_CALLS, 72.0 / common.GRAPH_CALLS, 88.0 / common.GRAPH_CALLS)


def test_graph_calls_at_least_one_per_set(monkeypatch):
    _fake(monkeypatch)
    seen = []
    sets = [(i, ) for i in range(common.GRAPH_CALLS + 3)]
    t = common.time_graph(lambda a: seen.append(a), sets)
    assert seen == list(range(len(sets))) and abs(t.median_us - 80.0 / len(sets)) < 1e-12
    seen.clear()
    common.time_graph(lambda a: seen.append(a), sets[:2], calls=5)
    assert seen == [0, 1, 0, 1, 0]


def test_paired_ratio_alternates_and_takes_the_median_round(monkeypatch):
    """Base and impl are timed in alternation; a drifting clock that slows both alike leaves the ratio alone, and
    one disturbed round does not move the median."""
    order = []
    graphs = iter(["impl", "base"])            # paired_ratio captures the impl's graph first

    def capture_named(fn, captured=None):
        tag = next(graphs)
        fn()
        return None, type("G", (), {"replay": staticmethod(lambda t=tag: order.append(t))}), None
    monkeypatch.setattr(common, "capture_graph", capture_named)
    # round k: the clock is (1 + 0.1·k) slower; the impl is 1.02× the base, except round 1 (a hiccup: 1.30×)
    times = {"base": [100.0, 110.0, 120.0], "impl": [102.0, 143.0, 122.4]}

    def bench(replay):
        replay()
        tag = order[-1]
        return common.Timing(times[tag].pop(0), 0.0, 0.0)
    monkeypatch.setattr(common, "_bench", bench)
    out = common.paired_ratio(lambda a: None, [(0, )], lambda a: None, [(0, )])
    assert order == ["base", "impl"] * 3
    assert abs(out["ratio_paired"] - 1.02) < 1e-9
    assert len(out["paired_us"]) == 3


def test_parse_shapes_names_the_bad_item():
    from lowrank_gemm.bench.common import parse_shapes
    assert parse_shapes("4096x6144, 14336x4096") == [(4096, 6144), (14336, 4096)]
    for bad in ("4096x", "4096", "4096x6144x2", "0x64", "ax4"):
        with pytest.raises(ValueError, match="joined by 'x'"):
            parse_shapes(bad)
    # --ms / --ranks
    assert parse_shapes("256, 1024", dims=1) == [(256,), (1024,)]
    for bad in ("256x2", "0", "-1", "a", ""):
        with pytest.raises(ValueError, match="a positive integer"):
            parse_shapes(bad, dims=1)


def test_checked_timing_never_times_a_wrong_or_unwritten_result(monkeypatch):
    """A probe's cell: the right result is timed; one that leaves NaN rows, misses the tolerance or raises becomes an
    error and is not timed."""
    import types

    timed = []
    monkeypatch.setattr(common, "time_graph", lambda fn, sets: timed.append(fn(*sets[0])) or
                        types.SimpleNamespace(median_us=2.5))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 8, generator=g), torch.randn(6, 8, generator=g)
    want = (x @ w.T).double()

    def right(x, w, out=None):
        out = torch.empty(x.shape[0], w.shape[0]) if out is None else out
        out[:] = x @ w.T
        return out

    def half(x, w, out=None):
        out[:3] = (x @ w.T)[:3]
        return out

    assert common.checked_timing(right, [(x, w)], want) == {"rel_err": 0.0, "us": 2.5}
    assert common.checked_timing(lambda x, w: x @ w.T, [(x, w)], want, takes_out=False)["us"] == 2.5
    padded = common.checked_timing(lambda x, w, out=None: right(torch.cat([x, x[:2]]), w, out), [(x, w)], want,
                                   out_rows=7)
    assert padded["us"] == 2.5      # extra rows past want's are not checked
    assert len(timed) == 3
    assert "NaN" in common.checked_timing(half, [(x, w)], want)["error"]
    assert "rel err" in common.checked_timing(lambda x, w, out=None: right(x, -w, out), [(x, w)], want)["error"]
    assert "ValueError: no" in common.checked_timing(lambda x, w, out=None: (_ for _ in ()).throw(ValueError("no")),
                                                     [(x, w)], want)["error"]
    assert len(timed) == 3


def test_write_probe_writes_json_and_a_table_of_the_asked_columns(tmp_path):
    import json
    rows = [{"M": 32, "impl": "kloop", "us": 27.5}, {"M": 64, "impl": "split", "error": "ValueError: no"}]
    path = common.write_probe("p", "A probe", rows, [("M", "M"), ("impl", "impl"), ("µs", "us"), ("error", "error")],
                              tmp_path)
    data = json.loads(path.read_text())
    assert data["rows"] == rows and "torch" in data["meta"]
    md = (tmp_path / "p.md").read_text().splitlines()
    assert md[0] == "# A probe" and "| M | impl | µs | error |" in md
    assert "| 32 | kloop | 27.5 | — |" in md and "| 64 | split | — | ValueError: no |" in md
