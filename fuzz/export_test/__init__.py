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

One writer per engine (``WRITERS``); a finding on a target without a writer,
or of a property its writer does not know, is refused with one line
(``ExportError``, exit 2 in the CLI).  SGLang findings get a writer in SGLang's
test style once cgsim has an SGLang target: add it to ``WRITERS``.
"""

from __future__ import annotations

import re
from typing import Callable

from cgsim.finding import Finding
from fuzz.export_test.docs import FINDINGS_DOC, DocumentedFinding, ExportError, documented_findings
from fuzz.export_test.vllm import VLLM_PROPERTIES, write_vllm_test
from fuzz.export_test.vllm_encoder import ENCODER_PROPERTIES_WRITTEN, write_vllm_encoder_test
from fuzz.export_test.vllm_runtime import DESIGN_FREE_PROPERTIES, design_free

__all__ = [
    "ExportError",
    "DocumentedFinding",
    "VLLM_PROPERTIES",
    "ENCODER_PROPERTIES_WRITTEN",
    "DESIGN_FREE_PROPERTIES",
    "design_free",
    "WRITERS",
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
    family = finding.target.split(":", 1)[0]
    writer = WRITERS.get(family)
    if family in ("encoder-reference", "encoder-mutant"):
        raise ExportError(f"finding {finding.id} is on cgsim's own {finding.target!r} encoder manager, not an "
                          "engine's; export-test writes engine tests (for the vision encoder: target vllm-encoder); "
                          f"reproduce it with its repro script (findings/{finding.repro}) or python -m fuzz replay")
    if writer is None:
        engines = ", ".join(sorted({name.split("-")[0] for name in WRITERS}))  # vllm-encoder is vLLM's too
        if family in ("reference", "mutant"):
            why = (f"finding {finding.id} is on cgsim's own {finding.target!r} manager, not an engine's; "
                   f"export-test writes tests for engine targets ({engines}); replay it with python -m fuzz replay")
        else:
            why = (f"finding {finding.id} is on target {finding.target!r}, which has no test writer yet "
                   f"(export-test writes tests for: {engines})")
        raise ExportError(why)
    doc = documented_findings(doc_path).get(finding.id)
    text = writer(finding, source, doc)
    compile(text, default_test_name(finding), "exec")  # a writer bug must not reach the user as a file
    return text


WRITERS: dict[str, Callable[[Finding, str | None, DocumentedFinding | None], str]] = {
    "vllm": write_vllm_test,
    # vLLM's vision-encoder manager (documented in docs/encoder.md, not docs/findings.md).
    "vllm-encoder": lambda finding, source, doc: write_vllm_encoder_test(finding, source),
    # "sglang": SGLang's test style, once cgsim has an SGLang target.
}
