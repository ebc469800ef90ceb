"""The vLLM part of the agreement corpus: vLLM's own manager on the CPU mock
and on real CUDA graphs must give the same verdicts, the same dispatch
decisions (steps and sweeps) and, within OUTPUT_ATOL, the same replayed rows.

    python tests/agreement/vllm_agreement.py make               # on a machine with vLLM: record on the mock
    python tests/agreement/vllm_agreement.py check --backend cuda [--jobs 8] [--json OUT]

``make`` writes tests/agreement/vllm_corpus.jsonl: every mode x breakable x
(plain, LoRA, speculative, dynamic speculative, micro-batched, varlen) config
the installed release accepts, plus the documented findings
(docs/findings/*.json) that reproduce on it.  ``check`` runs every entry in a
fresh child process (a device-side assert poisons a CUDA context for good;
vLLM's breakable wrapper keeps class-level capture state), forked from a
parent that imported vLLM once (engine_agreement.py, shared with the SGLang
part).  A disagreement is a mock or adapter bug to fix, never a vLLM finding.
"""

from __future__ import annotations

import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(os.path.dirname(HERE)) not in sys.path:  # run as a script
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from tests.agreement.engine_agreement import OUTPUT_ATOL, ROOT, STALE_READ_CONSEQUENCES, compare, main as _main  # noqa: E402,F401

CORPUS = os.path.join(HERE, "vllm_corpus.jsonl")


def entries_to_record() -> list[tuple[str, dict]]:
    from make_corpus import configs, steps_for

    from cgsim.scenario import Scenario

    out = []
    for name, config in configs():
        if name.endswith("-dbo") and config.mode.value == "PIECEWISE":
            continue
        scenario = Scenario(config, steps_for(config), ruleset="vllm-0.32")
        out.append((f"vllm/{name}", scenario.to_json()))
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "findings", "*.json"))):
        finding = json.load(open(path, encoding="utf-8"))
        out.append((f"vllm/finding/{finding['id']}", finding["scenario"]))
    return out


def main(argv: list[str] | None = None) -> int:
    return _main(argv, __doc__, CORPUS, "vllm", "vLLM", entries_to_record)


if __name__ == "__main__":
    sys.exit(main())
