"""vLLM's own model runner in the loop (cgsim.targets.vllm.runner_build): the
graphs the V2 GPUModelRunner captures for a launch, against what cgsim's
stand-in of the runner (the handle) captures for the same config.

Each runner build runs in a child process (Triton's interpreter, a one-rank
gloo world): ~20-50 s on a 2-core host, so those tests are slow.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

from tests.vllm_required import skip_unless_vllm

skip_unless_vllm()

from cgsim.config import ManagerConfig  # noqa: E402
from cgsim.modes import AttentionSupport, CUDAGraphMode  # noqa: E402
from cgsim.targets.releases import version_key  # noqa: E402
from cgsim.targets.vllm.compat import VllmEnvironmentError  # noqa: E402
from cgsim.targets.vllm.engine import EngineRefused, launch_for  # noqa: E402
from cgsim.targets.vllm.runner_build import (  # noqa: E402
    Confirmation,
    GraphEntry,
    ManagerGraphs,
    RunnerGraphs,
    build_here,
    build_runner,
    confirm,
    confirm_findings,
)
from cgsim.targets.vllm.stand_in import stand_in_graphs  # noqa: E402
from cgsim.targets.vllm import runner_build, runner_serve  # noqa: E402

pytestmark = pytest.mark.vllm

SMALL = dict(capture_sizes=(1, 2, 4), max_num_reqs=4, compiled_piecewise=False)
CONFIGS = {
    "full-decode-only": ManagerConfig(mode=CUDAGraphMode.FULL_DECODE_ONLY, **SMALL),
    "full-and-piecewise-breakable": ManagerConfig(mode=CUDAGraphMode.FULL_AND_PIECEWISE, breakable=True, **SMALL),
    # FA2's support level (the launch names FLASH_ATTN with flash_attn_version 2): FULL resolves to
    # FULL_DECODE_ONLY on both sides, so the platform's attention backend declares the launch's level.
    "full-uniform-batch": ManagerConfig(mode=CUDAGraphMode.FULL, attention_support=AttentionSupport.UNIFORM_BATCH,
                                        breakable=True, attention_split=False, **SMALL),
    # torch.compile's piecewise split (the default launch): the compiled pieces' graph wrappers too.
    "full-and-piecewise-compiled": ManagerConfig(mode=CUDAGraphMode.FULL_AND_PIECEWISE, capture_sizes=(1, 2, 4),
                                                 max_num_reqs=4),
    # EAGLE with two speculative tokens: the speculator's draft prefill and draft decode managers too.
    "eagle-full-and-piecewise-breakable": ManagerConfig(mode=CUDAGraphMode.FULL_AND_PIECEWISE, decode_query_len=3,
                                                        breakable=True, capture_sizes=(3, 6), max_num_reqs=2,
                                                        compiled_piecewise=False),
}


@functools.lru_cache(maxsize=None)
def _built(name: str) -> RunnerGraphs:
    """One runner build per config for the whole module."""
    return build_runner(launch_for(CONFIGS[name]))


def _listing(managers: tuple[ManagerGraphs, ...]) -> list[tuple]:
    """What is compared: each manager's name, resolved mode and graphs (not
    its class: the handle's is a tapped subclass of the same vLLM class)."""
    return [(m.name, m.mode, m.graphs) for m in managers]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_runner_captures_what_the_stand_in_captures(name: str) -> None:
    config = CONFIGS[name]
    built = _built(name)
    assert built.raised is None, built.raised
    assert built.attention_backend == "TRITON_ATTN"
    assert not built.has_ubatch_runner
    assert built.main is not None and built.main.graphs, built
    assert _listing(built.managers) == _listing(stand_in_graphs(config))
    if config.decode_query_len > 1:
        assert {m.name for m in built.managers} == {"main", "draft-prefill", "draft-decode"}


@pytest.mark.slow
def test_full_decode_only_captures_one_uniform_decode_graph_per_size() -> None:
    built = _built("full-decode-only")
    assert built.main is not None and built.main.mode == "FULL_DECODE_ONLY"
    assert [g.short() for g in built.main.graphs] == ["F:t1:r1:u1", "F:t2:r2:u1", "F:t4:r4:u1"]


@pytest.mark.slow
def test_a_launch_vllm_refuses_is_refused_not_built() -> None:
    # DBO with PIECEWISE graphs: vLLM's config path refuses it (docs/vllm.md).
    config = ManagerConfig(mode=CUDAGraphMode.PIECEWISE, num_ubatches=2, breakable=True, **SMALL)
    with pytest.raises(EngineRefused):
        build_runner(launch_for(config))


def test_building_in_a_process_that_imported_vllm_is_an_environment_error() -> None:
    # This process imported vLLM without Triton's interpreter (skip_unless_vllm).
    launch = launch_for(CONFIGS["full-decode-only"])
    before = {name: os.environ.get(name) for name in dict(launch.env)}
    with pytest.raises(VllmEnvironmentError, match="fresh process") as info:
        build_here(launch)
    assert "\n" not in str(info.value)
    # Nothing of the launch's environment is left behind for the tests after it (VLLM_USE_V2_MODEL_RUNNER).
    assert {name: os.environ.get(name) for name in dict(launch.env)} == before


def test_runner_graphs_round_trip_through_json() -> None:
    graphs = RunnerGraphs("0.32.0", "vllm serve x",
                          (ManagerGraphs("main", "ModelCudaGraphManager", "FULL_AND_PIECEWISE",
                                         (GraphEntry("FULL", 4, 4, 1), GraphEntry("PIECEWISE", 8, None, None))),),
                          False, "TRITON_ATTN", None, (1.0, 2.0), (3 << 20, 2 << 20))
    assert RunnerGraphs.from_json(graphs.to_json()) == graphs
    assert RunnerGraphs.from_json({**graphs.to_json(), "graph_memory": None}).graph_memory is None
    assert graphs.main is graphs.managers[0]
    assert [g.short() for g in graphs.main.graphs] == ["F:t4:r4:u1", "P:t8"]


@pytest.mark.slow
def test_the_workers_graph_memory_profiling_runs_before_the_capture() -> None:
    # Worker.determine_available_memory asks the runner's profile_cudagraph_memory (0.29+: a profiling
    # capture into a throwaway pool, torn down before the real one; 0.20-0.28 answer 0), then the real
    # capture builds every graph again.
    built = _built("full-and-piecewise-compiled")
    assert built.raised is None and built.graph_memory is not None, built
    estimate, captured = built.graph_memory
    assert captured > 0
    assert (estimate > 0) == (version_key(built.vllm_version) >= (0, 29, 0)), built.graph_memory
    assert [g.short() for g in built.main.graphs] == ["F:t1:r1:u1", "F:t2:r2:u1", "F:t4:r4:u1", "P:t1", "P:t2", "P:t4"]


@pytest.mark.slow
def test_a_uniform_batch_launch_resolves_full_to_full_decode_only() -> None:
    built = _built("full-uniform-batch")
    assert built.main is not None and built.main.mode == "FULL_DECODE_ONLY"


# -- confirm: a finding's graphs asked of the runner -----------------------------------------------

FINDINGS = Path(__file__).resolve().parents[4] / "docs" / "findings"


def _finding(name: str) -> dict:
    return json.loads((FINDINGS / f"{name}.json").read_text())


def _fake_runner(*graphs: GraphEntry, raised: str | None = None, ubatch: bool = False):
    built = RunnerGraphs("0.32.0", "vllm serve x", (ManagerGraphs("main", "ModelCudaGraphManager", "FULL", graphs),),
                         ubatch, "TRITON_ATTN", raised)
    seen = []

    def build(launch, timeout_s=None):
        seen.append(launch)
        return built

    return build, seen


def test_confirm_finds_the_named_graph_in_the_runner_built_manager() -> None:
    finding = _finding("skip-attn-9656d102f2")  # names Desc(PIECEWISE tokens=1)
    build, seen = _fake_runner(GraphEntry("PIECEWISE", 1, None, None), GraphEntry("FULL", 1, 1, 1))
    got = confirm(finding, build=build)
    assert (got.verdict, got.manager, got.named) == ("confirmed", "main", (GraphEntry("PIECEWISE", 1, None, None),))
    assert seen[0].line() == finding["launch"]["line"]


def test_confirm_says_which_named_graphs_the_runner_never_builds() -> None:
    finding = _finding("init-total-e28a0e026e")  # a micro-batched (DBO) graph without data parallelism
    build, _ = _fake_runner(GraphEntry("FULL", 16, 1, None))
    got = confirm(finding, build=build)
    assert got.verdict == "absent"
    assert [g.short() for g in got.missing] == ["F:t16:r1:u16:ub2"]
    assert "micro-batch runner: no" in got.detail


def _dispatch_finding(*expected: dict) -> dict:
    """A DISPATCH-PRIORITY finding as a campaign writes it: its batch went eager
    although each graph of ``expected`` (equally preferred) fits it."""
    finding = _finding("skip-attn-9656d102f2")  # for its launch
    finding.update(property="DISPATCH-PRIORITY", facts={
        "batch": {"num_reqs": 1, "num_tokens": 5, "max_query_len": 5, "uniform_token_count": 5},
        "got": {"cg_mode": "NONE", "num_tokens": 5, "num_reqs": 1}, "expected": list(expected)})
    return finding


def test_a_dispatch_finding_needs_one_of_the_graphs_that_fit_its_batch() -> None:
    full = {"cg_mode": "FULL", "num_tokens": 15, "num_reqs": 3, "uniform_token_count": 5}
    piecewise = {"cg_mode": "PIECEWISE", "num_tokens": 16}
    finding = _dispatch_finding(full, piecewise)
    build, _ = _fake_runner(GraphEntry("PIECEWISE", 16, None, None))
    assert confirm(finding, build=build).verdict == "confirmed"
    build, _ = _fake_runner(GraphEntry("PIECEWISE", 8, None, None))
    got = confirm(finding, build=build)
    assert got.verdict == "absent" and [g.short() for g in got.missing] == ["F:t15:r3:u5", "P:t16"]


def test_confirm_findings_builds_and_serves_each_launch_once(monkeypatch: pytest.MonkeyPatch) -> None:
    build, seen = _fake_runner(GraphEntry("PIECEWISE", 1, None, None))
    findings = [dict(_finding("skip-attn-9656d102f2"), id=f"f{i}") for i in range(3)]
    findings.append(dict(_finding("init-total-e28a0e026e"), id="absent"))  # its graph is not built: not served
    monkeypatch.setattr(runner_build, "build_runner", build)
    served = []

    def serve(launch, timeout_s):
        served.append(launch)
        return {"requests": 3, "replays": 6, "raised": None, "eager_raised": None, "differences": []}

    monkeypatch.setattr(runner_serve, "served_consequence", serve)
    built = confirm_findings(findings, jobs=2)
    assert len(seen) == 2 and sorted(built) == ["absent", "f0", "f1", "f2"]
    assert [c.verdict for fid, c in sorted(built.items())] == ["absent", "confirmed", "confirmed", "confirmed"]
    assert built["f0"].to_json()["named"] == ["P:t1"] and "served" not in built["f0"].to_json()
    got = runner_serve.serve_confirmed(findings, built, jobs=2)
    assert [launch.line() for launch in served] == [findings[0]["launch"]["line"]]
    assert got["f2"].to_json()["served"]["differences"] == [] and "served" not in got["absent"].to_json()
    assert runner_serve.serve_confirmed(findings, built, jobs=1, budget_s=0) == built  # no time: nothing served


def test_confirm_of_a_finding_naming_no_graph_builds_nothing() -> None:
    build, seen = _fake_runner()
    got = confirm(_finding("dispatch-sound-2f61bbe9aa"), build=build)
    assert got.verdict == "no-graph" and not seen


def test_confirm_reports_refusals_and_the_environment_apart() -> None:
    def refuse(launch):
        raise EngineRefused("vLLM refuses these engine arguments: no")

    def broken(launch):
        raise VllmEnvironmentError("the installed vLLM build lacks a compiled op")

    finding = _finding("skip-attn-9656d102f2")
    assert confirm(finding, build=refuse).verdict == "refused"
    got = confirm(finding, build=broken)
    assert isinstance(got, Confirmation) and got.verdict == "environment" and "compiled op" in got.detail


@pytest.mark.slow
def test_confirm_a_dbo_finding_without_data_parallelism_is_absent_from_the_runner() -> None:
    # 0.32 v1/worker/gpu/ubatch_utils.py maybe_build_ubatch_runner: no micro-batch runner with
    # data_parallel_size 1, so the manager makes no micro-batch twins.  #8's JSON as recorded before its
    # launch became the MoE, DP 2, expert-parallel one: a dense launch on one rank.
    finding = _finding("init-total-e28a0e026e")
    args = finding["launch"]["args"]
    del args["data_parallel_size"], args["enable_expert_parallel"]
    finding["launch"]["toy_model"] = "dense"
    got = confirm(finding)
    assert got.verdict == "absent", got
    assert got.runner is not None and not got.runner.has_ubatch_runner
    assert all(g.num_ubatches == 1 for g in got.runner.main.graphs)


@pytest.mark.slow
def test_confirm_a_finding_of_a_compiled_launch_and_serve_it() -> None:
    # The launch leaves torch.compile on (vLLM's default): the model is compiled through dynamo around
    # attention's opaque op, as on CUDA, and the decode graph the finding names is the runner's.  Served,
    # its graphs give eager's tokens: the finding wastes graph memory, it does not change outputs.
    findings = [_finding("capture-useful-a02a072c44")]
    got = runner_serve.serve_confirmed(findings, confirm_findings(findings, jobs=1), jobs=1)["capture-useful-a02a072c44"]
    assert got.verdict == "confirmed", got
    assert got.served is not None and got.served.get("replays", 0) > 0, got.served
    assert got.served["differences"] == [] and got.served["raised"] is None, got.served


def test_a_package_missing_here_is_the_environment_not_a_runner_failure() -> None:
    # The lent GPU machine lacked compressed_tensors, which the EAGLE draft's load imports.
    with pytest.raises(VllmEnvironmentError, match="not installed here"):
        with runner_build.vllm_frames("GPUModelRunner.load_model"):
            raise ModuleNotFoundError("No module named 'compressed_tensors'")


def test_what_only_an_accelerator_has_is_the_environment_not_a_runner_failure() -> None:
    # 0.23-0.26's structured-output buffers ask torch for pinned memory, which a CPU build of torch lacks.
    with pytest.raises(VllmEnvironmentError, match="CPU device lacks"):
        with runner_build.vllm_frames("EngineCore._initialize_kv_caches"):
            raise RuntimeError("pin_memory=True requires a CUDA or other accelerator backend; no pinned memory "
                               "allocator is available on this system.")


def test_no_build_starts_once_the_confirmation_budget_is_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    build, seen = _fake_runner(GraphEntry("PIECEWISE", 1, None, None))
    monkeypatch.setattr(runner_build, "build_runner", build)
    got = confirm_findings([_finding("skip-attn-9656d102f2")], jobs=1, budget_s=0)
    assert seen == [] and got["skip-attn-9656d102f2"].verdict == "unasked"
    assert "budget" in got["skip-attn-9656d102f2"].detail


def test_a_build_the_budget_cuts_short_is_unasked_not_the_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child that ran out of the time it was given says nothing of the
    runner or the environment: the report says so ("not asked")."""
    from cgsim.report.defects import runner_said  # noqa: PLC0415
    from cgsim.targets.vllm.compat import RunnerTimedOut  # noqa: PLC0415

    def build(launch, timeout_s):
        raise RunnerTimedOut(f"building vLLM's model runner took over {timeout_s:.0f} s")

    monkeypatch.setattr(runner_build, "build_runner", build)
    got = confirm_findings([_finding("skip-attn-9656d102f2")], jobs=1, budget_s=30)["skip-attn-9656d102f2"]
    assert got.verdict == "unasked" and got.detail.startswith("the confirmation budget (30 s) ran out (building")
    assert runner_said({"runner_confirmation": got.to_json()}).startswith("not asked: the confirmation budget")


def test_a_stop_kills_the_children_a_runner_phase_waits_on(tmp_path, monkeypatch) -> None:
    """Ctrl-C during the runner's phases: the builds and served launches
    running in children are killed, not waited for to their timeout."""
    (tmp_path / "cgsim_sleeper.py").write_text("import time\ntime.sleep(120)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    stop_at = [None]

    def child(_: int) -> str:
        try:
            runner_build.in_child("cgsim_sleeper", {}, 120, "sleeping")
        except VllmEnvironmentError as exc:
            return str(exc)
        return "finished"

    def stopped() -> bool:  # asked every half second: the second asking stops
        stop_at[0] = 0 if stop_at[0] is None else stop_at[0] + 1
        return stop_at[0] >= 1

    said = runner_build.each_until_stopped(child, [1, 2], 2, stopped)
    assert all("died (exit -9)" in s for s in said), said  # SIGKILL: the sleeper would have exited 0
    assert not runner_build._RUNNING


def test_a_stop_signal_during_a_runner_phase_kills_its_children(tmp_path, monkeypatch) -> None:
    """SIGTERM (raised as an exception in the campaign's main thread) while a
    phase waits: the children go too, and the exception goes on."""
    (tmp_path / "cgsim_sleeper.py").write_text("import time\ntime.sleep(120)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    said: list[str] = []

    def child(_: int) -> None:
        try:
            runner_build.in_child("cgsim_sleeper", {}, 120, "sleeping")
        except VllmEnvironmentError as exc:
            said.append(str(exc))

    asked = [0]

    def stopped() -> bool:
        asked[0] += 1
        if asked[0] == 2:
            raise KeyboardInterrupt
        return False

    with pytest.raises(KeyboardInterrupt):
        runner_build.each_until_stopped(child, [1], 1, stopped)
    assert said and "died (exit -9)" in said[0] and not runner_build._RUNNING


def test_a_loaded_scalar_indexes_under_the_interpreter_on_any_numpy() -> None:
    """A kernel looping to a bound it loaded (vLLM's LoRA and block-table
    kernels): Triton's interpreter up to 3.6 took int() of a one-element
    array, an error on NumPy 2.5 and a deprecation before it (an error here).
    The index such a release installs is checked as well, whatever Triton
    runs here."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    code = """
import os, warnings
os.environ["TRITON_INTERPRET"] = "1"
from cgsim.targets.vllm import runner_build
runner_build._triton_interpreter()
import torch, triton, triton.language as tl

@triton.jit
def add_n(n_ptr, out_ptr):
    n = tl.load(n_ptr)
    acc = 0
    for _ in range(n):
        acc += 1
    tl.store(out_ptr, acc)

warnings.simplefilter("error", DeprecationWarning)
out = torch.zeros(1, dtype=torch.int32)
add_n[(1,)](torch.tensor([3], dtype=torch.int32), out)

import operator, types, numpy as np
from triton.runtime import interpreter
class Tensor: pass
scope = interpreter._LangPatchScope()
scope.set_attr(Tensor, "__index__", lambda self: int(self.handle.data))  # Triton 3.6's
t = Tensor(); t.handle = types.SimpleNamespace(data=np.array([4]))
print(int(out[0]), operator.index(t))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=str(Path(__file__).resolve().parents[4]))
    assert run.returncode == 0 and run.stdout.strip().splitlines()[-1] == "3 4", run.stderr[-2000:]


def test_the_worker_says_its_device_backs_no_extensible_kv_cache_on_any_host(monkeypatch) -> None:
    # 0.34's GPU worker asks the host's accelerator; on a GPU host that says yes, and vLLM would put the
    # KV cache in an ExtensibleTensor on the mock's CPU tensors (ValueError: requires a cuda device).
    import torch

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    view = runner_build._WorkerView.__new__(runner_build._WorkerView)
    assert view.extensible_kv_cache_unsupported_reason() == runner_build._WorkerView.NO_EXTENSIBLE_KV_CACHE
