"""One encoder scenario on a target: reach it through the engine's front
door, run it, judge it.  What the engine refuses is counted, never judged;
an exception raised in cgsim's own frames (not the toy model's code the
manager drives, nor the mock's replay of it) is an adapter error."""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from typing import Any

from cgsim.encoder.runner import run_encoder_scenario
from cgsim.encoder.trace import EncError, EncoderTrace
from cgsim.encoder.values import EncoderScenario
from cgsim.properties.encoder import check_encoder_scenario
from cgsim.properties.registry import Verdict
from cgsim.targets.base import TargetEnvironmentError, TargetUnsupported

__all__ = ["EncoderObservation", "EncoderAdapterError", "observe_encoder"]

_CGSIM = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The model's code (its padding logics and forward) and the mock's replay of its recorded ops.
_MODEL_CODE = (os.path.join(_CGSIM, "encoder", "toy.py"), os.path.join(_CGSIM, "cuda_mock") + os.sep)


class EncoderAdapterError(TargetEnvironmentError):
    """cgsim's own code raised while driving an engine's manager: a cgsim bug, exit 2, never a finding."""


@dataclass(frozen=True)
class EncoderObservation:
    scenario: EncoderScenario  # as the engine built it (the drawn one where the target has no front door)
    launch: dict | None
    trace: EncoderTrace | None
    verdict: Verdict
    refused: str | None = None


def _in_cgsim(where: str) -> bool:
    path = os.path.abspath(where.rsplit(":", 1)[0])
    return path.startswith(_CGSIM + os.sep) and not any(path == m or path.startswith(m) for m in _MODEL_CODE)


def observe_encoder(target: Any, scenario: EncoderScenario, backend: Any) -> EncoderObservation:
    try:
        reached, launch = target.reach(scenario)
    except TargetUnsupported as exc:
        return EncoderObservation(scenario, None, None, Verdict((), ()), refused=str(exc))
    except TargetEnvironmentError:
        raise
    except Exception as exc:  # noqa: BLE001 - the engine's own config path says refused or environment; the rest is cgsim's
        where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        raise EncoderAdapterError(
            f"cgsim's encoder front door raised {type(exc).__name__} "
            f"at {f'{where.filename}:{where.lineno}' if where else '?'} reading vLLM's config: "
            f"{str(exc).splitlines()[0] if str(exc) else ''} (a cgsim bug; please report it with the scenario)"
        ) from None
    trace = run_encoder_scenario(reached, target.builder(reached, backend))
    if trace.refused is not None:
        return EncoderObservation(reached, launch, trace, Verdict((), ()), refused=trace.refused)
    if launch is not None:  # an engine's manager: cgsim's own frames are never the culprit
        for e in trace.of(EncError):
            if _in_cgsim(e.where):
                raise EncoderAdapterError(f"cgsim's encoder adapter raised {e.type} at {e.where} during {e.phase}: "
                                          f"{e.message} (a cgsim bug; please report it with the scenario)")
    return EncoderObservation(reached, launch, trace, check_encoder_scenario(reached, trace))
