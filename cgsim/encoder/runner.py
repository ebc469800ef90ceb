"""Drives an encoder handle through a scenario and records the trace."""

from __future__ import annotations

import contextlib
import traceback
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Protocol

import torch

from cgsim.encoder.trace import EncCapture, EncClear, EncError, EncGroup, EncOutput, EncoderTrace, PlanRead
from cgsim.encoder.values import EncoderScenario

__all__ = ["EncoderHandle", "ManagedEncoder", "run_encoder_scenario", "groups_from_log"]

# Real items' rows are compared with a tolerance a GPU's reordered sums stay within; a leak moves them by far more.
_ATOL = 1e-4


class EncoderHandle(Protocol):
    model: Any  # the toy encoder

    def plan(self) -> PlanRead: ...
    def capture(self) -> None: ...
    def encode(self, mm_kwargs: dict) -> list[torch.Tensor]: ...
    def clear(self) -> None: ...
    def is_captured(self) -> bool: ...


@dataclass
class ManagedEncoder:
    """A manager with vLLM's face, its toy model and backend, called the way
    the engine's encoder runner calls it: ``guard_captured`` asks
    ``is_captured()`` before ``execute`` (vLLM 0.34's EncoderRunner; 0.32's
    model runner only asks whether a manager exists), and a None result runs
    the batch eagerly (both)."""

    manager: Any
    model: Any
    backend: Any
    guard_captured: bool = True
    # What the engine's runner sets around the manager (vLLM: its capture stream), entered inside the backend.
    engine_context: Callable[[], ContextManager] = contextlib.nullcontext
    capture_context: Callable[[], ContextManager] = contextlib.nullcontext

    def plan(self) -> PlanRead:
        m = self.manager
        return PlanRead(tuple(m.token_budgets), int(m.max_batch_size), int(m.max_frames_per_batch))

    def capture(self) -> None:
        with self.backend.activate(), self.engine_context(), self.capture_context():
            self.manager.capture(graph_pool=self.backend.cuda.graph_pool_handle())

    def encode(self, mm_kwargs: dict) -> list[torch.Tensor]:
        with self.backend.activate(), self.engine_context():
            out = None
            if not self.guard_captured or self.manager.is_captured():
                out = self.manager.execute(mm_kwargs)
            if out is None:
                out = self.model.embed_multimodal(**mm_kwargs)
            return list(out)

    def clear(self) -> None:
        with self.backend.activate():
            self.manager.clear()

    def is_captured(self) -> bool:
        return bool(self.manager.is_captured())


def groups_from_log(step: int, log: list[tuple], items: Any) -> list[EncGroup]:
    """The groups the toy saw: each output it post-processed, replayed if a
    replay for those items came last, else eager; and batches the call site
    ran eagerly (``embed_multimodal``)."""
    groups, last, rank = [], {}, 0
    for entry in log:
        kind = entry[0]
        if kind == "rank":
            rank = entry[1]
        elif kind in ("replay", "eager"):
            ids = entry[1]
            if kind == "eager" and entry[2] == "embed_multimodal":
                groups.append(_group(step, ids, items, None, sum(items[i].output_tokens for i in ids), "runner", rank))
            else:
                last[ids] = kind
        elif kind == "output":
            ids, rows = entry[1], entry[2]
            replayed = last.pop(ids, "eager") == "replay"
            groups.append(_group(step, ids, items, rows if replayed else None, rows, "manager", rank))
    return groups


def _captures_by_rank(log: list[tuple]) -> list[tuple[int, tuple[int, ...]]]:
    """The budgets each rank's manager asked capture inputs for (one rank unless the log names ranks)."""
    out: dict[int, list[int]] = {0: []}
    rank = 0
    for entry in log:
        if entry[0] == "rank":
            rank = entry[1]
            out.setdefault(rank, [])
        elif entry[0] == "capture_inputs":
            out[rank].append(entry[1])
    return [(r, tuple(b)) for r, b in sorted(out.items())]


def _group(step: int, ids: tuple[int, ...], items: Any, budget: int | None, rows: int, site: str,
           rank: int) -> EncGroup:
    return EncGroup(step, ids, sum(items[i].output_tokens for i in ids), sum(items[i].frames for i in ids),
                    budget, rows, site, rank)


def _first(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else ""


def _where(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    return f"{tb[-1].filename}:{tb[-1].lineno}" if tb else "?"


def _compare(out: Any, ref: torch.Tensor) -> tuple[bool, str]:
    if not isinstance(out, torch.Tensor):
        return False, f"got {type(out).__name__}, expected a tensor"
    if tuple(out.shape) != tuple(ref.shape):
        return False, f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    diff = (out.detach().float().cpu() - ref.float().cpu()).abs()
    worst = float(diff.max()) if diff.numel() else 0.0
    if worst != worst or worst > _ATOL:
        return False, f"max |diff| {worst:.3g} against the item encoded alone"
    return True, ""


def run_encoder_scenario(scenario: EncoderScenario, build: Callable[[], EncoderHandle],
                         outputs: dict | None = None) -> EncoderTrace:
    """Build the handle (a ValueError from the manager's constructor: refused,
    nothing judged) and run every step; an exception ends the run as an
    ``EncError``.  ``outputs``, where given, receives each item's output
    ((step, item) -> a CPU copy): what the agreement corpus compares across backends."""
    try:
        handle = build()
        plan = handle.plan()
    except ValueError as exc:
        return EncoderTrace(None, (), refused=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    except Exception as exc:  # noqa: BLE001 - a constructor that crashes is the manager's failure, judged
        return EncoderTrace(None, (EncError(0, "build", type(exc).__name__, _first(exc), _where(exc)),))
    events: list = []
    model = handle.model
    kept: list[tuple[int, int, Any, torch.Tensor]] = []
    for step_no, step in enumerate(scenario.steps):
        model.log.clear()
        try:
            if step.kind == "capture":
                handle.capture()
                events.extend(EncCapture(step_no, budgets, handle.is_captured(), rank)
                              for rank, budgets in _captures_by_rank(model.log))
            elif step.kind == "clear":
                handle.clear()
                events.append(EncClear(step_no, handle.is_captured()))
            else:
                kw = model.inputs(step.items, seed=scenario.seed * 1009 + step_no)
                ref = model.reference(kw)
                model.log.clear()
                outs = handle.encode(kw)
                events.extend(groups_from_log(step_no, model.log, step.items))
                for i, r in enumerate(ref):
                    out = outs[i] if i < len(outs) else None
                    equal, detail = _compare(out, r) if out is not None else (False, "no output for this item")
                    events.append(EncOutput(step_no, i, "step", equal, detail))
                    if out is not None:
                        kept.append((step_no, i, out, r))
                        if outputs is not None and isinstance(out, torch.Tensor):
                            outputs[(step_no, i)] = out.detach().float().cpu().clone()
                if len(outs) != len(ref):
                    events.append(EncOutput(step_no, len(ref), "step", False,
                                            f"{len(outs)} outputs for {len(ref)} items"))
        except Exception as exc:  # noqa: BLE001 - what the code under test raised is recorded, never lost
            if step.kind == "encode":
                events.extend(groups_from_log(step_no, model.log, step.items))
            events.append(EncError(step_no, step.kind, type(exc).__name__, _first(exc), _where(exc)))
            break
    for step_no, i, out, r in kept:
        equal, detail = _compare(out, r)
        events.append(EncOutput(step_no, i, "end", equal, detail))
    return EncoderTrace(plan, tuple(events))
