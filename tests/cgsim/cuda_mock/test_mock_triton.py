"""Triton kernels inside a mock capture, under Triton's interpreter: recorded
at capture (not run), run at every replay on the addresses they were given,
as a real graph's kernel nodes are.

Triton comes with the vLLM environment (vLLM's runner runs its kernels
through the interpreter on the mock); each case runs in a fresh process,
since the interpreter is chosen before Triton is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.vllm_required import skip_unless_vllm

skip_unless_vllm()

pytestmark = pytest.mark.vllm
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

SCRIPT = textwrap.dedent("""
    import torch, triton, triton.language as tl
    from cgsim.backends import get_backend

    @triton.jit
    def add_one(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)

    backend = get_backend("mock")
    with backend.activate():
        cuda = backend.cuda
        x, out = torch.zeros(4), torch.full((4,), -7.0)
        g = cuda.CUDAGraph()
        s = cuda.Stream()
        with cuda.stream(s):
            g.capture_begin()
            add_one[(1,)](x, out, 4, BLOCK=4)
            g.capture_end()
        print("after capture", out.tolist())
        x.fill_(2.0)
        g.replay()
        print("after replay", out.tolist())
        x.fill_(5.0)
        g.replay()
        print("after second replay", out.tolist(), g.recorded_ops)
    add_one[(1,)](x, out, 4, BLOCK=4)  # outside any capture: runs at once
    print("outside", out.tolist())
""")


def test_a_triton_kernel_captured_runs_at_each_replay_not_at_capture(tmp_path):
    pytest.importorskip("triton")
    script = tmp_path / "triton_in_graph.py"
    script.write_text(SCRIPT)
    run = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": ROOT})
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[0] == "after capture [-7.0, -7.0, -7.0, -7.0]"  # a capture runs no kernel
    assert lines[1] == "after replay [3.0, 3.0, 3.0, 3.0]"
    assert lines[2] == "after second replay [6.0, 6.0, 6.0, 6.0] ['triton.add_one']"
    assert lines[3] == "outside [6.0, 6.0, 6.0, 6.0]"
