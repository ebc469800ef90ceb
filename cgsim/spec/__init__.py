"""The executable spec of a CUDA-graph manager, parametrised by ruleset (SPEC §2-§3).

What candidate init must produce, the capture plan it must follow and the
dispatch decision it must make, written from the rules rather than from any
manager's code so that it can disagree with one.
"""

from cgsim.spec.candidates import (
    decode_query_lens,
    desc_sort_key,
    expected_candidate_tiers,
    expected_capture_descs,
    expected_capture_order,
    resolved_mode,
)
from cgsim.spec.dispatch import dispatch_choices, eager_descriptor, expected_dispatch, padding_key
from cgsim.spec.plan import PlanStep, expected_capture_plan, skip_attn_for, uses_breakable
from cgsim.spec.rulesets import DEFAULT_RULESET, RULESETS, Ruleset, UnknownRuleset, get_ruleset

__all__ = [
    "DEFAULT_RULESET",
    "RULESETS",
    "Ruleset",
    "UnknownRuleset",
    "get_ruleset",
    "resolved_mode",
    "decode_query_lens",
    "desc_sort_key",
    "expected_capture_descs",
    "expected_capture_order",
    "expected_candidate_tiers",
    "PlanStep",
    "expected_capture_plan",
    "skip_attn_for",
    "uses_breakable",
    "dispatch_choices",
    "expected_dispatch",
    "eager_descriptor",
    "padding_key",
]
