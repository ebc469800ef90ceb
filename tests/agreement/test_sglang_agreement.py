"""The SGLang part of the agreement corpus (tests/agreement/sglang_agreement.py):
its coverage, and a few of its entries checked on the mock as ``check
--backend mock`` checks them (the whole corpus, and real CUDA graphs:
``python tests/agreement/sglang_agreement.py check --backend cuda``).
Skipped where sglang does not import, like the other sglang tests."""

from __future__ import annotations

import json
import os

import pytest

from tests.sglang_required import require_sglang_or_skip

require_sglang_or_skip()

from cgsim.config import ManagerConfig  # noqa: E402
from cgsim.spec import sglang as rules  # noqa: E402

from tests import agreement  # noqa: E402
from tests.agreement.engine_agreement import compare  # noqa: E402
from tests.agreement.observe import observe  # noqa: E402

HERE = os.path.dirname(agreement.__file__)

pytestmark = pytest.mark.sglang
ENTRIES = [json.loads(line) for line in open(os.path.join(HERE, "sglang_corpus.jsonl"), encoding="utf-8")]
# One entry per feature the corpus must cover, and both documented defects.
SAMPLE = ("sglang/FULL_AND_PIECEWISE-lora", "sglang/FULL-tbo-verify", "sglang/FULL_DECODE_ONLY-dp2",
          "sglang/FULL-nopad", "sglang/FULL_AND_PIECEWISE-eagle-topk2", "sglang/finding/no-crash-52cea3c636",
          "sglang/finding/sgl-capture-useful-b29347f218")


def test_corpus_covers_what_it_must():
    assert len(ENTRIES) >= 40
    configs = [ManagerConfig.from_json(e["scenario"]["config"]) for e in ENTRIES]
    backends = {rules.runner_backends(c) for c in configs}
    assert {d for d, _ in backends} >= {rules.FULL_BACKEND, rules.BREAKABLE, rules.DISABLED}
    assert {p for _, p in backends} >= {rules.FULL_BACKEND, rules.BREAKABLE, rules.DISABLED}
    assert any(max(c.lora_cases) > 0 and rules.options(c).record_nolora_graph for c in configs)
    assert any(max(c.lora_cases) > 0 and not rules.options(c).record_nolora_graph for c in configs)
    assert any(c.num_ubatches == 2 for c in configs)
    assert any(rules.options(c).dp_size > 1 for c in configs)
    assert any(rules.options(c).disable_padding for c in configs)
    assert any(c.decode_query_len > 1 for c in configs)
    from cgsim.targets.sglang.known import KNOWN_DEFECTS

    # Every documented defect's finding, with its property in the recorded verdict.
    findings = {e["id"]: e for e in ENTRIES if e["id"].startswith("sglang/finding/")}
    assert len(findings) >= len(KNOWN_DEFECTS)
    for d in KNOWN_DEFECTS:
        assert any(d.properties & set(e["expected"]["violations"]) for e in findings.values()), d.name
    # Replays to compare outputs of, on both runner kinds.
    assert sum(bool(e["expected"]["outputs"]) for e in ENTRIES) >= 40
    # EAGLE's draft runners: their own decisions and replayed rows, chain and top-k drafts, padding off.
    drafted = [(ManagerConfig.from_json(e["scenario"]["config"]), e["expected"]["managers"]) for e in ENTRIES
               if set(e["expected"]["managers"]) == {rules.DRAFT_DECODE, rules.DRAFT_EXTEND}]
    assert len(drafted) >= 10
    assert all(sub["dispatch"] and sub["outputs"] for _, subs in drafted for sub in subs.values())
    assert any(rules.eagle_topk(c) > 1 for c, _ in drafted)
    assert any(rules.options(c).disable_padding for c, _ in drafted)


@pytest.mark.parametrize("entry_id", SAMPLE)
def test_mock_agrees_with_the_recording(entry_id):
    entry = next(e for e in ENTRIES if e["id"] == entry_id)
    assert compare(entry, observe(entry, "mock")) == []
