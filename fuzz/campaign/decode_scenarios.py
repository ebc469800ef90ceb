"""The decode family's scenarios as a campaign draws them
(``default_strategy``), and the configs its target refused while they were
drawn (``NOT_REACHABLE``, counted with each worker's coverage)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from cgsim.text import reason_class

__all__ = ["default_strategy", "NOT_REACHABLE"]


def default_strategy(ruleset: str | None, target: str | None = None) -> Any:
    """Scenarios for a campaign against ``target`` (through its ``drawing``
    hooks): tiny configs, and configs as the target's engine runs them (its
    own default capture sizes), of those the target can be given at all
    (its ``unsupported_reason``); where it has a ``serve`` hook, some with
    the batches its engine's own scheduler schedules; where it has a
    ``config_strategy``, configs as its engine runs them drawn from it."""
    from fuzz.strategies import scenarios

    engine_sizes = refusal = engine = serve = own_configs = settings = None
    if target is not None:
        from cgsim.targets import get_target

        drawing = get_target(target).drawing
        engine_sizes = drawing.engine_capture_sizes
        refusal = _counted_refusal(drawing.unsupported_reason)
        engine = _counted(drawing.engine_config)
        settings = _counted(drawing.engine_settings)
        serve = drawing.serve
        own_configs = drawing.config_strategy
    return scenarios(ruleset=ruleset, engine_sizes=engine_sizes, refusal=refusal, engine=engine, serve=serve,
                     config_strategy=own_configs, settings=settings)


# Configs the target refused while the strategy drew them (engine settings it
# will not start with or sends to another runner, or that it cannot be given
# at all: its unsupported_reason), by reason: counted with the worker's
# coverage ("not_reachable"), never judged.
NOT_REACHABLE: Counter = Counter()


def _counted(engine_config: Callable | None) -> Callable | None:
    if engine_config is None:
        return None

    def built(config: Any) -> Any:
        from cgsim.targets.base import TargetUnsupported

        try:
            return engine_config(config)
        except TargetUnsupported as exc:
            NOT_REACHABLE[reason_class(str(exc))] += 1
            return None

    return built


def _counted_refusal(unsupported_reason: Callable | None) -> Callable | None:
    if unsupported_reason is None:
        return None

    def reason(config: Any) -> Any:
        why = unsupported_reason(config)
        if why is not None:
            NOT_REACHABLE[reason_class(str(why))] += 1
        return why

    return reason
