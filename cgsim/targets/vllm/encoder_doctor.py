"""The encoder half of ``python -m fuzz doctor``: whether the adapter drives
this tree's ``EncoderCudaGraphManager`` as it must (cgsim.targets.vllm.encoder).

It proves the adapter's mechanics, not vLLM's correctness: each clean
scenario (images, videos, data-parallel ranks, a clear and a recapture) must
be reached through vLLM's front door, planned, captured, encoded and cleared
with every step recorded in the trace, and each ``ENCODER_PATCHES`` row must
apply where the tree has what it patches.  A mechanism that broke is a
failed check (exit 2).  A property a clean scenario violates that no
documented defect (``encoder_known``) explains is a finding about the tree:
the check passes and carries it, and the doctor exits 1 with it.  A tree
without the manager, or whose manager speaks a model interface older than
cgsim's toy, is said in one passing check, since the decode checks still
apply there.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from cgsim.encoder.values import EncoderConfig, EncoderItem, EncoderScenario, EncoderStep
from cgsim.finding import Finding
from cgsim.text import first_line

__all__ = ["encoder_checks", "ENCODER_CLEAN_SCENARIOS"]

_IMAGES = (EncoderItem(1, 4, 4), EncoderItem(1, 8, 4), EncoderItem(1, 2, 2))
_VIDEOS = (EncoderItem(2, 4, 4, True), EncoderItem(1, 2, 4, True))

# (name, config, steps): each a capability every release with the manager has, run on the mock.
ENCODER_CLEAN_SCENARIOS: tuple[tuple[str, EncoderConfig, tuple[EncoderStep, ...]], ...] = (
    ("encoder: images, clear and recapture",
     EncoderConfig(min_budget=16, max_num_batched_tokens=128, video=False),
     (EncoderStep("capture"), EncoderStep("encode", _IMAGES), EncoderStep("clear"), EncoderStep("capture"),
      EncoderStep("encode", _IMAGES[:1]))),
    ("encoder: videos",
     EncoderConfig(min_budget=16, max_num_batched_tokens=128, max_frames_per_video=2, video=True),
     (EncoderStep("capture"), EncoderStep("encode", _VIDEOS), EncoderStep("encode", _IMAGES))),
    ("encoder: data-parallel ranks",
     EncoderConfig(min_budget=16, max_num_batched_tokens=128, video=False, tp_size=2, dp_encoder=True),
     (EncoderStep("capture"), EncoderStep("encode", _IMAGES))),
)


def encoder_checks(check_type: type, guard: Callable[[str, Callable[[], Any]], Any]) -> list:
    """The encoder checks for the vLLM that imports here (``check_type``:
    doctor.Check; ``guard``: doctor.guard_check, which turns a check that raised
    into a failed check)."""
    from cgsim.targets.vllm.encoder import missing_model_interface  # noqa: PLC0415

    try:
        importlib.import_module("vllm.v1.worker.encoder_cudagraph")
    except ImportError:
        return [check_type("encoder", True, "no encoder CUDA-graph manager in this vLLM: nothing to drive")]
    missing = missing_model_interface()
    if missing:
        return [check_type("encoder", True, f"not driven: its manager asks an older model interface ({missing})")]
    checks = [guard("encoder: patches", lambda: _check_patches(check_type))]
    for name, config, steps in ENCODER_CLEAN_SCENARIOS:
        checks.append(guard(name, lambda name=name, config=config, steps=steps: _check_clean(check_type, name,
                                                                                            config, steps)))
    return checks


def _check_patches(check_type: type) -> Any:
    """Each ENCODER_PATCHES row applies where the tree has what it patches, and is restored after."""
    from cgsim.backends import get_backend  # noqa: PLC0415
    from cgsim.targets.vllm.compat import encoder_capture_stream  # noqa: PLC0415
    from cgsim.targets.vllm.encoder import ENCODER_PATCHES, encoder_patches  # noqa: PLC0415

    mod = importlib.import_module("vllm.v1.worker.encoder_cudagraph")
    backend = get_backend("mock")
    passes_stream = encoder_capture_stream()
    before = getattr(mod, "current_stream", None)
    with backend.activate(), encoder_patches(backend):
        during = getattr(mod, "current_stream", None)
        if passes_stream and (during is before or during() is not backend.cuda.current_stream()):
            return check_type("encoder: patches", False, "encoder-capture-stream did not make the manager's "
                                                         "current_stream the backend's")
    if getattr(mod, "current_stream", None) is not before:
        return check_type("encoder: patches", False, "encoder-capture-stream was not restored after the block")
    rows = ", ".join(p.name if passes_stream or p.name != "encoder-capture-stream" else f"{p.name} (not needed: "
                     "this manager passes no stream)" for p in ENCODER_PATCHES)
    return check_type("encoder: patches", True, f"applied: {rows}")


def _check_clean(check_type: type, name: str, config: EncoderConfig, steps: tuple[EncoderStep, ...]) -> Any:
    from cgsim.backends import get_backend  # noqa: PLC0415
    from cgsim.encoder.observe import observe_encoder  # noqa: PLC0415
    from cgsim.targets.base import ENCODER_HOOKS  # noqa: PLC0415
    from cgsim.targets.vllm.encoder import VllmEncoderTarget  # noqa: PLC0415

    # Built as the encoder registry builds it (cgsim.encoder.targets, which imports this adapter, not the reverse).
    target = VllmEncoderTarget()
    ENCODER_HOOKS.check(target)
    scenario = EncoderScenario(config, steps, target.default_ruleset())
    obs = observe_encoder(target, scenario, get_backend("mock"))
    if obs.refused is not None:
        return check_type(name, False, f"vLLM refused the plainest settings: {first_line(obs.refused, 200)}")
    broken = _incomplete(obs.scenario, obs.trace)
    if broken:
        return check_type(name, False, broken)
    found, known = [], set()
    for v in obs.verdict.violations:
        defect = target.encoder.classify(obs.scenario, obs.trace, v).get("known_defect")
        if defect:
            known.add(defect)
            continue
        f = Finding.from_violation(v, obs.scenario.to_json(), target.name, "mock", obs.scenario.short())
        found.append(f.with_(extra={"launch": obs.launch}))
    if found:
        return check_type(name, True, f"{found[0].property}: {found[0].message} (no documented encoder defect)",
                          tuple(found))
    return check_type(name, True, "clean" if not known else "only documented defects: " + ", ".join(sorted(known)))


def _incomplete(scenario: EncoderScenario, trace: Any) -> str | None:
    """Which step the adapter ran without recording what it must, or None."""
    from cgsim.encoder.trace import EncCapture, EncClear, EncError, EncGroup, EncOutput  # noqa: PLC0415

    if trace.plan is None:
        return "the trace has no plan: the adapter built a manager it did not read"
    errors = [e.step for e in trace.of(EncError)]
    stop = min(errors) if errors else len(scenario.steps)
    needs = {"capture": (EncCapture,), "encode": (EncGroup, EncOutput), "clear": (EncClear,)}
    for i, step in enumerate(scenario.steps[:stop]):
        for kind in needs[step.kind]:
            if not any(getattr(e, "step", None) == i for e in trace.of(kind)):
                return (f"the trace has no {kind.__name__} event for step {i} ({step.kind}): the adapter ran a step "
                        "it did not record")
    return None
