"""kernels/env.py: the switches and config overrides the kernels read from the environment."""

import os
import pytest

from lowrank_gemm.kernels.env import env_ints, env_on, pinned_config


def test_env_on(monkeypatch):
    monkeypatch.delenv("LOWRANK_GEMM_TEST_SWITCH", raising=False)
    assert env_on("LOWRANK_GEMM_TEST_SWITCH")
    monkeypatch.setenv("LOWRANK_GEMM_TEST_SWITCH", "0")
    assert not env_on("LOWRANK_GEMM_TEST_SWITCH")
    monkeypatch.setenv("LOWRANK_GEMM_TEST_SWITCH", "1")
    assert env_on("LOWRANK_GEMM_TEST_SWITCH")


def test_env_on_default_off(monkeypatch):
    """An opt-in switch: off unless set to something other than 0."""
    monkeypatch.delenv("LOWRANK_GEMM_TEST_SWITCH", raising=False)
    assert not env_on("LOWRANK_GEMM_TEST_SWITCH", default=False)
    monkeypatch.setenv("LOWRANK_GEMM_TEST_SWITCH", "")
    assert not env_on("LOWRANK_GEMM_TEST_SWITCH", default=False)
    monkeypatch.setenv("LOWRANK_GEMM_TEST_SWITCH", "1")
    assert env_on("LOWRANK_GEMM_TEST_SWITCH", default=False)
    monkeypatch.setenv("LOWRANK_GEMM_TEST_SWITCH", "0")
    assert not env_on("LOWRANK_GEMM_TEST_SWITCH", default=False)


def test_env_ints(monkeypatch):
    monkeypatch.delenv("LOWRANK_GEMM_TEST_CFG", raising=False)
    assert env_ints("LOWRANK_GEMM_TEST_CFG", (2, 3), "a,b[,c]") is None
    monkeypatch.setenv("LOWRANK_GEMM_TEST_CFG", "4,16")
    assert env_ints("LOWRANK_GEMM_TEST_CFG", (2, 3), "a,b[,c]") == (4, 16)
    for bad in ("4", "4,x", "4,-1", "1,2,3,4"):
        monkeypatch.setenv("LOWRANK_GEMM_TEST_CFG", bad)
        with pytest.raises(ValueError, match="must be 'a,b\\[,c\\]'"):
            env_ints("LOWRANK_GEMM_TEST_CFG", (2, 3), "a,b[,c]")


def test_pinned_config(monkeypatch):
    """The caller's config wins, then the env override; None leaves the choice to the kernel."""
    monkeypatch.delenv("LOWRANK_GEMM_TEST_CFG", raising=False)
    pair = lambda *v: list(v)                                        # noqa: E731  (a config class stand-in)
    assert pinned_config(None, "LOWRANK_GEMM_TEST_CFG", (2, ), "a,b", pair) is None
    monkeypatch.setenv("LOWRANK_GEMM_TEST_CFG", "4,16")
    assert pinned_config(None, "LOWRANK_GEMM_TEST_CFG", (2, ), "a,b", pair) == [4, 16]
    assert pinned_config((1, 2), "LOWRANK_GEMM_TEST_CFG", (2, ), "a,b", pair) == [1, 2]


def test_getenv_follows_os_environ(monkeypatch):
    """kernels.env.getenv reads os.environ's backing dict: it must see every change made through os.environ (and
    monkeypatch), unset variables give the default, values decode as os.environ's do."""
    from lowrank_gemm.kernels.env import getenv
    var = "LOWRANK_GEMM_TEST_GETENV"
    monkeypatch.delenv(var, raising=False)
    assert getenv(var) is None and getenv(var, "d") == "d"
    monkeypatch.setenv(var, "0")
    assert getenv(var, "d") == "0" == os.environ.get(var)
    os.environ[var] = "ünï,1"
    assert getenv(var) == os.environ.get(var) == "ünï,1"
    del os.environ[var]
    assert getenv(var, "gone") == "gone"
    monkeypatch.setenv(var, "")
    assert getenv(var, "d") == ""
