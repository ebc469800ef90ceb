"""What the vLLM writer (``vllm``) and its runtime templates
(``vllm_runtime``, mixed into the writer) share: a template's ``Parts``,
``fill`` for the ``<<name>>`` placeholders of generated code, and the
literals both write (the speculators, the scheduler's constants) or bound
(how many batch shapes a test may enumerate)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from cgsim.config import ManagerConfig

__all__ = ["Parts", "fill", "MAX_ENUMERATED_SHAPES", "SPECULATORS", "speculators_literal", "count_partitions",
           "scheduler_constants"]

# Past this many query-length partitions a test's enumeration of every
# producible batch (CAPTURE-USEFUL, DISPATCH-ROUNDTRIP) would take minutes:
# shrink the finding first.
MAX_ENUMERATED_SHAPES = 50_000

# Where the Eagle/MTP speculator that builds the draft model's managers lives
# (its init_cudagraph_manager builds a prefill and a decode manager):
# target_dependent_ar from 0.32, autoregressive 0.23-0.31, eagle 0.20-0.22.
SPECULATORS = (
    ("vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator", "TargetDependentARSpeculator"),
    ("vllm.v1.worker.gpu.spec_decode.autoregressive.speculator", "AutoRegressiveSpeculator"),
    ("vllm.v1.worker.gpu.spec_decode.eagle.speculator", "EagleSpeculator"),
)


def fill(template: str, **values: str) -> str:
    """``<<name>>`` placeholders in a template of generated code (which keeps
    its own braces for f-strings)."""
    out = template
    for k, v in values.items():
        out = out.replace(f"<<{k}>>", v)
    left = re.findall(r"<<(\w+)>>", out)
    if left:
        raise AssertionError(f"unfilled placeholders {left}")
    return out


@dataclass
class Parts:
    """What a property's template contributes to the module."""

    body: str  # the test function's body after the steps it runs first
    helpers: tuple[str, ...] = ()
    constants: tuple[str, ...] = ()
    # Whether the checked step itself runs before the body (a capture whose
    # result the body judges) or is the body's own business.
    runs_checked_step: bool = False
    builds_manager: bool = True
    fixtures: tuple[str, ...] = ()  # the test function's fixtures beyond vllm_config, cpu_graphs, recorder
    imports: tuple[str, ...] = ()  # vLLM imports the body or its helpers need
    preamble: str = ""  # lines before the manager is built (skips for releases the test cannot judge)


def speculators_literal() -> str:
    return "(\n" + "".join(f"    (\n        {m!r},\n        {c!r},\n    ),\n" for m, c in SPECULATORS) + ")"


def count_partitions(total: int, parts: int) -> int:
    """How many multisets of at most ``parts`` positive lengths sum to at most
    ``total`` (partitions into at most k parts = partitions into parts <= k)."""
    ways = [1] + [0] * total
    for size in range(1, min(parts, total) + 1):
        for t in range(size, total + 1):
            ways[t] += ways[t - size]
    return sum(ways[1:])


def scheduler_constants(c: ManagerConfig) -> str:
    lens = {r: c.scheduler_longest_decode_len(r) for r in range(1, c.max_num_reqs + 1)}
    lines = [
        "# What the scheduler can hand the runner (cgsim's scheduler model): at most",
        "# MAX_NUM_REQS requests; any shape as prompt chunks (a batch with a prefill);",
        "# a pure decode of n requests gives each at most LONGEST_DECODE_LEN_FOR_REQS[n]",
        "# tokens (1 + the speculative tokens scheduled for a batch of at least n).",
        f"LONGEST_DECODE_LEN_FOR_REQS = {lens}",
        f"MAX_CAPTURE_SIZE = {c.max_capture_size or max(c.capture_sizes)}",
    ]
    if c.num_ubatches <= 1:
        lines.append("UBATCH_THRESHOLD = None  # no DBO")
    return "\n".join(lines)
