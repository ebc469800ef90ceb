"""``python -m fuzz export-test``: a finding as a regression test in the engine's
own testing style.

The test it writes is a standalone pytest module that imports only the engine,
torch, pytest and the standard library: no cgsim.  It builds the finding's
config the way the engine's own CUDA-graph tests do (vLLM:
``tests/v1/cudagraph/``: real ``VllmConfig`` pieces, ``monkeypatch`` for the
pipeline-parallel group, the graph pool and the capture context,
``unittest.mock`` doubles for the GPU parts), runs the finding's steps through
the engine's real manager and asserts the violated property in a few lines of
plain code, with a message that says what went wrong.  What only cgsim can
compute (the spec's resolved mode, the scheduler's decode lengths, the spec's
capture list) is written into the test as literal values.

A ``vllm-encoder`` finding (vLLM's vision-encoder ``EncoderCudaGraphManager``)
is written by ``vllm_encoder``: the VllmConfig from the finding's launch line
through vLLM's ``EngineArgs``, cgsim's toy encoder generated from its source.
Findings of cgsim's own encoder reference and mutants are refused (their
repro script reproduces them).

Each target family names its writer (``TargetFamily.export_writer``,
``writer_of``); a finding on a target without a writer, or of a property its
writer does not know, is refused with one line (``ExportError``, exit 2 in
the CLI).  SGLang findings get a writer in SGLang's test style by naming one
on sglang's target family.
"""

from __future__ import annotations

import re
import importlib
from typing import Callable

from cgsim.finding import Finding
from cgsim.targets.registry import TargetFamily, family_of_target_name
from cgsim.targets.registry import families as target_families
from fuzz.export_test.docs import FINDINGS_DOC, DocumentedFinding, ExportError, documented_findings
from fuzz.export_test.vllm import VLLM_PROPERTIES
from fuzz.export_test.vllm_encoder import ENCODER_PROPERTIES_WRITTEN
from fuzz.export_test.vllm_runtime import DESIGN_FREE_PROPERTIES, design_free

__all__ = [
    "ExportError",
    "DocumentedFinding",
    "VLLM_PROPERTIES",
    "ENCODER_PROPERTIES_WRITTEN",
    "DESIGN_FREE_PROPERTIES",
    "design_free",
    "writer_of",
    "documented_findings",
    "export_test",
    "default_test_name",
    "FINDINGS_DOC",
]


def default_test_name(finding: Finding) -> str:
    return "test_cgsim_" + re.sub(r"[^a-z0-9]+", "_", finding.id.lower()) + ".py"


def export_test(finding: Finding, source: str | None = None, doc_path: str = FINDINGS_DOC) -> str:
    """The test module for ``finding`` (its text).  ``source`` is how the
    finding was given (shown in the module's docstring).  Raises ExportError
    when the finding's target has no writer or its property is unsupported."""
    target_family = family_of_target_name(finding.target)
    writer = writer_of(target_family) if target_family is not None else None
    if writer is None:
        engines = ", ".join(sorted({f.name.split("-")[0] for f in target_families().values() if f.export_writer}))
        if target_family is not None and target_family.cgsims_own:
            why = (f"finding {finding.id} is on cgsim's own {finding.target!r} manager, not an engine's; "
                   f"export-test writes tests for engine targets ({engines}); reproduce it with its repro script "
                   f"(findings/{finding.repro}) or python -m fuzz replay")
        else:
            why = (f"finding {finding.id} is on target {finding.target!r}, which has no test writer yet "
                   f"(export-test writes tests for: {engines})")
        raise ExportError(why)
    doc = documented_findings(doc_path).get(finding.id)
    text = writer(finding, source, doc)
    compile(text, default_test_name(finding), "exec")  # a writer bug must not reach the user as a file
    return text


def writer_of(target_family: TargetFamily) -> Callable[[Finding, str | None, DocumentedFinding | None], str] | None:
    """The test writer a target family names (``TargetFamily.export_writer``), None where it names none."""
    if target_family.export_writer is None:
        return None
    module, _, name = target_family.export_writer.partition(":")
    return getattr(importlib.import_module(module), name)
