"""One-line bugs put into vLLM's own modules as they are imported.

What an engineer's change to the tree looks like to cgsim, without writing
into the tree: ``CGSIM_VLLM_MUTATIONS`` (JSON: a list of {"module", "old",
"new"}) names lines of vLLM modules and what they become, and a
``sys.meta_path`` finder in front of the import system (and of a source tree
laid over the install) loads each named module from its own file with the
line replaced.  The variable travels to every process of a job, as
``CGSIM_VLLM_SOURCE`` does; tracebacks point at the module's file, whose line
numbers stay what they were.  A line that is not in the module exactly once
is a broken environment (exit 2), never a silent no-op.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["MUTATIONS_ENV", "Mutation", "MUTATIONS", "install_from_environment", "environment_for"]

MUTATIONS_ENV = "CGSIM_VLLM_MUTATIONS"
CU = "vllm.v1.worker.gpu.cudagraph_utils"


@dataclass(frozen=True)
class Mutation:
    module: str
    old: str
    new: str
    name: str = ""
    bug: str = ""  # what goes wrong, in a line

    def to_json(self) -> dict:
        return {"module": self.module, "old": self.old, "new": self.new, "name": self.name}


# Bugs in the code every release 0.32-0.34 shares (the tests put each into the
# installed tree and require a campaign to report it).
MUTATIONS: tuple[Mutation, ...] = (
    Mutation(CU, "        and (desc.num_reqs is None or desc.num_reqs >= num_reqs)",
             "        and (desc.num_reqs is None or desc.num_reqs > num_reqs)",
             "compat-exact-reqs", "a graph captured for exactly the batch's requests is not compatible with it"),
    Mutation(CU, "        and desc.num_tokens >= num_tokens",
             "        and desc.num_tokens > num_tokens",
             "compat-exact-tokens", "a graph captured for exactly the batch's tokens is not compatible with it"),
    Mutation(CU, "            for mode in [CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL]:",
             "            for mode in [CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE]:",
             "full-captured-first", "FULL graphs are captured before the PIECEWISE ones"),
    Mutation(CU, "                        forward_fn = create_forward_fn(desc, warmup=False)",
             "                        forward_fn = forward_fn",
             "capture-reuses-warmup-state", "the capture reuses the warmup's inputs and attention metadata"),
)


def environment_for(mutations: Sequence[Mutation]) -> dict[str, str]:
    """The environment that puts ``mutations`` into a job's processes."""
    return {MUTATIONS_ENV: json.dumps([m.to_json() for m in mutations])}


class MutationError(RuntimeError):
    """A mutation does not apply to the module it names."""


class _MutatedLoader(importlib.abc.Loader):
    def __init__(self, fullname: str, origin: str, edits: Sequence[Mutation]):
        self.fullname, self.origin, self.edits = fullname, origin, edits

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        with open(self.origin, encoding="utf-8") as fh:
            source = fh.read()
        for m in self.edits:
            count = source.count(m.old)
            if count != 1:
                raise MutationError(f"mutation {m.name or m.old.strip()!r} does not apply to {self.fullname} "
                                    f"({self.origin}): its line occurs {count} times, not once")
            source = source.replace(m.old, m.new)
        exec(compile(source, self.origin, "exec"), module.__dict__)  # noqa: S102 - the tree's own code, one line changed


class _MutatingFinder(importlib.abc.MetaPathFinder):
    def __init__(self, mutations: Sequence[Mutation]):
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
                    fullname, spec.origin, loader=_MutatedLoader(fullname, spec.origin, edits))
        return None


def install_from_environment() -> tuple[Mutation, ...]:
    """Put the mutations CGSIM_VLLM_MUTATIONS names in front of the import
    system (once per process; before vLLM is imported)."""
    text = os.environ.get(MUTATIONS_ENV)
    if not text:
        return ()
    if any(isinstance(f, _MutatingFinder) for f in sys.meta_path):
        return ()
    try:
        mutations = tuple(Mutation(str(d["module"]), str(d["old"]), str(d["new"]), str(d.get("name", "")))
                          for d in json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        raise MutationError(f"{MUTATIONS_ENV} is not a JSON list of {{module, old, new}} ({exc})") from None
    loaded = [m.module for m in mutations if m.module in sys.modules]
    if loaded:
        raise MutationError(f"{MUTATIONS_ENV}: {loaded[0]} was imported before the mutations could be put in")
    sys.meta_path.insert(0, _MutatingFinder(mutations))
    return mutations
