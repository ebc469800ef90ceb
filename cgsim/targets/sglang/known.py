"""The real defects cgsim found in sglang's CUDA-graph runners (docs/sglang.md,
"What campaigns on clean sglang find"), each with the releases it is in and
a rule that recognises its failures.

A campaign labels each finding with the documented defect it is an instance
of, or leaves it unlabelled (a new defect to document with its cause, or a
cgsim bug to fix).  ``benchmarks/bench_sglang.py`` counts a mutant found only
by a failure no documented defect explains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from cgsim.config import ManagerConfig
from cgsim.spec import sglang as rules
from cgsim.targets.releases import in_range

__all__ = ["KnownDefect", "KNOWN_DEFECTS", "explains", "classify", "label"]


@dataclass(frozen=True)
class KnownDefect:
    row: int  # docs/sglang.md's numbering
    name: str
    title: str
    first: str  # the oldest release cgsim drives that has it (it may be older)
    fixed: str | None  # first release without it; None: not fixed
    properties: frozenset[str]
    matches: Callable[[Mapping[str, Any], ManagerConfig], bool]  # (the violation's facts, config)
    # Releases [first, until) where no launch sglang accepts reaches it: its
    # start-up check (ServerArgs.check_server_args) refuses every launch the
    # driver runs it with (docs/sglang.md, "Manager-level only"); until None:
    # every release from first.  Its findings are still labelled (a replay, a
    # hand-written scenario), campaigns no longer draw them.
    manager_level: tuple[tuple[str, str | None], ...] = ()
    blocked_by: str | None = None  # the sglang code that refuses its launches

    def present_in(self, version: str) -> bool:
        return in_range(version, self.first, self.fixed)

    def reachable_in(self, version: str) -> bool:
        """A launch sglang accepts shows it (as far as cgsim drives sglang)."""
        return self.present_in(version) and not any(in_range(version, lo, hi) for lo, hi in self.manager_level)


def _bcg_output(facts: Mapping[str, Any], config: ManagerConfig) -> bool:
    return "Unsupported BCG output type" in (facts.get("raised") or "") and rules.runner_backends(config)[0] == rules.BREAKABLE


def _nopad_tbo_odd_pool(facts: Mapping[str, Any], config: ManagerConfig) -> bool:
    opts = rules.options(config)
    return opts.disable_padding and config.num_ubatches == 2 and config.max_num_reqs % 2 == 1


KNOWN_DEFECTS: tuple[KnownDefect, ...] = (
    KnownDefect(1, "bcg-decode-logits-output",
                "a breakable decode runner cannot capture a model returning LogitsProcessorOutput "
                "(BreakableCudaGraphBackend's _alloc_full_buffer)", "0.5.20", None, frozenset({"NO-CRASH"}),
                _bcg_output),
    KnownDefect(2, "nopad-tbo-unreachable-graph",
                "with padding disabled and two-batch overlap, an odd --max-running-requests captures a bs no batch "
                "has (get_batch_sizes_to_capture rounds the pool up)", "0.5.20", None,
                frozenset({"SGL-CAPTURE-USEFUL"}), _nopad_tbo_odd_pool,
                manager_level=(("0.5.20", None),),
                blocked_by="arg_groups/validation_hook.py check_two_batch_overlap (from ServerArgs.check_server_args): "
                           "two-batch overlap needs attention DP or an all-to-all MoE backend, and the driver runs "
                           "neither with it"),
)


def explains(prop: str, facts: Mapping[str, Any], config: ManagerConfig, version: str) -> KnownDefect | None:
    """The documented defect of ``version`` a failure of ``prop`` is, if any
    (``facts``: the violation's structured record, ``Violation.record()``)."""
    for d in KNOWN_DEFECTS:
        if d.present_in(version) and prop in d.properties and d.matches(facts, config):
            return d
    return None


def classify(finding: Any, version: str) -> KnownDefect | None:
    try:
        config = ManagerConfig.from_json(finding.scenario["config"])
    except Exception:  # noqa: BLE001 - an unreadable scenario matches nothing
        return None
    return explains(finding.property, finding.facts, config, version)


def label(finding: Any, version: str) -> dict:
    """What a campaign writes into a finding's extra: the documented defect it
    is, or that it is none (a new defect, or a cgsim bug)."""
    d = classify(finding, version)
    if d is None:
        return {"known_defect": None}
    fixed = f", fixed in {d.fixed}" if d.fixed else ", not fixed"
    reach = "" if d.reachable_in(version) else "; manager-level only: no launch sglang accepts reaches it"
    return {"known_defect": d.name, "known_defect_doc": f"docs/sglang.md #{d.row}: {d.title} (sglang {d.first}"
                                                        f"{fixed}{reach})"}
