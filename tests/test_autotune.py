"""The user's own tuning (``python -m lowrank_gemm tune lora``, :mod:`lowrank_gemm.plan.autotune`): candidates,
correctness before timing, the table it writes, and the planner reading that table first. CPU: the kernels run
under the interpreter, the timer is a stand-in (what it returns decides the winner); the GPU half is in
test_lora_gemm_gpu.py."""

import json

import pytest
import torch

from lowrank_gemm import __main__ as cli
from lowrank_gemm.kernels import lora_gemm as LG
from lowrank_gemm.kernels import schedule
from lowrank_gemm.plan import autotune, planner, tuned
from lowrank_gemm.plan.config import KernelConfig
from lowrank_gemm.reference import lora_linear_ref

SHAPE = (40, 96, 80, 8)         # (M, K, N, r): ragged against every candidate's tiles


def scripted_timer(fastest=None, auto_us=13.0):
    """A timer for tune_lora: cuBLAS, torch unfused and auto get fixed times, candidate i gets 100 + i µs, except
    candidate ``fastest`` (5 µs). Each timed function runs once, so a candidate that raises is caught as on a GPU."""
    calls = []

    def timer(fn, sets):
        fn(*sets[0])
        calls.append(fn)
        i = len(calls) - 1
        if i < 3:
            return (10.0, 12.0, auto_us)[i]
        return 5.0 if i - 3 == fastest else 100.0 + i
    return timer


def test_parse_tune_shapes():
    assert autotune.parse_tune_shapes("256x3584x18944x16, 1x4096x4096x8") == [(256, 3584, 18944, 16),
                                                                              (1, 4096, 4096, 8)]
    for bad in ("256x3584x18944", "256x3584x18944x0", "axbxcxd", ""):
        with pytest.raises(ValueError, match="MxKxNxR"):
            autotune.parse_tune_shapes(bad)


def test_candidates_are_distinct_runnable_and_include_todays_plan_and_unfused():
    M, K, N, r = SHAPE
    cands = autotune.lora_candidates(M, N, K, r, torch.float16, "cpu")
    keys = [(c.strategy, c.config) for c in cands]
    assert len(keys) == len(set(keys))
    assert keys[0] == planner.plan_lora(M, N, K, r, torch.float16, torch.device("cpu"))
    assert all(planner.can_implement(c.strategy, (M, N, K, r), c.config) for c in cands)
    assert {c.strategy for c in cands} >= {"split", "kloop", "unfused"}
    assert not {c.strategy for c in cands} & {"concat", "merged", "kcat", "torch", "streamk"}


def test_sweep_tiles_fit_the_ledger_at_every_m_class():
    for M in (1, 64, 256, 4096):
        for fits in (False, True):
            sweep = autotune.sweep_candidates(M, 4096, 4096, 16, 132, wave_fits=fits)
            assert sweep and all(planner.lora_ledger(s, c).fits() for s, c in sweep)
            assert len(set(sweep)) == len(sweep)


def test_sweep_adds_the_splits_that_even_out_a_partial_wave():
    """M = 256, N = 11008 (Llama-2-7B up): 86 tiles of 128×256 on 132 SMs, 0.65 of a wave — 3 pieces each make two
    rounds of a third of a tile. The one-launch splits and stream-K are candidates there."""
    plain = autotune.sweep_candidates(256, 11008, 4096, 16, 132)
    sweep = autotune.sweep_candidates(256, 11008, 4096, 16, 132, wave_fits=True)
    assert set(plain) < set(sweep)
    wide = {(s, c.split_k, c.split_mode) for s, c in sweep if (c.block_m, c.block_n) == (128, 256)}
    assert {("split", 3, "fixup"), ("kloop", 3, "fixup"), ("split", 4, "fixup"), ("streamk", 1, "reduce")} <= wide
    assert not any(s == "streamk" for s, _ in autotune.sweep_candidates(64, 11008, 4096, 16, 132, wave_fits=True))


def test_makespan_split_takes_any_integer():
    assert planner.makespan_split(86, 64, 132) == 3 and planner.wave_split(86, 64, 132) == 4
    assert planner.fixup_makespan(86, 3, 132) == pytest.approx(2 * (1 / 3 + planner.PIECE_OVERHEAD))
    assert planner.makespan_split(86, 12, 132) == 3 and planner.makespan_split(86, 11, 132) == 1   # ≥ 4 K tiles a piece
    assert planner.makespan_split(264, 64, 132) == 1      # two whole waves: nothing to even out


def test_tune_writes_the_fastest_correct_candidate_under_the_exact_key(tmp_path):
    M, K, N, r = SHAPE
    cands = autotune.lora_candidates(M, N, K, r, torch.float16, "cpu")
    pick = next(i for i, c in enumerate(cands) if c.strategy == "split")
    path = tmp_path / "lora_gpu.json"
    (rep,) = autotune.tune_lora([SHAPE], dtype=torch.float16, device="cpu", path=path,
                                timer=scripted_timer(fastest=pick), progress=False, print_fn=lambda s: None)
    assert [row["label"] for row in rep.rows] == [c.label for c in cands]
    assert all(row["rel_err"] < 2e-3 and "error" not in row for row in rep.rows)
    data = json.loads(path.read_text())
    assert data["version"] == 1 and data["meta"]["source"] == "python -m lowrank_gemm tune lora"
    entry = data["lora"][planner.tuned_key(M, N, K, r, torch.float16, exact=True)]
    assert (entry["strategy"], KernelConfig.from_dict(entry["config"])) == (cands[pick].strategy, cands[pick].config)
    assert entry["us"] == 5.0 and entry["cublas_us"] == 10.0 and entry["torch_unfused_us"] == 12.0
    assert tuned.read_table(path) == data
    # the planner serves it for exactly this shape; a neighbour M in another grid does not get it
    plan = planner.table_plan(path, M, N, K, r, torch.float16, 16, 132)
    assert plan == (cands[pick].strategy, cands[pick].config)
    assert planner.table_plan(path, M + 1, N, K, r, torch.float16, 16, 132) is None


def test_a_win_inside_the_margin_keeps_auto(tmp_path):
    """The fastest candidate at 5 µs against auto's 5.05: inside the 2 % margin, nothing is written; at 0 margin
    it is."""
    path = tmp_path / "lora_gpu.json"
    (rep,) = autotune.tune_lora([SHAPE], dtype=torch.float16, device="cpu", path=path,
                                timer=scripted_timer(fastest=1, auto_us=5.05), progress=False, print_fn=lambda s: None)
    assert rep.kept_auto and not path.exists()
    (rep,) = autotune.tune_lora([SHAPE], dtype=torch.float16, device="cpu", path=path, margin=0.0,
                                timer=scripted_timer(fastest=1, auto_us=5.05), progress=False, print_fn=lambda s: None)
    assert rep.chosen["us"] == 5.0 and path.exists()


def test_report_files(tmp_path):
    reps = autotune.tune_lora([SHAPE, SHAPE], dtype=torch.float16, device="cpu", path=tmp_path / "t.json",
                              timer=scripted_timer(fastest=0), progress=False, print_fn=lambda s: None)
    autotune._report_writer(tmp_path / "out")(reps)
    data = json.loads((tmp_path / "out" / "tune_lora.json").read_text())
    assert [r["M"] for r in data["reports"]] == [SHAPE[0]] * 2 and "meta" in data
    md = (tmp_path / "out" / "tune_lora.md").read_text()
    assert reps[0].chosen["label"] in md and "auto kept" in md       # the second pass: auto now runs the winner


def test_tune_keeps_auto_where_no_candidate_beats_it(tmp_path):
    path = tmp_path / "lora_gpu.json"
    (rep,) = autotune.tune_lora([SHAPE], dtype=torch.float16, device="cpu", path=path,
                                timer=scripted_timer(fastest=None, auto_us=1.0), progress=False,
                                print_fn=lambda s: None)
    assert rep.kept_auto and rep.chosen is None and not path.exists()
    assert "nothing written" in autotune.summary_line(rep)


def test_a_wrong_candidate_is_never_chosen(tmp_path, monkeypatch):
    """The fastest candidate by the clock gives a wrong answer: it is reported with its error and skipped."""
    M, K, N, r = SHAPE
    cands = autotune.lora_candidates(M, N, K, r, torch.float16, "cpu")
    bad = next(i for i, c in enumerate(cands) if c.strategy == "unfused")
    real = LG.run_strategy

    def run(strategy, *args, **kw):
        y = real(strategy, *args, **kw)
        return y * 1.5 if strategy == "unfused" else y
    monkeypatch.setattr(LG, "run_strategy", run)
    path = tmp_path / "lora_gpu.json"
    (rep,) = autotune.tune_lora([SHAPE], dtype=torch.float16, device="cpu", path=path,
                                timer=scripted_timer(fastest=bad, auto_us=1e4), progress=False, print_fn=lambda s: None)
    assert "relative error" in rep.rows[bad]["error"] and "us" not in rep.rows[bad]
    assert rep.chosen["strategy"] != "unfused"


def test_an_unwritten_output_is_caught(monkeypatch):
    x, w, a, b = (torch.randn(8, 32).half(), torch.randn(16, 32).half(), torch.randn(4, 32).half(),
                  torch.randn(16, 4).half())
    ref = lora_linear_ref(x, w, a, b, autotune.SCALE)

    def half_written(strategy, x, w, a, b, scale, bias, cfg, out):
        out[:4] = 0
        return out
    monkeypatch.setattr(LG, "run_strategy", half_written)
    with pytest.raises(RuntimeError, match="unwritten"):
        autotune.check_candidate(autotune.Candidate("x", "split", KernelConfig()), x, w, a, b, ref, None)


def test_tune_refuses_a_corrupted_table_before_timing(tmp_path):
    path = tmp_path / "lora_gpu.json"
    for text, match in (("{not json", "invalid JSON"), ("[1, 2]", "JSON object"), ('{"version": 2}', "version"),
                        ('{"version": 1, "lora": []}', "'lora' object")):
        path.write_text(text)
        with pytest.raises(ValueError, match=match):
            autotune.tune_lora([SHAPE], dtype=torch.float16, device="cpu", path=path, timer=scripted_timer(),
                               progress=False)


def test_tune_needs_a_gpu_or_a_timer_and_16_bit():
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        autotune.tune_lora([SHAPE], device="cpu")
    with pytest.raises(TypeError, match="16-bit"):
        autotune.tune_lora([SHAPE], dtype=torch.float32, device="cpu", timer=scripted_timer())


def test_budget_stops_before_the_next_shape(tmp_path):
    lines = []
    reps = autotune.tune_lora([SHAPE, (8, 96, 80, 8)], dtype=torch.float16, device="cpu", path=tmp_path / "t.json",
                              timer=scripted_timer(fastest=0), budget_s=0.0, progress=False, print_fn=lines.append)
    assert reps == [] and "not tuned" in lines[0]


# ---------------------------------------------------------------------------- the planner reads the user's table

@pytest.fixture
def user_table(monkeypatch, tmp_path):
    """A fake GPU (cuda:0, 132 SMs) whose user table is ``tmp_path/lora_gpu.json``: write(entries) fills it."""
    path = tmp_path / "lora_gpu.json"
    monkeypatch.setattr(planner, "user_tuned_file", lambda family, device: path if path.exists() else None)
    monkeypatch.setitem(schedule._SM_COUNT, 0, 132)
    monkeypatch.setattr(planner, "tuned_file", lambda family, device: None)
    planner.clear_plan_cache()

    def write(entries):
        path.write_text(json.dumps({"version": 1, "lora": entries}))
        planner.clear_plan_cache()
        return path
    yield write
    planner.clear_plan_cache()


def plan_on_fake_gpu(M, N, K, r):
    return planner.plan_lora(M, N, K, r, torch.bfloat16, torch.device("cuda", 0))


def test_user_entry_comes_first_and_for_its_exact_shape(user_table):
    M, N, K, r = 300, 18944, 3584, 16
    rules = plan_on_fake_gpu(M, N, K, r)
    assert rules[0] != "unfused"
    user_table({planner.tuned_key(M, N, K, r, "bfloat16", exact=True): {"strategy": "unfused",
                                                                        "config": KernelConfig().to_dict()}})
    assert plan_on_fake_gpu(M, N, K, r)[0] == "unfused"
    assert planner.user_plan(M, N, K, r, torch.bfloat16, "cuda:0")[0] == "unfused"
    assert plan_on_fake_gpu(M, N, K, 8) == plan_on_fake_gpu(M, N, K, 8)       # another rank: not this entry
    assert plan_on_fake_gpu(M, N, K, 8)[0] != "unfused"
    with planner.pinned(strategy="split"):                                    # a pin still wins
        assert plan_on_fake_gpu(M, N, K, r)[0] == "split"


def test_user_bucket_entry_serves_only_where_its_grid_does(user_table):
    N, K, r = 4096, 4096, 16
    cfg = KernelConfig(block_m=128, block_n=128, block_k=64, block_r=16, group_m=2, num_warps=8, num_stages=4)
    user_table({planner.tuned_key(256, N, K, r, "bfloat16"): {"strategy": "split", "config": cfg.to_dict()}})
    assert plan_on_fake_gpu(256, N, K, r) == ("split", cfg)
    assert plan_on_fake_gpu(255, N, K, r) == ("split", cfg)       # the same 2 × 32 tiles
    assert plan_on_fake_gpu(65, N, K, r) != ("split", cfg)        # 1 × 32 tiles, under two waves: the rules


def test_an_entry_that_cannot_run_falls_through(user_table):
    M, N, K, r = 256, 4096, 4096, 16
    too_big = KernelConfig(block_m=256, block_n=256, block_k=128, block_r=16, num_warps=8, num_stages=8)
    user_table({planner.tuned_key(M, N, K, r, "bfloat16"): {"strategy": "split", "config": too_big.to_dict()}})
    s, cfg = plan_on_fake_gpu(M, N, K, r)
    assert cfg != too_big and planner.can_implement(s, (M, N, K, r), cfg)


@pytest.mark.parametrize("entry,match", [({"strategy": "fastest", "config": {}}, "unknown strategy 'fastest'"),
                                         ({"strategy": "split", "config": {"block_m": 100}}, "not a KernelConfig"),
                                         ({"strategy": "split"}, "not a KernelConfig")])
def test_a_corrupted_user_entry_is_an_error_naming_file_and_key(user_table, entry, match):
    key = planner.tuned_key(256, 4096, 4096, 16, "bfloat16")
    path = user_table({key: entry})
    with pytest.raises(ValueError, match=match) as info:
        plan_on_fake_gpu(256, 4096, 4096, 16)
    assert str(path) in str(info.value) and key in str(info.value)


def test_user_dir_follows_env_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv(tuned.USER_DIR_ENV, str(tmp_path / "mine"))
    assert tuned.user_tuned_dir() == tmp_path / "mine"
    monkeypatch.delenv(tuned.USER_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert tuned.user_tuned_dir() == tmp_path / "cache" / "lowrank_gemm" / "tuned"
    assert tuned.user_tuned_file("lora", "cpu") is None


# ---------------------------------------------------------------------------- the unfused strategy and the CLI

@pytest.mark.parametrize("with_bias", [True, False])
def test_unfused_strategy_matches_reference(with_bias):
    g = torch.Generator().manual_seed(1)
    M, N, K, r = 37, 70, 88, 8
    x, w, a = torch.randn(M, K, generator=g).half(), (torch.randn(N, K, generator=g) / 9).half(), \
        (torch.randn(r, K, generator=g) / 9).half()
    b = torch.randn(N, r, generator=g).half()
    bias = torch.randn(N, generator=g).half() if with_bias else None
    out = torch.full((M, N), float("nan"), dtype=torch.float16)
    y = LG.run_strategy("unfused", x, w, a, b, 0.7, bias, KernelConfig(), out=out)
    assert y.data_ptr() == out.data_ptr() and not y.isnan().any()
    ref = lora_linear_ref(x, w, a, b, 0.7, bias)
    assert ((y.double() - ref).norm() / ref.norm()).item() < 2e-3
    assert torch.equal(LG.lora_linear(x, w, a, b, 0.7, bias, strategy="unfused"), y)


def test_unfused_refuses_fp8_inputs():
    x, w = torch.randn(4, 32).half(), torch.randn(8, 32).to(torch.float8_e4m3fn)
    a, b = torch.randn(2, 32).half(), torch.randn(8, 2).half()
    with pytest.raises(ValueError, match="unfused"):
        LG.lora_linear(x, w, a, b, weight_scale=torch.ones(8), strategy="unfused")


def test_cli_tune(capsys, monkeypatch):
    with pytest.raises(SystemExit, match="tunable: lora"):
        cli.main(["tune", "w4a4"])
    with pytest.raises(SystemExit) as info:
        cli.main(["tune", "lora", "--shapes", "256x4096"])
    assert info.value.code == 2 and "MxKxNxR" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as info:
        cli.main(["tune", "lora", "--shapes", "256x4096x4096x16"])
    assert info.value.code == 2 and "no CUDA GPU" in capsys.readouterr().out


def test_candidates_under_a_users_entry_include_the_shipped_one(user_table, monkeypatch, tmp_path):
    """Re-tuning a shape whose user entry went stale still times what the planner would run without it."""
    M, N, K, r = 256, 4096, 4096, 16
    key = planner.tuned_key(M, N, K, r, "bfloat16")
    cfg = KernelConfig(block_m=128, block_n=128, block_k=64, block_r=16, group_m=2, num_warps=8, num_stages=4)
    shipped = tmp_path / "lora_h200.json"
    shipped.write_text(json.dumps({"version": 1, "lora": {key: {"strategy": "split", "config": cfg.to_dict()}}}))
    monkeypatch.setattr(autotune, "tuned_file", lambda family, device: shipped)
    user_table({key: {"strategy": "unfused", "config": KernelConfig().to_dict()}})
    cands = autotune.lora_candidates(M, N, K, r, torch.bfloat16, torch.device("cuda", 0))
    assert (cands[0].strategy, cands[1].strategy, cands[1].config) == ("unfused", "split", cfg)


def test_tune_model_covers_each_distinct_fused_layer(tmp_path):
    from lowrank_gemm.nn import LoRALinear
    model = torch.nn.Sequential(LoRALinear(96, 80, 8, dtype=torch.float16), LoRALinear(80, 96, 8, dtype=torch.float16),
                                LoRALinear(96, 80, 8, dtype=torch.float16), torch.nn.Linear(96, 96))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.1)
    assert autotune.lora_layer_shapes(model) == {torch.float16: [(80, 96, 8), (96, 80, 8)]}
    reps = autotune.tune_model(model, tokens=[8, 40], device="cpu", path=tmp_path / "t.json", timer=scripted_timer(),
                               progress=False, print_fn=lambda s: None)
    assert sorted((r.M, r.K, r.N, r.r) for r in reps) == [(8, 80, 96, 8), (8, 96, 80, 8), (40, 80, 96, 8),
                                                          (40, 96, 80, 8)]
    with pytest.raises(ValueError, match="no 16-bit LoRALinear"):
        autotune.tune_model(torch.nn.Linear(8, 8), tokens=[8], device="cpu", timer=scripted_timer())
    with pytest.raises(ValueError, match="token counts"):
        autotune.tune_model(model, tokens=[0], device="cpu", timer=scripted_timer())


def test_the_grid_sweep_checks_each_candidate_before_timing(tmp_path, monkeypatch):
    """``bench lora --tune`` (the shipped tables' sweep): a candidate that is wrong but fastest by the clock is logged
    with its error, never timed, never written; the next correct one is."""
    from lowrank_gemm.bench import lora as bench_lora
    M, K, N, r = SHAPE
    cands = autotune.sweep_candidates(M, N, K, r, 4)[:2]
    monkeypatch.setattr(bench_lora, "sweep_candidates", lambda *a, **k: cands)
    real = LG.run_strategy

    def run(strategy, x, w, a, b, scale, bias, cfg, **kw):
        y = real(strategy, x, w, a, b, scale, bias, cfg, **kw)
        return y * 1.5 if (strategy, cfg) == cands[0] else y
    monkeypatch.setattr(LG, "run_strategy", run)
    times = iter([5.0, 100.0])          # the first candidate timed would win
    bench_lora.tune(False, tmp_path, dtype=torch.float16, device="cpu", timer=lambda fn, sets: next(times),
                    points=[(M, N, K, r)])
    (table,) = set(tmp_path.glob("lora_*.json")) - {tmp_path / "lora_tune_log.json"}
    (entry,) = json.loads(table.read_text())["lora"].values()
    assert (entry["strategy"], entry["config"]) == (cands[1][0], cands[1][1].to_dict())
    log = json.loads((tmp_path / "lora_tune_log.json").read_text())
    assert "relative error" in log[0]["error"] and "us" not in log[0]
    assert log[1]["rel_err"] <= autotune.MAX_REL_ERR and log[1]["us"] == 5.0
