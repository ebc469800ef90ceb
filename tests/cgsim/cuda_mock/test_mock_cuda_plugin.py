"""``pytest -p cgsim --cgsim-mock-cuda``: a foreign suite's GPU-only
CUDA-graph tests run on CPU under cgsim's mock of torch.cuda; what the mock
cannot give (device memory, CUDA kernels) fails with a note saying so.

Each case runs pytest in a subprocess on a suite written to a temporary
directory, as an engine's own suite would be run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

GPU_ONLY_SUITE = '''
import pytest
import torch

# The usual guard of a GPU-only suite, evaluated at import (collection).
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_device_queries():
    assert torch.cuda.device_count() == 1 and torch.cuda.current_device() == 0
    torch.cuda.set_device(0)
    assert torch.cuda.get_device_capability() >= (8, 0)
    free, total = torch.cuda.mem_get_info()
    assert 0 < free <= total
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def test_capture_replays_on_a_side_stream_with_events():
    static_in = torch.zeros(8)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        static_out = static_in * 2 + 1  # warmup
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle()):
        static_out = static_in * 2 + 1
        assert torch.cuda.is_current_stream_capturing()
    static_in.copy_(torch.arange(8.0))
    start.record()
    g.replay()
    end.record()
    end.synchronize()
    assert torch.equal(static_out, torch.arange(8.0) * 2 + 1)
    assert start.elapsed_time(end) >= 0
    assert torch.cuda.memory_allocated() > 0


def test_sync_inside_capture_is_refused_as_on_a_gpu():
    g = torch.cuda.CUDAGraph()
    x = torch.ones(4)
    with pytest.raises(RuntimeError, match="operation failed due to a previous error during capture"):
        with torch.cuda.graph(g):
            y = x * 2
            with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
                y.sum().item()


def test_make_graphed_callables():
    model = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (x,))
    assert torch.allclose(graphed(x), model(x))
'''

NEEDS_DEVICE_MEMORY = '''
import torch

def test_tensor_on_the_cuda_device():
    torch.zeros(4, device="cuda") + 1
'''


def _pytest(tmp_path: Path, suite: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_foreign.py").write_text(textwrap.dedent(suite))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.pop("CGSIM_BACKEND", None)
    # -p no:cgsim then -p cgsim.pytest_plugin: the same plugin whether or not
    # cgsim is installed (its entry point is named cgsim).
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:cgsim", "-p", "cgsim.pytest_plugin",
           "-rA", *args, str(tmp_path / "test_foreign.py")]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)


def _no_gpu() -> bool:
    import torch

    return not torch.cuda.is_available()


pytestmark = pytest.mark.skipif(not _no_gpu(), reason="the mock refuses to shadow a real GPU (tested below)")


@pytest.mark.slow
def test_without_the_flag_a_gpu_only_suite_skips_on_cpu(tmp_path):
    res = _pytest(tmp_path, GPU_ONLY_SUITE)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "4 skipped" in res.stdout


@pytest.mark.slow
def test_under_the_mock_the_gpu_only_suite_runs_on_cpu(tmp_path):
    res = _pytest(tmp_path, GPU_ONLY_SUITE, "--cgsim-mock-cuda")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "4 passed" in res.stdout
    assert "cgsim: torch.cuda is cgsim's CPU mock" in res.stdout  # the report header says so


def test_what_the_mock_cannot_give_fails_with_a_note(tmp_path):
    res = _pytest(tmp_path, NEEDS_DEVICE_MEMORY, "--cgsim-mock-cuda")
    assert res.returncode == 1
    out = res.stdout
    assert "1 failed" in out
    assert "cgsim --cgsim-mock-cuda" in out and "holds no tensor on a 'cuda' device" in out


@pytest.mark.parametrize("args, words", [
    (["--cgsim-mock-engine", "vllm"], "add --cgsim-mock-cuda"),
    (["--cgsim-mock-cuda", "--cgsim-backend", "cuda"], "drop one of them"),
])
def test_contradictory_flags_are_one_line_usage_errors(tmp_path, args, words):
    res = _pytest(tmp_path, GPU_ONLY_SUITE, *args)
    assert res.returncode == 2, res.stdout + res.stderr  # as the other --cgsim-* usage errors
    said = [line for line in (res.stdout + res.stderr).splitlines() if words in line]
    assert len(said) == 1, res.stdout + res.stderr
    assert "passed" not in res.stdout and "Traceback" not in res.stdout + res.stderr


def test_the_mock_is_gone_after_the_session(tmp_path):
    """pytest.main in this process with the flag: torch.cuda is the real one
    again afterwards."""
    import torch

    import cgsim.pytest_plugin

    real = torch.cuda.CUDAGraph
    (tmp_path / "test_inner.py").write_text("import torch\n\ndef test_x():\n    assert torch.cuda.is_available()\n")
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:cgsim", "--cgsim-mock-cuda", str(tmp_path / "test_inner.py")],
                       plugins=[cgsim.pytest_plugin])
    assert code == 0
    assert torch.cuda.CUDAGraph is real and not torch.cuda.is_available()


VLLM_SUITE = '''
import torch
from vllm.platforms import current_platform


def test_vllm_sees_a_graph_capable_platform_with_cpu_tensors():
    assert current_platform.is_cuda_alike() and not current_platform.is_cuda()
    assert current_platform.device_type == "cpu"
    pool = current_platform.get_global_graph_pool()
    g = torch.cuda.CUDAGraph()
    x = torch.zeros(4, device=current_platform.device_type)
    with torch.cuda.graph(g, pool=pool):
        y = torch.ops._C.weak_ref_tensor(x) + 1
    x.fill_(2)
    g.replay()
    assert torch.equal(y, torch.full((4,), 3.0))
'''


@pytest.mark.vllm
def test_vllm_adapter(tmp_path):
    pytest.importorskip("vllm")
    res = _pytest(tmp_path, VLLM_SUITE, "--cgsim-mock-cuda", "--cgsim-mock-engine", "vllm")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "1 passed" in res.stdout and "vllm adapted: platform-cuda-alike" in res.stdout
