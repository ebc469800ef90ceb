"""sglang's own batch-size alignment, recorded into every trace, and cgsim's
copy of the rule held to it.

The sglang target asks the imported tree's ``get_cuda_graph_batch_size_alignment``
for each launch (``cgsim.targets.sglang.alignment``) and the recorder writes
the answer into the trace's header (``Trace.alignment``); SGL-CAND-ORDER,
SGL-CAND-BOUNDS and SGL-CAPTURE-ALIGNED judge the graphs by it.  cgsim's copy
(``spec.sglang.batch_size_alignment`` / ``alignment``) stays the reference's
rule and the rule of hand-written traces: here it must give sglang's answer
over the parallel states the helper reads and over drawn configs, so a drift
between sglang and the copy is a failure of this module, never a silent wrong
judgement (checked: a tree whose helper aligns two-batch overlap to 4 fails
the comparison, while its runners, which follow their helper, are judged
clean).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings

from tests.sglang_required import require_sglang_or_skip

VERSION = require_sglang_or_skip()

import torch  # noqa: E402

from cgsim.backends import get_backend  # noqa: E402
from cgsim.config import ManagerConfig  # noqa: E402
from cgsim.spec import sglang as rules  # noqa: E402
from cgsim.spec.rulesets import get_ruleset  # noqa: E402
from cgsim.spec.sglang_options import SglangOptions  # noqa: E402
from cgsim.targets import get_target  # noqa: E402
from cgsim.targets.base import TargetUnsupported  # noqa: E402
from cgsim.targets.sglang import SglangTarget, compat  # noqa: E402
from cgsim.trace import EngineAlignment, Trace  # noqa: E402
from cgsim.workload import Workload  # noqa: E402

pytestmark = pytest.mark.sglang
TREE = compat.probe()
DESIGN = rules.design_of(TREE.ruleset)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


def sgl(**options) -> tuple[SglangOptions]:
    """A config's engine options holding these SGLang options."""
    return (SglangOptions(**options),)


def _built(config: ManagerConfig):
    """The target's handle for ``config`` (None where sglang refuses it): what
    it read off sglang, before any capture."""
    target = get_target("sglang")
    target.prepare_environment()
    backend = get_backend("mock")
    with backend.activate(), torch.inference_mode():
        workload = Workload(config, backend, Trace("sglang", "mock"), 0, 0, 0)
        try:
            return target.build(config, get_ruleset(TREE.ruleset), backend, workload)
        except TargetUnsupported:
            return None


def drift(config: ManagerConfig, recorded: EngineAlignment, draft: bool = False) -> list[str]:
    """Where cgsim's copy of the rule says otherwise than sglang answered for ``config``."""
    want_prefill = None if draft or not DESIGN.aligned_prefill_tokens else rules.alignment(config)
    out = []
    if recorded.decode != rules.alignment(config):
        out.append(f"decode: sglang {recorded.decode}, cgsim's copy {rules.alignment(config)}")
    if recorded.prefill != want_prefill:
        out.append(f"prefill: sglang {recorded.prefill}, cgsim's copy {want_prefill}")
    if recorded.helper != rules.ALIGNMENT_HELPER:
        out.append(f"helper: sglang's is {recorded.helper}, cgsim's copy names {rules.ALIGNMENT_HELPER}")
    return out


def _check(config: ManagerConfig) -> None:
    handle = _built(config)
    if handle is None:
        return
    assert drift(config, handle.engine_alignment) == [], config
    for sub in handle.drafts:
        assert drift(sub.config, sub.engine_alignment, draft=True) == [], (config, sub.name)


# -- the helper over the parallel states it reads ----------------------------------------------


def test_the_helper_is_cgsims_copy_over_two_batch_overlap_attention_tp_and_cp():
    from cgsim.targets.sglang import _world
    from cgsim.targets.sglang.alignment import alignment_helper

    get_target("sglang").prepare_environment()
    helper, bad, n = alignment_helper(), [], 0
    for tbo in (False, True):
        override, _ = _world.install_server_args(dict(enable_two_batch_overlap=tbo))
        try:
            for tp in (1, 2, 4):
                for cp in (1, 2, 3):
                    width = tp * cp  # one attention-DP rank: tp == attn_tp x attn_cp (sglang validates it)
                    state = dict(attn_tp_size=tp, attn_cp_size=cp, attn_dp_size=1, tp_size=width, moe_tp_size=width,
                                 moe_ep_size=1, moe_dp_size=1, tp_rank=0, attn_tp_rank=0, attn_cp_rank=0,
                                 attn_dp_rank=0, tp_group=_world._TpGroup(0, width))
                    for gathered in (False, True):
                        with _world.parallel_override(state):
                            got = helper(gathered_buffer_required=gathered)
                        want = rules.batch_size_alignment(tbo, gathered, tp, cp)
                        n += 1
                        if got != want:
                            bad.append(f"tbo={tbo} attn_tp={tp} attn_cp={cp} gathered={gathered}: sglang {got}, "
                                       f"cgsim {want}")
        finally:
            override.restore()
    assert n == 36 and bad == []


# -- every launch: what the handle records is what the copy says --------------------------------


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(SglangTarget().drawing.config_strategy(64))
def test_the_recorded_alignment_is_cgsims_copy_over_drawn_configs(config):
    _check(config)


@pytest.mark.parametrize("kw", [
    dict(num_ubatches=2, capture_sizes=(1, 2, 3, 4, 8), max_num_reqs=7),
    dict(num_ubatches=2, capture_sizes=(2, 3), max_num_reqs=3, decode_query_len=2),
    dict(num_ubatches=2, mode="FULL", capture_sizes=(3, 5), max_num_reqs=5, engine_options=sgl(disable_padding=True)),
    dict(engine_options=sgl(dp_size=3), capture_sizes=(1, 2, 4), max_num_reqs=4),
    dict(decode_query_len=3, capture_sizes=(1, 2, 3), max_num_reqs=3),
])
def test_the_recorded_alignment_is_cgsims_copy_where_the_strategy_does_not_draw(kw):
    # Two-batch overlap (manager level: sglang's start-up check refuses the launches), DP, EAGLE's drafts.
    kw.setdefault("mode", "FULL_DECODE_ONLY")
    _check(ManagerConfig(**kw))


def test_every_trace_and_sub_trace_carries_sglangs_answer():
    from cgsim.runner import run_scenario
    from cgsim.scenario import Scenario, Step

    def captured(**kw):
        config = ManagerConfig(mode="FULL", capture_sizes=(1, 2, 4), max_num_reqs=4, **kw)
        return run_scenario(Scenario(config, (Step.capture(),), ruleset=TREE.ruleset), "sglang", timeout=300)

    trace = captured(num_ubatches=2)
    assert trace.alignment == EngineAlignment(2, 2 if DESIGN.aligned_prefill_tokens else None, rules.ALIGNMENT_HELPER)
    assert trace.to_json()["alignment"]["decode"] == 2
    # EAGLE's draft runners (driven without two-batch overlap): their sub-traces carry their own answer.
    trace = captured(decode_query_len=3)
    assert sorted(trace.managers) == [rules.DRAFT_DECODE, rules.DRAFT_EXTEND]
    for name, sub in trace.managers.items():
        assert sub.alignment == EngineAlignment(1, None, rules.ALIGNMENT_HELPER), name


# -- a drifting tree, and a runner that leaves its helper ---------------------------------------

_RUN = """
import json, sys
from cgsim.config import ManagerConfig
from cgsim.properties import check_scenario
from cgsim.runner import run_scenario
from cgsim.scenario import Scenario, Step
from cgsim.spec import sglang as rules
from cgsim.targets import get_target
from cgsim.targets.sglang.compat import probe

get_target("sglang").prepare_environment()
config = ManagerConfig.from_json(json.loads(sys.argv[1]))
scenario = Scenario(config, (Step.capture(),), ruleset=probe().ruleset)
trace = run_scenario(scenario, "sglang", timeout=300)
verdict = check_scenario(scenario, trace)
print(json.dumps({"alignment": trace.to_json()["alignment"], "copy": rules.alignment(config),
                  "violations": [[v.property, v.message] for v in verdict.violations]}))
"""

TBO = {"mode": "FULL_DECODE_ONLY", "capture_sizes": [1, 2, 3, 4, 8], "max_num_reqs": 7, "num_ubatches": 2}


def _under(mutation, config: dict) -> dict:
    from cgsim.targets.sglang.mutation import MUTATIONS_ENV

    env = dict(os.environ, PYTHONPATH=REPO, **{MUTATIONS_ENV: json.dumps([mutation])})
    res = subprocess.run([sys.executable, "-W", "ignore", "-c", _RUN, json.dumps(config)], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_tree_whose_helper_drifts_is_judged_by_its_own_answer_and_fails_the_comparison():
    # sglang aligning two-batch overlap to 4: its runners follow their helper
    # (bs 4 and 8 of 1, 2, 3, 4, 8; the pool 7 rounded to 8), the properties
    # judge them by that answer (no finding), and the comparison above fails.
    drifted = {"module": "sglang.srt.utils.common", "old": "        alignment *= 2", "new": "        alignment *= 4"}
    out = _under(drifted, TBO)
    assert out["violations"] == [], out["violations"]
    recorded = EngineAlignment(**out["alignment"])
    assert (recorded.decode, out["copy"]) == (4, 2)
    assert drift(ManagerConfig.from_json(TBO), recorded)[0] == "decode: sglang 4, cgsim's copy 2"


def test_a_runner_keeping_sizes_its_helper_rules_out_fails_capture_aligned():
    # unaligned-bs-kept: get_batch_sizes_to_capture filters by 1, not by the helper's answer (2).
    out = _under("unaligned-bs-kept", TBO)
    msgs = [m for p, m in out["violations"] if p == "SGL-CAPTURE-ALIGNED"]
    assert out["alignment"]["decode"] == 2
    assert any("bs 3 x 1 = 3 is not a multiple of the alignment 2 (sglang's get_cuda_graph_batch_size_alignment)"
               in m for m in msgs), out["violations"]
