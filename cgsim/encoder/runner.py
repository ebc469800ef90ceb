"""Drives an encoder handle through a scenario and records the trace."""

from __future__ import annotations

import contextlib
import gc
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Protocol

import torch

from cgsim.encoder.trace import EncCapture, EncClear, EncError, EncGroup, EncOutput, EncoderTrace, PlanRead
from cgsim.encoder.values import EncoderScenario

__all__ = ["EncoderHandle", "CallSite", "ASKS_CAPTURED", "BUILT_AT_CAPTURE", "manager_captured", "ManagedEncoder",
           "run_encoder_scenario", "groups_from_log", "step_seed", "gc_held"]

# Real items' rows are compared with a tolerance a GPU's reordered sums stay within; a leak moves them by far more.
_ATOL = 1e-4


class EncoderHandle(Protocol):
    model: Any  # the toy encoder

    def plan(self) -> PlanRead: ...
    def capture(self) -> None: ...
    def encode(self, mm_kwargs: dict) -> list[torch.Tensor]: ...
    def clear(self) -> None: ...
    def is_captured(self) -> bool: ...


@contextlib.contextmanager
def gc_held() -> Iterator[None]:
    """No automatic GC cycle while a runner captures, as the engines' runners
    hold it (vLLM's freeze_gc_for_cudagraph_capture): collecting a graph an
    earlier scenario left as garbage frees it while the stream captures and
    invalidates the capture (seen on an H200; the mock does the same)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True)
class CallSite:
    """How the engine's runner holds its manager and when it hands it a batch.

    ``held_from_capture``: the runner builds the manager when it captures and
    drops it at a clear, so before the first capture (and after a clear) it
    has none and encodes eagerly; a later capture builds a fresh one.
    Otherwise the manager lives as long as the runner.  ``asks_captured``:
    a batch goes to the manager only while ``is_captured()``.
    ``asks_modality``: only if ``supports_modality(modality)``."""

    name: str
    held_from_capture: bool = False
    asks_captured: bool = True
    asks_modality: bool = False

    def hands_batch(self, held: bool, manager: Any, model: Any, mm_kwargs: dict) -> bool:
        """Whether the runner hands this batch to ``manager`` (else it runs the model eagerly)."""
        return (held and (not self.asks_captured or manager_captured(manager))
                and (not self.asks_modality or manager.supports_modality(model.get_input_modality(mm_kwargs))))


# vLLM's V2 EncoderRunner (v1/worker/gpu/mm/encoder_runner.py execute_mm_encoder) and cgsim's reference.
ASKS_CAPTURED = CallSite("asks-captured")
# vLLM's V1 GPUModelRunner (v1/worker/gpu_model_runner.py): built in capture_model by
# _maybe_init_encoder_cudagraph_manager, asked supports_modality in _execute_mm_encoder; a captured
# manager is dropped, never reused, once cleared (profile_cudagraph_memory's, shutdown).
BUILT_AT_CAPTURE = CallSite("built-at-capture", held_from_capture=True, asks_captured=False, asks_modality=True)


def manager_captured(manager: Any) -> bool:
    """``is_captured()``, or for a manager without one (vLLM before 0.28) whether it holds a graph pool."""
    ask = getattr(manager, "is_captured", None)
    return bool(ask()) if ask is not None else getattr(manager, "graph_pool", None) is not None


@dataclass
class ManagedEncoder:
    """A manager with vLLM's face, its toy model and backend, called the way
    the engine's encoder runner calls it (``call_site``); a None result runs
    the batch eagerly through the model.  ``rebuild`` makes a fresh manager
    where the call site builds one at each capture after a clear."""

    manager: Any
    model: Any
    backend: Any
    call_site: CallSite = ASKS_CAPTURED
    # What the engine's runner sets around the manager (vLLM: its capture stream), entered inside the backend.
    engine_context: Callable[[], ContextManager] = contextlib.nullcontext
    capture_context: Callable[[], ContextManager] = contextlib.nullcontext
    rebuild: Callable[[], Any] | None = None
    held: bool = field(init=False)
    cleared: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.held = not self.call_site.held_from_capture

    def plan(self) -> PlanRead:
        m = self.manager
        return PlanRead(tuple(m.token_budgets), int(m.max_batch_size), int(m.max_frames_per_batch))

    def capture(self) -> None:
        if self.cleared and self.call_site.held_from_capture and self.rebuild is not None:
            with self.backend.activate():
                self.manager = self.rebuild()
            self.cleared = False
        self.held = True
        with self.backend.activate(), self.engine_context(), self.capture_context():
            self.manager.capture(graph_pool=self.backend.cuda.graph_pool_handle())

    def encode(self, mm_kwargs: dict) -> list[torch.Tensor]:
        with self.backend.activate(), self.engine_context():
            out = None
            if self.call_site.hands_batch(self.held, self.manager, self.model, mm_kwargs):
                out = self.manager.execute(mm_kwargs)
            if out is None:
                out = self.model.embed_multimodal(**mm_kwargs)
            return list(out)

    def clear(self) -> None:
        with self.backend.activate():
            self.manager.clear()
        self.cleared = True
        if self.call_site.held_from_capture:
            self.held = False

    def is_captured(self) -> bool:
        return self.held and manager_captured(self.manager)


def step_seed(scenario_seed: int, step: int) -> int:
    """The seed of an encode step's inputs (the toy's ``inputs``): exported tests draw the same."""
    return scenario_seed * 1009 + step


def groups_from_log(step: int, log: list[tuple], items: Any) -> list[EncGroup]:
    """The groups the toy saw: each output it post-processed, replayed if a
    replay for those items came last, else eager; a manager's eager forward
    whose output the toy never post-processed (vLLM before 0.27 scatters it
    with its own scatter_output_slices), with the items' tokens as its rows;
    and batches the call site ran eagerly (``embed_multimodal``)."""
    groups: list[EncGroup | None] = []
    last: dict[tuple[int, ...], str] = {}
    unposted: dict[tuple[int, ...], tuple[int, int]] = {}  # eager forwards awaiting an output: (slot, rank)
    rank = 0
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
                if kind == "eager":
                    unposted[ids] = (len(groups), rank)
                    groups.append(None)
        elif kind == "output":
            ids, rows = entry[1], entry[2]
            replayed = last.pop(ids, "eager") == "replay"
            group = _group(step, ids, items, rows if replayed else None, rows, "manager", rank)
            slot = unposted.pop(ids, None)
            if slot is not None and not replayed:
                groups[slot[0]] = group
            else:
                groups.append(group)
    for ids, (slot, at_rank) in unposted.items():
        groups[slot] = _group(step, ids, items, None, sum(items[i].output_tokens for i in ids), "manager", at_rank)
    return [g for g in groups if g is not None]


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
                kw = model.inputs(step.items, seed=step_seed(scenario.seed, step_no))
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
