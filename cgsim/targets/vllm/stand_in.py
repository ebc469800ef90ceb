"""The stand-in's side of the differential check against vLLM's own runner:
what cgsim's handle (``handle.VllmManagerHandle``: vLLM's manager built by
cgsim's stand-in of the runner) captures for a config, listed as
``runner_build.RunnerGraphs`` lists the runner's
(tests/cgsim/targets/vllm/test_runner_build.py compares the two)."""

from __future__ import annotations

from typing import Any

from cgsim.targets.vllm.runner_build import ManagerGraphs, manager_graphs

__all__ = ["stand_in_graphs"]


def stand_in_graphs(config: Any) -> tuple[ManagerGraphs, ...]:
    """The graphs cgsim's handle (``handle.VllmManagerHandle``: vLLM's
    manager built by cgsim's stand-in of the runner) captures for ``config``
    (a ManagerConfig), listed as ``RunnerGraphs.managers`` lists the runner's:
    the differential check of the stand-in against the runner."""
    from cgsim.backends import get_backend  # noqa: PLC0415
    from cgsim.spec.rulesets import get_ruleset  # noqa: PLC0415
    from cgsim.targets.vllm.compat import require_vllm  # noqa: PLC0415
    from cgsim.targets.vllm.target import VllmTarget  # noqa: PLC0415
    from cgsim.trace import Trace  # noqa: PLC0415
    from cgsim.workload import Workload  # noqa: PLC0415

    ruleset = get_ruleset(require_vllm().ruleset)
    backend = get_backend("mock")
    trace = Trace("vllm", backend.name)
    with backend.activate():
        workload = Workload(config, backend, trace, max_batch_tokens=max(config.capture_sizes) * 2,
                            max_batch_reqs=config.max_num_reqs)
        handle = VllmTarget(warm=False).build(config, ruleset, backend, workload)
        workload.at(workload.step, "capture")
        handle.capture()
    out = [manager_graphs("main", handle.manager)]
    out += [manager_graphs(f"draft-{role}", m) for role, m in sorted(handle.draft_managers.items())]
    return tuple(out)
