"""Shared pieces: grouped tile order (device == host), the AOT compile helper."""

import pytest
import torch
import triton
import triton.language as tl

from lowrank_gemm.kernels.schedule import grouped_tile, grouped_tile_host, persistent_grid


@triton.jit
def _tile_order_kernel(out_ptr, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    t = tl.program_id(0)
    pid_m, pid_n = grouped_tile(t, num_pid_m, num_pid_n, GROUP_M)
    tl.store(out_ptr + 2 * t, pid_m)
    tl.store(out_ptr + 2 * t + 1, pid_n)


@pytest.mark.parametrize("pm,pn,g", [(5, 3, 2), (1, 7, 8), (9, 4, 4), (3, 3, 1)])
def test_grouped_tile_matches_host_and_covers_once(pm, pn, g):
    out = torch.full((pm * pn * 2,), -1, dtype=torch.int32)
    _tile_order_kernel[(pm * pn,)](out, pm, pn, g)
    dev = [tuple(out[2 * t:2 * t + 2].tolist()) for t in range(pm * pn)]
    host = [grouped_tile_host(t, pm, pn, g) for t in range(pm * pn)]
    assert dev == host
    assert sorted(host) == [(m, n) for m in range(pm) for n in range(pn)]


def test_persistent_grid_never_exceeds_tiles():
    assert persistent_grid(1, torch.device("cpu")) == 1
    assert persistent_grid(10_000, torch.device("cpu")) >= 1


def test_aot_compile_reports_wgmma_tma_and_shared():
    from lowrank_gemm.kernels.aot import compile_sm90
    info = compile_sm90("lowrank_gemm.kernels._aot_probe", "probe_dot",
                        {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32"},
                        {"BM": 128, "BN": 128, "BK": 64}, num_warps=4, num_stages=3)
    assert info.has("wgmma", "cp.async.bulk.tensor")
    # 3 stages of a 128×64 and a 128×64 fp16 tile = 96 KiB, plus barriers
    assert 3 * 2 * 128 * 64 * 2 <= info.shared <= 3 * 2 * 128 * 64 * 2 + 4096


def test_aot_compile_binds_constexpr_defaults():
    """A constexpr the caller leaves out compiles with its default, as a JIT launch binds it (before session 11 it
    compiled as None, so a True default silently took the other branch)."""
    from lowrank_gemm.kernels.aot import compile_sm90

    def stored(constexprs):
        ptx = compile_sm90("lowrank_gemm.kernels._aot_probe", "probe_default", {"out_ptr": "*i32"}, constexprs).ptx
        return [v for v in ("1234567", "7654321") if v in ptx]
    assert stored({}) == ["1234567"] and stored({"FLAG": True}) == ["1234567"]
    assert stored({"FLAG": False}) == ["7654321"]


def test_aot_compile_server_survives_errors_and_restarts(monkeypatch):
    """Under the interpreter the compiles run in one reused child process: a compile error comes back as a clear
    RuntimeError and the child serves the next request; a dead child is replaced by the next compile."""
    import os

    from lowrank_gemm.kernels import aot
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    sig = {"out_ptr": "*i32"}
    assert "1234567" in aot.compile_sm90("lowrank_gemm.kernels._aot_probe", "probe_default", sig).ptx
    server = aot._SERVER
    assert server is not None and server.alive()
    with pytest.raises(RuntimeError, match="probe_missing"):
        aot.compile_sm90("lowrank_gemm.kernels._aot_probe", "probe_missing", sig)
    assert aot._SERVER is server and server.alive(), "an error in one compile must not cost the server"
    assert "7654321" in aot.compile_sm90("lowrank_gemm.kernels._aot_probe", "probe_default", sig, {"FLAG": False}).ptx
    server.proc.kill()
    server.proc.wait()
    assert "1234567" in aot.compile_sm90("lowrank_gemm.kernels._aot_probe", "probe_default", sig).ptx
    assert aot._SERVER is not server and aot._SERVER.alive()
    assert aot._SERVER.proc.pid != os.getpid()


def test_aot_compile_server_sees_the_callers_environment(monkeypatch):
    """An environment variable set after the compile child started reaches the next compile, as it did when every
    compile had its own child: Triton's TRITON_DEFAULT_FP_FUSION=0 turns the probe's fma into a multiply and an add."""
    from lowrank_gemm.kernels import aot
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    sig = {"x_ptr": "*fp32", "out_ptr": "*fp32"}
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)
    assert "fma.rn.f32" in aot.compile_sm90("lowrank_gemm.kernels._aot_probe", "probe_fma", sig).ptx
    assert aot._SERVER is not None and aot._SERVER.alive()
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    ptx = aot.compile_sm90("lowrank_gemm.kernels._aot_probe", "probe_fma", sig).ptx
    assert "fma.rn.f32" not in ptx and "mul.rn.f32" in ptx, ptx[-800:]
