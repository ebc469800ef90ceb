"""vLLM through its own front door: configs are engine arguments that vLLM's
own config path builds, what it refuses is never judged, every finding's
launch line is one vLLM starts with, and a replay says reproduced (1), holds
(0) or could not run (2) honestly.

Needs vLLM (the ``vllm-0.NN`` tox envs); skipped with the reason elsewhere,
unless CGSIM_REQUIRE_VLLM=1 says vLLM must be there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.vllm_required import skip_unless_vllm

skip_unless_vllm()

from cgsim.config import ManagerConfig  # noqa: E402
from cgsim.descriptors import Batch  # noqa: E402
from cgsim.finding import Finding  # noqa: E402
from cgsim.scenario import Scenario, Step  # noqa: E402
from cgsim.targets.base import TargetUnsupported  # noqa: E402
from cgsim.targets.vllm import VllmTarget  # noqa: E402
from cgsim.targets.vllm.compat import require_vllm  # noqa: E402
from cgsim.targets.vllm.compat import version_key  # noqa: E402
from cgsim.targets.vllm.engine import EngineRefused, engine_config, launch_for, reach, runs_v2_runner  # noqa: E402

pytestmark = pytest.mark.vllm
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
CAPS = require_vllm()
TARGET = VllmTarget(warm=False)


def _v2_runner_builds(args: dict, env: dict, model: str) -> None:
    """vLLM's own EngineArgs build these engine arguments into a config for
    the V2 model runner (the one whose manager cgsim drives)."""
    from cgsim.targets.vllm.engine import EngineLaunch

    assert runs_v2_runner(EngineLaunch.of(model, args, env)), (args, env)


def test_a_config_is_the_engine_arguments_vllm_builds_it_from():
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=8, decode_query_len=3)
    launch = launch_for(cfg)
    line = launch.line()
    assert "vllm serve" in line and "--max-num-seqs 8" in line and '"num_speculative_tokens":2' in line
    assert '"cudagraph_mode":"FULL_AND_PIECEWISE"' in line
    vc = engine_config(launch)
    assert vc.scheduler_config.max_num_seqs == 8 and vc.speculative_config.num_speculative_tokens == 2
    assert reach(cfg).decode_query_len == 3


@pytest.mark.parametrize("config, reason, accepted_from", [
    (ManagerConfig(mode="FULL_DECODE_ONLY", capture_sizes=(2, 4), max_num_reqs=4, num_ubatches=2,
                   lora_cases=(0, 2)), "dual batch overlap with LoRA", None),
    # 0.34's _get_dbo_unsupported_features (config/vllm.py) no longer lists it: drafting runs whole after
    # the micro-batched forward.
    (ManagerConfig(mode="FULL_DECODE_ONLY", capture_sizes=(2, 4), max_num_reqs=4, num_ubatches=2,
                   decode_query_len=2), "dual batch overlap with speculative decoding", "0.34"),
])
def test_settings_vllm_refuses_or_sends_to_another_runner_are_not_judged(config, reason, accepted_from):
    if not CAPS.dbo:
        pytest.skip(f"vLLM {CAPS.version} has no micro-batching in MRV2")
    if accepted_from is not None and version_key(CAPS.version) >= version_key(accepted_from):
        try:
            TARGET.drawing.engine_config(config)
        except TargetUnsupported as exc:
            assert reason not in str(exc)
        return
    with pytest.raises(TargetUnsupported, match=reason):
        TARGET.drawing.engine_config(config)
    sc = Scenario(config, (Step.capture(), Step.dispatch(Batch.uniform(2, config.decode_query_len))),
                  ruleset=CAPS.ruleset)
    from cgsim.observe import observe

    outcome = observe(sc, "vllm", "mock", 60.0)
    assert not outcome.findings and not outcome.checked and reason in outcome.unsupported
    assert any(dim == "not_reachable" and reason in key for dim, key in outcome.coverage)


def test_a_release_needs_an_elastic_expert_parallel_launch():
    cfg = ManagerConfig(mode="FULL", capture_sizes=(1, 2), max_num_reqs=2)
    sc = Scenario(cfg, (Step.capture(), Step.release(), Step.capture()), ruleset=CAPS.ruleset)
    launch = TARGET.triage.launch(sc)
    assert "--enable-elastic-ep" in launch["line"] and launch["args"]["data_parallel_size"] == 2
    reason = TARGET.drawing.unreachable(sc)
    try:
        engine_config(launch_for(cfg, release=True))
        assert reason is None
    except EngineRefused:
        assert reason is not None and "elastic expert parallelism" in reason


def test_micro_batching_is_reached_only_with_data_parallel_ranks_of_one_engine():
    """vLLM's V2 runner builds its micro-batch runner only with more than one
    data-parallel rank (ubatch_utils.py maybe_build_ubatch_runner), and a
    dense model's ranks run as independent one-rank engines (v1/engine/core.py):
    a DBO launch without a MoE model on DP >= 2 builds a manager without
    micro-batch graphs, so a micro-batched config is reached only by the MoE,
    DP 2, expert-parallel launch."""
    if not CAPS.dbo:
        pytest.skip(f"vLLM {CAPS.version} has no micro-batching in MRV2")
    from cgsim.targets.vllm.engine import EngineLaunch, check_launch, check_reached

    cfg = ManagerConfig(mode="FULL_DECODE_ONLY", capture_sizes=(1, 2, 4, 8), max_num_reqs=8, num_ubatches=2,
                        ubatch_threshold=2)
    launch = launch_for(cfg)
    args = launch.kwargs()
    assert args["data_parallel_size"] == 2 and args["enable_expert_parallel"] and launch.model == "moe"
    assert reach(cfg).num_ubatches == 2
    check_reached(cfg)
    no_dp = {k: v for k, v in args.items() if k not in ("data_parallel_size", "enable_expert_parallel")}
    attention = (launch.attention[0], json.loads(launch.attention[1])) if launch.attention else None
    for model, extra in (("dense", {}), ("moe", {}), ("dense", {"data_parallel_size": 2})):
        other = EngineLaunch.of(model, {**no_dp, **extra}, dict(launch.env), attention)
        assert engine_config(other).parallel_config.use_ubatching  # vLLM accepts the launch ...
        with pytest.raises(EngineRefused, match="num_ubatches=1.*maybe_build_ubatch_runner"):
            check_launch(other, cfg)  # ... and builds no micro-batched graphs from it


def test_cis_report_check_refuses_a_finding_whose_launch_builds_another_manager(tmp_path):
    """.ci/check_vllm_report.py: a finding counts only where its recorded
    launch builds the manager config its scenario judges (#8's JSON with the
    launch before micro-batching needed data parallelism: not reachable)."""
    if not CAPS.dbo:
        pytest.skip(f"vLLM {CAPS.version} has no micro-batching in MRV2")
    finding = json.load(open(os.path.join(ROOT, "docs", "findings", "init-total-e28a0e026e.json")))
    finding["known_defect"] = "#8"
    stale = json.loads(json.dumps(finding))
    args = stale["launch"]["args"]
    del args["data_parallel_size"], args["enable_expert_parallel"]
    stale["launch"]["toy_model"] = "dense"

    def check(f: dict) -> subprocess.CompletedProcess:
        report = tmp_path / f["launch"]["toy_model"]
        report.mkdir()
        (report / "summary.json").write_text(json.dumps({"scenarios": 1, "findings": [f]}))
        return subprocess.run([sys.executable, os.path.join(ROOT, ".ci", "check_vllm_report.py"), str(report)],
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                              timeout=600)

    good, bad = check(finding), check(stale)
    assert good.returncode == 0, (good.stdout[-1500:], good.stderr[-1500:])
    assert bad.returncode == 1 and "1 not reachable" in bad.stdout, (bad.stdout[-1500:], bad.stderr[-1500:])


def test_every_finding_launch_is_one_vllm_starts_with_on_the_v2_runner(tmp_path):
    """Each finding a campaign here reports (60 scenarios) records engine
    arguments and environment vLLM's own config path builds for the V2
    runner, and the runner's verdict on it.  (On 0.32 this campaign finds
    #1 and #15; on 0.34 it may find nothing in its budget.)"""
    reports = tmp_path / "reports"
    # The runner's confirmation is what this checks; its served share is test_vllm_mutations.py's.
    run = subprocess.run([sys.executable, "-m", "fuzz", "run", "--target", "vllm", "--max-examples", "60",
                          "--workers", "1", "--seed", "2", "--report-dir", str(reports), "--quiet",
                          "--runner-share", "0"],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode in (0, 1), run.stderr[-2000:]
    summary = json.loads((reports / "latest" / "summary.json").read_text())
    for f in summary["findings"]:
        launch = f["launch"]
        assert launch["line"].split(" vllm serve ")[0].startswith("VLLM_") or launch["line"].startswith("vllm serve")
        _v2_runner_builds(launch["args"], launch["env"], launch["toy_model"])
        # The campaign's last phase built the launch with vLLM's own runner and looked its graphs up there:
        # a finding counts as a defect only where the runner holds them (or it names none).
        said = f["runner_confirmation"]
        assert said["verdict"] in ("confirmed", "no-graph", "absent", "unasked", "environment"), said
        if said["verdict"] == "confirmed":
            assert said["named"] and not said["missing"], said
        assert (said["verdict"] == "absent") == (f["id"] in summary["manager_level"]), said
    assert not any(n.startswith("runner share") for n in summary["notes"]), summary["notes"]


# -- replay outcomes: reproduced 1, holds 0, could not run 2 ---------------------------------------------


def _replay(path: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fuzz", "replay", path], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT, **(env or {})}, capture_output=True, text=True,
                          timeout=600)


def _finding_file(tmp_path, config: ManagerConfig, steps: tuple, prop: str) -> str:
    sc = Scenario(config, steps, ruleset=CAPS.ruleset)
    f = Finding(property=prop, message="written by the test", target="vllm", backend="mock", scenario=sc.to_json())
    path = tmp_path / f"{f.id}.json"
    path.write_text(json.dumps(f.to_json()))
    return str(path)


def test_replay_of_a_finding_that_builds_and_violates_exits_1():
    # #8 (micro-batched twins of mixed FULL graphs) is in every release with DBO since 0.30.
    if not CAPS.dbo:
        pytest.skip(f"vLLM {CAPS.version} has no micro-batching in MRV2")
    run = _replay(os.path.join(ROOT, "docs", "findings", "init-total-e28a0e026e.json"))
    assert run.returncode == 1, (run.stdout[-1500:], run.stderr[-1500:])
    assert "REPRODUCED" in run.stdout


def test_replay_of_a_finding_that_builds_and_holds_exits_0(tmp_path):
    path = _finding_file(tmp_path, ManagerConfig(mode="FULL", capture_sizes=(1, 2, 4), max_num_reqs=4),
                         (Step.capture(), Step.dispatch(Batch.uniform(2, 1))), "DISPATCH-COMPLETE")
    run = _replay(path)
    assert run.returncode == 0, (run.stdout[-1500:], run.stderr[-1500:])
    assert "not reproduced" in run.stdout


def test_replay_of_a_config_vllm_refuses_exits_2(tmp_path):
    # vLLM's config validation refuses max_cudagraph_capture_size above the largest size.
    path = _finding_file(tmp_path, ManagerConfig(mode="FULL", capture_sizes=(1, 2), max_num_reqs=2,
                                                 max_capture_size=3),
                         (Step.capture(), Step.dispatch(Batch.uniform(1, 1))), "DISPATCH-COMPLETE")
    run = _replay(path)
    assert run.returncode == 2, (run.stdout[-1500:], run.stderr[-1500:])
    err = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "cannot" in err[0], run.stderr[-1500:]


def test_replay_on_a_tree_that_does_not_import_exits_2(tmp_path):
    tree = tmp_path / "broken-tree"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm" / "__init__.py").write_text("raise ImportError('this tree is broken on purpose')\n")
    run = _replay(os.path.join(ROOT, "docs", "findings", "init-total-e28a0e026e.json"),
                  {"CGSIM_VLLM_SOURCE": str(tree)})
    assert run.returncode == 2, (run.stdout[-1500:], run.stderr[-1500:])
    assert [line for line in run.stderr.splitlines() if line.startswith("error:")]


def test_replay_where_vllm_does_not_take_cgsims_platform_exits_2(tmp_path):
    # VLLM_PLUGINS names the platform plugins vLLM may load: without cgsim's, vLLM picks another platform.
    run = _replay(os.path.join(ROOT, "docs", "findings", "init-total-e28a0e026e.json"), {"VLLM_PLUGINS": "none"})
    assert run.returncode == 2, (run.stdout[-1500:], run.stderr[-1500:])
    err = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "platform" in err[0], run.stderr[-1500:]


def test_replay_where_vllm_calls_the_adapter_differently_exits_2(tmp_path):
    from cgsim.targets.vllm.mutation import CU, Mutation, environment_for

    # vLLM's capture loop calling create_forward_fn with an argument the adapter does not know.
    drift = Mutation(CU, "                    forward_fn = create_forward_fn(desc, warmup=True)",
                     "                    forward_fn = create_forward_fn(desc, warmup=True, drifted=True)", "drift")
    path = _finding_file(tmp_path, ManagerConfig(mode="FULL", capture_sizes=(1, 2), max_num_reqs=2),
                         (Step.capture(), Step.dispatch(Batch.uniform(1, 1))), "DISPATCH-COMPLETE")
    run = _replay(path, environment_for([drift]))
    assert run.returncode == 2, (run.stdout[-1500:], run.stderr[-1500:])
    err = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "adapter" in err[0], run.stderr[-1500:]


# -- campaigns draw what vLLM accepts (issue #46: 39 % of drawn scenarios refused on 0.34) --

def test_a_max_capture_size_past_the_largest_size_is_no_launch_and_is_drawn_as_the_largest():
    # vLLM asserts max_cudagraph_capture_size == max(cudagraph_capture_sizes) where both are given.
    cfg = ManagerConfig(mode="FULL", capture_sizes=(1, 2, 4), max_num_reqs=4, max_capture_size=12)
    assert "max_capture_size 12 != max(capture_sizes) 4" in (TARGET.drawing.unsupported_reason(cfg) or "")
    settled = TARGET.drawing.engine_settings(cfg)
    assert settled == cfg.with_(max_capture_size=4)
    TARGET.drawing.engine_config(settled)


def test_engine_settings_leave_out_only_what_vllm_refuses_together():
    lora_dbo = ManagerConfig(mode="FULL_DECODE_ONLY", capture_sizes=(2, 4), max_num_reqs=4, num_ubatches=2,
                             lora_cases=(0, 2))
    settled = TARGET.drawing.engine_settings(lora_dbo)
    TARGET.drawing.engine_config(settled)  # vLLM takes it
    if CAPS.lora:
        assert settled.lora_cases == (0, 2)  # the refused combination loses micro-batching, not LoRA
    plain = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=8, decode_query_len=3)
    assert TARGET.drawing.engine_settings(plain) == plain  # a config vLLM takes is drawn as it is


def test_the_campaign_strategy_draws_configs_vllm_accepts():
    # The target: at most 10 % of the drawn configs refused, on every release.
    from hypothesis import HealthCheck, given, settings, strategies as st

    from fuzz.strategies import configs

    drawn = configs(128, TARGET.drawing.engine_capture_sizes)
    outcome = {"drawn": 0, "refused": 0}

    @settings(max_examples=60, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def draw(data):
        config = data.draw(drawn)
        outcome["drawn"] += 1
        try:
            TARGET.drawing.engine_config(TARGET.drawing.engine_settings(config))
        except TargetUnsupported:
            outcome["refused"] += 1

    draw()
    assert outcome["refused"] <= 0.10 * outcome["drawn"], outcome
