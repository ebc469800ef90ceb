"""What an encoder scenario did on a target, in order: plain frozen records
the encoder properties judge (``cgsim.properties.encoder``).

Who records what: the runner (``cgsim.encoder.runner``) records the plan the
manager states, each step's outcome and every output compared with the item
encoded alone; the toy encoder (``cgsim.encoder.toy``) tells the runner what
the manager asked of it (which budgets it captured, which items it grouped,
whether a group replayed or ran eagerly and how many rows its output had),
so a manager cannot misreport what it did.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PlanRead", "EncCapture", "EncGroup", "EncOutput", "EncClear", "EncError", "EncoderTrace"]


@dataclass(frozen=True)
class PlanRead:
    """What the manager says it will capture (its own attributes)."""

    budgets: tuple[int, ...]
    max_batch_size: int
    max_frames_per_batch: int


@dataclass(frozen=True)
class EncCapture:
    step: int
    budgets: tuple[int, ...]  # capture inputs the manager asked for, in order
    captured: bool  # is_captured() afterwards
    rank: int = 0  # data-parallel encoders: each rank's manager captures its own graphs


@dataclass(frozen=True)
class EncGroup:
    """Items the manager encoded together; ``budget`` None: eagerly
    (``site``: "manager", or "runner" where the engine's call site ran the
    batch eagerly without asking the manager)."""

    step: int
    ids: tuple[int, ...]
    tokens: int
    frames: int
    budget: int | None
    rows: int
    site: str = "manager"
    rank: int = 0  # data-parallel encoders: the rank whose manager encoded the group


@dataclass(frozen=True)
class EncOutput:
    """One item's output against the item encoded alone, eagerly: right
    after the step (``when`` "step") and at the end of the scenario ("end")."""

    step: int
    item: int
    when: str
    equal: bool
    detail: str = ""


@dataclass(frozen=True)
class EncClear:
    step: int
    captured: bool  # is_captured() afterwards


@dataclass(frozen=True)
class EncError:
    step: int
    phase: str
    type: str
    message: str
    where: str  # file:line of the raising frame


@dataclass(frozen=True)
class EncoderTrace:
    plan: PlanRead | None
    events: tuple
    refused: str | None = None  # the manager refused the config at construction: nothing to judge

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]
