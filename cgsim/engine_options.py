"""Engine options: the config fields only one engine reads, kept with it.

``cgsim.config.ManagerConfig`` holds what every family shares, and each
engine's own fields as one frozen value of the engine's options type in
``ManagerConfig.engine_options`` (``config.options(Type)`` reads it).  An
engine registers its type here with the keys its value occupies at the top
level of the config JSON (after the shared fields, left out while the config
holds no value of the type), so a config written before the fields moved
keeps its JSON, and with it every finding id.

Option formats are entry points of the group ``cgsim.engine_options`` (so a
package outside cgsim can add one with a line in its pyproject.toml);
cgsim's own are listed here in the same form and loaded on first use, so the
config imports no engine.  An entry point names an ``EngineOptionsFormat``:

    [project.entry-points."cgsim.engine_options"]
    myengine = "mypackage.cgsim_options:OPTIONS_FORMAT"
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable

from cgsim.text import first_line

__all__ = ["ENTRY_POINT_GROUP", "EngineOptionsFormat", "EngineOptionsRegistryError", "option_formats",
           "format_of_key", "format_of_type", "broken_entry_points"]

ENTRY_POINT_GROUP = "cgsim.engine_options"

# In this order their keys follow the shared fields in the JSON (the order the fields had in the config).
_BUILTIN = (
    EntryPoint("vllm", "cgsim.spec.vllm_options:OPTIONS_FORMAT", ENTRY_POINT_GROUP),
    EntryPoint("sglang", "cgsim.spec.sglang_options:OPTIONS_FORMAT", ENTRY_POINT_GROUP),
)


@dataclass(frozen=True)
class EngineOptionsFormat:
    """How one engine's options value sits in the config JSON.

    ``options_type``: the engine's frozen options dataclass; ``json_keys``:
    the top-level keys a value of it writes, in the order written;
    ``to_json(value)``: those keys with their JSON values (a key may be
    left out); ``from_json(present)``: the value from the keys a config's
    JSON gives (only those not null, at least one), or ConfigError naming
    the key (``sglang.dp_size``).
    """

    options_type: type
    json_keys: tuple[str, ...]
    to_json: Callable[[Any], dict[str, Any]]
    from_json: Callable[[dict[str, Any]], Any]


class EngineOptionsRegistryError(RuntimeError):
    """An option format that does not load, is no EngineOptionsFormat or claims a key or type another claims."""


_formats: tuple[EngineOptionsFormat, ...] | None = None
_broken: dict[str, str] = {}


def option_formats() -> tuple[EngineOptionsFormat, ...]:
    """cgsim's option formats, then every installed ``cgsim.engine_options`` entry point's, in JSON order."""
    global _formats
    if _formats is None:
        found: list[EngineOptionsFormat] = []
        installed = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.value not in {b.value for b in _BUILTIN}]
        for ep in list(_BUILTIN) + installed:
            problem = None
            try:
                fmt = ep.load()
            except Exception as exc:  # noqa: BLE001 - said in one line naming the entry point
                problem = f"does not load: {type(exc).__name__}: {first_line(exc)}"
            else:
                problem = _problem(fmt, found)
            if problem is None:
                found.append(fmt)
            elif ep in _BUILTIN:
                raise EngineOptionsRegistryError(f"engine options entry point {ep.name} = {ep.value!r} {problem}")
            else:  # an outside engine's broken format must not break every config: said where its key is read
                _broken[ep.name] = f"engine options entry point {ep.name} = {ep.value!r} {problem}"
        _formats = tuple(found)
    return _formats


def _problem(fmt: Any, found: list[EngineOptionsFormat]) -> str | None:
    if not isinstance(fmt, EngineOptionsFormat):
        return f"is a {type(fmt).__name__}, not a cgsim.engine_options.EngineOptionsFormat"
    if not fmt.json_keys:
        return "names no JSON key; give the top-level key(s) its value writes"
    for other in found:
        if other.options_type is fmt.options_type:
            return f"registers {fmt.options_type.__name__} again; register each options type once"
        shared = sorted(set(other.json_keys) & set(fmt.json_keys))
        if shared:
            return (f"claims the JSON key {shared[0]!r} of {other.options_type.__name__}; "
                    "give each engine keys of its own")
    return None


def format_of_key(key: str) -> EngineOptionsFormat | None:
    """The format whose value writes the top-level JSON key ``key`` (None: no engine's)."""
    return next((f for f in option_formats() if key in f.json_keys), None)


def format_of_type(options_type: type) -> EngineOptionsFormat | None:
    """The format registered for ``options_type`` (None: none is)."""
    return next((f for f in option_formats() if f.options_type is options_type), None)


def broken_entry_points() -> tuple[str, ...]:
    """One line per outside entry point that did not load (so a config key it would read is explained)."""
    option_formats()
    return tuple(_broken[name] for name in sorted(_broken))
