"""The target's code coverage (cgsim.targets.vllm.coverage) as a campaign
measures it: every worker writes its own data file, whenever it first
saves, and the report combines them.  Exercised on a stand-in package laid
out like vLLM's CUDA-graph modules, so no vLLM is needed."""

from __future__ import annotations

import multiprocessing
import os
import sys

import pytest

pytest.importorskip("coverage")

MODULE = "v1/worker/gpu/cudagraph_utils.py"


def _worker(data_dir: str, branch: int) -> None:
    """A campaign worker: it saves once before it ever measures (a refused
    config: nothing of the target ran), then measures one branch."""
    from cgsim.targets.vllm import coverage as vllm_coverage

    vllm_coverage.start_in_worker()
    vllm_coverage.checkpoint(force=True)
    import vllm.v1.worker.gpu.cudagraph_utils as graphs

    with vllm_coverage.measuring():
        graphs.pick(branch)
    vllm_coverage.checkpoint(force=True)
    os._exit(0)


def test_each_worker_measures_into_its_own_file_and_the_report_combines_them(tmp_path, monkeypatch):
    if "vllm" in sys.modules:
        pytest.skip("a real vLLM is imported in this process")
    from cgsim.targets.vllm import coverage as vllm_coverage

    pkg_root = tmp_path / "pkg"
    module = pkg_root / "vllm" / MODULE
    module.parent.mkdir(parents=True)
    for d in (pkg_root / "vllm", pkg_root / "vllm" / "v1", pkg_root / "vllm" / "v1" / "worker", module.parent):
        (d / "__init__.py").write_text("")
    module.write_text("def pick(branch):\n    if branch:\n        return 'one'\n    return 'zero'\n")
    monkeypatch.syspath_prepend(str(pkg_root))
    monkeypatch.setattr(vllm_coverage, "_package_dir", lambda: str(pkg_root / "vllm"))
    monkeypatch.setattr(vllm_coverage, "_cov", None)
    data_dir = tmp_path / "target-coverage"
    monkeypatch.setenv(vllm_coverage.COVERAGE_ENV, str(data_dir))
    monkeypatch.setenv(vllm_coverage.PARENT_ENV, str(os.getpid()))  # this process is the campaign
    data_dir.mkdir()
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_worker, args=(str(data_dir), branch)) for branch in (0, 1)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    files = sorted(os.listdir(data_dir))
    assert ".coverage" not in files, "a data file shared by the workers"
    assert len(files) == 2 and all(f.startswith(".coverage.") for f in files), files
    section = vllm_coverage.summarize(str(data_dir), str(pkg_root / "vllm"))
    (measured,) = [f for f in section["files"] if f["path"].endswith("cudagraph_utils.py")]
    assert measured["executed"] == measured["statements"], section  # each worker's branch, combined
