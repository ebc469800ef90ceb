"""vLLM's documented-defect classifier reads a finding's fields, never its message.

Every committed finding (docs/, tests/) and every finding a mutant's example
run gives is classified at each release boundary twice: as loaded, and with
its message blanked.  The labels must be the same: a rule that read the
message would lose its match.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cgsim.finding import Finding
from cgsim.observe import observe
from cgsim.targets.mutants import MUTANT_INFO
from cgsim.targets.vllm.known import KNOWN_DEFECTS, classify

ROOT = Path(__file__).resolve().parents[4]

# Every release where a defect comes or goes, and None: any release.
VERSIONS = sorted({d.first for d in KNOWN_DEFECTS} | {d.fixed for d in KNOWN_DEFECTS if d.fixed}
                  | {d.reachable_from for d in KNOWN_DEFECTS if d.reachable_from},
                  key=lambda v: tuple(int(x) for x in v.split("."))) + [None]


def _committed() -> list[Finding]:
    out = []
    for path in sorted([*ROOT.glob("docs/**/*.json"), *ROOT.glob("tests/**/*.json")]):
        try:
            data = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(data, dict) and data.get("schema") == "cgsim.finding":
            out.append(Finding.from_json(data, str(path)))
    return out


def _labels(f: Finding) -> list[str | None]:
    return [getattr(classify(f, v), "name", None) for v in VERSIONS]


def test_committed_findings_keep_their_labels_without_their_message():
    found = _committed()
    assert len(found) >= 20
    labelled = 0
    for f in found:
        with_message = _labels(f)
        labelled += any(with_message)
        assert _labels(f.with_(message="")) == with_message, (f.id, f.message)
    # the documented vLLM findings are each some defect's
    assert labelled >= 20


@pytest.mark.parametrize("name", sorted(MUTANT_INFO))
def test_a_fresh_findings_label_needs_no_message(name):
    for f in observe(MUTANT_INFO[name].example(), f"mutant:{name}", "mock", 60.0).findings:
        assert _labels(f.with_(message="")) == _labels(f), (f.property, f.message)
