"""What the sglang target reads off a tree, and whose failure an exception
is; no sglang needed (fake trees under --sglang-source, hand-made tracebacks).

A tree cgsim cannot drive is exit 2 with one line naming the missing piece;
an exception raised in cgsim's adapter (or naming one of its stand-ins) is an
adapter error, never a finding; one raised in sglang's code (or in cgsim's
CUDA mock, on sglang's behalf) stays sglang's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from cgsim.targets.sglang import blame, compat

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


def fake_tree(root, version: str | None, modules: dict[str, str] = None) -> str:
    pkg = root / "sglang"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    if version is not None:
        (pkg / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    for name, body in (modules or {}).items():
        path = root.joinpath(*name.split("."))
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            if str(parent) != ".":
                init = root / parent / "__init__.py"
                if not init.exists():
                    init.write_text("")
        path.with_suffix(".py").write_text(body)
    return str(root)


def fuzz_run(source: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "fuzz", "run", "--target", "sglang", "--sglang-source", source,
                           "--max-examples", "1", "--report-dir", source + "/reports"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def test_a_tree_older_than_every_design_is_exit_2_in_one_line(tmp_path):
    res = fuzz_run(fake_tree(tmp_path, "0.5.19"))
    assert res.returncode == 2, res.stderr
    err = res.stderr.strip()
    assert "\n" not in err and "Traceback" not in err
    assert "sglang 0.5.19 is older than every design cgsim knows" in err and compat.OLDEST in err


def test_a_tree_lacking_a_runner_is_exit_2_naming_the_piece(tmp_path):
    res = fuzz_run(fake_tree(tmp_path, "0.5.24"))
    assert res.returncode == 2, res.stderr
    err = res.stderr.strip()
    assert "\n" not in err and "Traceback" not in err
    assert "sglang 0.5.24 cannot be driven: it lacks module sglang.srt.model_executor.runner" in err


def test_a_tree_lacking_a_name_names_it(tmp_path):
    # Every module of REQUIRED is there but the decode runner lacks its class.
    modules = {m: "" for m, _, _ in compat.REQUIRED}
    res = fuzz_run(fake_tree(tmp_path, "0.5.24", modules))
    assert res.returncode == 2
    assert "lacks sglang.srt.model_executor.runner.DecodeCudaGraphRunner (the decode runner" in res.stderr


def test_no_sglang_package_under_the_source_is_exit_2(tmp_path):
    res = fuzz_run(str(tmp_path))
    assert res.returncode == 2
    assert "--sglang-source" in res.stderr and "no sglang package there" in res.stderr


def test_designs_by_release():
    assert compat.design_for("0.5.19") is None
    assert [compat.design_for(v).ruleset for v in ("0.5.20", "0.5.21", "0.5.22", "0.5.23", "0.5.30")] == [
        "sglang-0.5.20", "sglang-0.5.20", "sglang-0.5.22", "sglang", "sglang"]
    assert compat.source_root  # a checkout's python/ folder is found too


def test_a_checkout_python_folder_is_a_source_root(tmp_path):
    (tmp_path / "python").mkdir()
    fake_tree(tmp_path / "python", "0.5.22")
    assert compat.source_root(str(tmp_path)) == str(tmp_path / "python")
    assert compat.tree_version(str(tmp_path / "python")) == "0.5.22"


# -- whose failure ------------------------------------------------------------------------------


def _raise_in(path: str, exc: BaseException) -> BaseException:
    """``exc`` raised by code whose file is ``path``."""
    code = compile(textwrap.dedent("""
        def boom(exc):
            raise exc
    """), path, "exec")
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - a frame with a chosen file name
    try:
        scope["boom"](exc)
    except BaseException as caught:  # noqa: BLE001
        return caught
    raise AssertionError("did not raise")


CGSIM = os.path.join(REPO, "cgsim")


@pytest.mark.parametrize("path", [os.path.join(CGSIM, "targets", "sglang", "_world.py"),
                                  os.path.join(CGSIM, "workload", "model.py")])
def test_an_exception_raised_in_cgsim_is_the_adapters(path):
    assert blame.raised_by_adapter(_raise_in(path, RuntimeError("x"))) is not None


def test_an_exception_raised_in_sglang_is_sglangs():
    exc = _raise_in("/venv/site-packages/sglang/srt/model_executor/runner/base_runner.py", IndexError("list index"))
    assert blame.raised_by_adapter(exc) is None


def test_the_cuda_mock_raises_on_sglangs_behalf():
    exc = _raise_in(os.path.join(CGSIM, "cuda_mock", "_graph.py"), RuntimeError("operation not permitted"))
    assert blame.raised_by_adapter(exc) is None


def test_an_attribute_sglang_misses_on_a_stand_in_is_the_adapters():
    exc = _raise_in("/venv/site-packages/sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
                    AttributeError("'AdapterSlots' object has no attribute 'init_cuda_graph_batch_info'"))
    assert "AdapterSlots" in blame.raised_by_adapter(exc)


def test_process_state_the_adapter_did_not_publish_is_the_adapters():
    exc = _raise_in("/venv/site-packages/sglang/srt/runtime_context.py",
                    RuntimeError("parallel name 'attn_tp_rank' has not been written in this process."))
    assert blame.raised_by_adapter(exc) is not None


def test_an_engine_call_error_is_sglangs_and_a_cause_decides():
    assert blame.raised_by_adapter(_raise_in(os.path.join(CGSIM, "targets", "sglang", "_world.py"),
                                             blame.EngineCallError("sglang passed 9 rows"))) is None
    sglang_exc = _raise_in("/venv/site-packages/sglang/x.py", ValueError("bad"))
    wrapped = _raise_in(os.path.join(CGSIM, "targets", "sglang", "_handle.py"), RuntimeError("context"))
    wrapped.__cause__ = sglang_exc
    assert blame.raised_by_adapter(wrapped) is None


def test_guarded_turns_adapter_failures_into_one_line_environment_errors():
    class Handle:
        @blame.guarded
        def capture(self):
            raise _raise_in(os.path.join(CGSIM, "targets", "sglang", "_handle.py"), KeyError("slot"))

        @blame.guarded
        def execute(self):
            raise _raise_in("/venv/site-packages/sglang/srt/x.py", IndexError("list index out of range"))

    with pytest.raises(compat.SglangAdapterError) as info:
        Handle().capture()
    assert "not sglang" in str(info.value) and "_handle.py" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(IndexError):
        Handle().execute()


def test_the_install_script_takes_a_release_number(tmp_path):
    venv = tmp_path / "venv"
    res = subprocess.run(["bash", os.path.join(REPO, "scripts", "install_sglang.sh"), str(venv), "0.5"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip() == ("install_sglang.sh: VERSION '0.5' is not a release number; give one such as 0.5.22 "
                                  "(or none for the newest)")
    assert not venv.exists()
