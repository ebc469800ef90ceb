"""The capture protocol as an expected sequence of steps (SPEC §2)."""

from __future__ import annotations

from dataclasses import dataclass

from cgsim.config import ManagerConfig
from cgsim.descriptors import BatchDescriptor
from cgsim.modes import CUDAGraphMode
from cgsim.spec.candidates import expected_capture_order, resolved_mode
from cgsim.spec.rulesets import Ruleset, get_ruleset

__all__ = ["PlanStep", "expected_capture_plan", "skip_attn_for", "uses_breakable"]

CREATE, FORWARD, STORED = "create_forward_fn", "forward", "graph_stored"


@dataclass(frozen=True)
class PlanStep:
    action: str  # "create_forward_fn" | "forward" | "graph_stored"
    desc: BatchDescriptor
    warmup: bool | None = None  # create_forward_fn only
    mode: CUDAGraphMode | None = None  # forward only
    in_graph: bool = False  # forward inside a FULL graph capture
    skip_attn: bool | None = None  # forward only: attention metadata is None

    def short(self) -> str:
        if self.action == CREATE:
            return f"create_forward_fn({self.desc.short()}, warmup={self.warmup})"
        if self.action == FORWARD:
            where = " [in graph]" if self.in_graph else ""
            attn = " attn=skipped" if self.skip_attn else ""
            return f"forward({self.mode.value}){where}{attn} for {self.desc.short()}"
        return f"graph stored for {self.desc.short()}"


def uses_breakable(config: ManagerConfig) -> bool:
    """Breakable graphs are used only when the resolved mode has piecewise parts."""
    return config.breakable and resolved_mode(config).has_piecewise()


def skip_attn_for(desc: BatchDescriptor, config: ManagerConfig, ruleset: "Ruleset | str", warmup: bool = False) -> bool:
    rs = get_ruleset(ruleset)
    return rs.skip_attn(desc.cg_mode == CUDAGraphMode.PIECEWISE, uses_breakable(rs.effective_config(config)), warmup)


def expected_capture_plan(config: ManagerConfig, ruleset: "Ruleset | str") -> tuple[PlanStep, ...]:
    rs = get_ruleset(ruleset)
    config = rs.effective_config(config)
    breakable = uses_breakable(config)
    steps: list[PlanStep] = []
    for desc in expected_capture_order(config, rs):
        skip = skip_attn_for(desc, config, rs)
        steps.append(PlanStep(CREATE, desc, warmup=True))
        steps.append(PlanStep(FORWARD, desc, mode=CUDAGraphMode.NONE, skip_attn=skip_attn_for(desc, config, rs, True)))
        if desc.cg_mode == CUDAGraphMode.PIECEWISE and not breakable:
            # Same inputs as the warmup; attention runs eagerly between pieces.
            steps.append(PlanStep(FORWARD, desc, mode=CUDAGraphMode.PIECEWISE, skip_attn=skip))
            continue
        # Fresh attention state: backends mutate or lazily build metadata in warmup.
        steps.append(PlanStep(CREATE, desc, warmup=False))
        if desc.cg_mode == CUDAGraphMode.PIECEWISE:
            steps.append(PlanStep(FORWARD, desc, mode=CUDAGraphMode.PIECEWISE, skip_attn=skip))
            continue
        steps.append(PlanStep(FORWARD, desc, mode=CUDAGraphMode.NONE, in_graph=True, skip_attn=skip))
        steps.append(PlanStep(STORED, desc))
    return tuple(steps)
