"""One-line bugs put into an engine's own modules as they are imported: the
machinery the engines' mutation tables share (``targets.vllm.mutation``,
``targets.sglang.mutation``).

An environment variable (JSON: a list of {"module", "old", "new"}) names
lines of the engine's modules and what they become, and a ``sys.meta_path``
finder in front of the import system (and of a source tree laid over the
install) loads each named module from its own file with the line replaced.
The variable travels to every process of a job; tracebacks point at the
module's file, whose line numbers stay what they were.  A line that is not
in the module exactly once is a broken environment (the engine's
``MutationError``, exit 2), never a silent no-op.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import sys
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["Mutation", "environment_for", "install", "installed"]


@dataclass(frozen=True)
class Mutation:
    module: str
    old: str
    new: str
    name: str = ""
    area: str = ""  # what part of the engine's capture code it breaks
    bug: str = ""  # what goes wrong, in a line

    def to_json(self) -> dict:
        return {"module": self.module, "old": self.old, "new": self.new, "name": self.name}

    @classmethod
    def from_json(cls, data: dict) -> "Mutation":
        return cls(str(data["module"]), str(data["old"]), str(data["new"]), str(data.get("name", "")))


def environment_for(variable: str, mutations: Sequence[Mutation]) -> dict[str, str]:
    """The environment that puts ``mutations`` into a job's processes."""
    return {variable: json.dumps([m.to_json() for m in mutations])}


class _MutatedLoader(importlib.abc.Loader):
    def __init__(self, fullname: str, origin: str, edits: Sequence[Mutation], error: type[Exception]):
        self.fullname, self.origin, self.edits, self.error = fullname, origin, edits, error

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        with open(self.origin, encoding="utf-8") as fh:
            source = fh.read()
        for m in self.edits:
            count = source.count(m.old)
            if count != 1:
                raise self.error(f"mutation {m.name or m.old.strip()!r} does not apply to {self.fullname} "
                                 f"({self.origin}): its line occurs {count} times, not once")
            source = source.replace(m.old, m.new)
        exec(compile(source, self.origin, "exec"), module.__dict__)  # noqa: S102 - the tree's own code, one line changed


class _MutatingFinder(importlib.abc.MetaPathFinder):
    def __init__(self, variable: str, mutations: Sequence[Mutation], error: type[Exception]):
        self.variable, self.error = variable, error
        self.by_module: dict[str, list[Mutation]] = {}
        for m in mutations:
            self.by_module.setdefault(m.module, []).append(m)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        edits = self.by_module.get(fullname)
        if edits is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.origin and spec.origin.endswith(".py"):
                return importlib.util.spec_from_file_location(
                    fullname, spec.origin, loader=_MutatedLoader(fullname, spec.origin, edits, self.error),
                    submodule_search_locations=spec.submodule_search_locations)
        return None


def installed(variable: str) -> bool:
    """Whether this process already has the mutations ``variable`` names."""
    return any(isinstance(f, _MutatingFinder) and f.variable == variable for f in sys.meta_path)


def install(variable: str, mutations: Sequence[Mutation], error: type[Exception]) -> None:
    """Put ``mutations`` in front of the import system, before any module they
    name is imported (else ``error``)."""
    loaded = [m.module for m in mutations if m.module in sys.modules]
    if loaded:
        raise error(f"{variable}: {loaded[0]} was imported before the mutations could be put in")
    sys.meta_path.insert(0, _MutatingFinder(variable, mutations, error))
