"""The documented defects of vLLM's EncoderCudaGraphManager (docs/encoder.md,
"What cgsim finds in vLLM"): which one a violation is, read off the scenario
and its trace.  A violation none of them explains is unlabelled: new."""

from __future__ import annotations

import os
from dataclasses import dataclass

from cgsim.encoder.trace import EncError, EncGroup, EncoderTrace
from cgsim.encoder.values import EncoderScenario
from cgsim.properties.registry import Violation
from cgsim.spec.encoder import design, plan

__all__ = ["EncoderDefect", "ENCODER_DEFECTS", "encoder_defect"]


@dataclass(frozen=True)
class EncoderDefect:
    id: str
    properties: tuple[str, ...]
    releases: str
    summary: str


ENCODER_DEFECTS = {d.id: d for d in (
    EncoderDefect("vllm-enc-1", ("ENC-CAPTURE-ONCE",), "0.32-0.34",
                  "a budget repeated in encoder_cudagraph_token_budgets is captured once per repetition"),
    EncoderDefect("vllm-enc-2", ("ENC-FIT", "ENC-EQUAL", "ENC-NO-CRASH"), "0.32-0.34",
                  "a batch with more frames than encoder_cudagraph_max_frames_per_batch is replayed on a graph "
                  "captured for fewer frames"),
)}

_TOY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "encoder", "toy.py")


def _frames_overflow(scenario: EncoderScenario, trace: EncoderTrace) -> bool:
    """A replay of more frames than its graph holds: a group the trace shows, or
    the model's padding logic handed more frames than the buffer (the replay raised there)."""
    p, d = plan(scenario.config, scenario.ruleset), design(scenario.ruleset)
    for g in trace.of(EncGroup):
        if g.budget is not None and g.frames > p.frame_slots(g.budget, d) and len(g.ids) <= p.max_batch_size:
            return True
    return any(e.phase == "encode" and e.where.startswith(_TOY + ":") and "must match the size" in e.message
               for e in trace.of(EncError)) and scenario.config.max_frames_per_batch is not None


def encoder_defect(scenario: EncoderScenario, trace: EncoderTrace, v: Violation) -> str | None:
    """The documented defect ``v`` is an instance of (None: none explains it)."""
    c = scenario.config
    if v.property == "ENC-CAPTURE-ONCE" and len(set(c.token_budgets)) < len(c.token_budgets):
        return "vllm-enc-1"
    if v.property in ENCODER_DEFECTS["vllm-enc-2"].properties and c.max_frames_per_batch is not None \
            and _frames_overflow(scenario, trace):
        return "vllm-enc-2"
    return None
