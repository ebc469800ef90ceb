"""The encoder agreement corpus (tests/agreement/encoder_corpus.jsonl) still
holds on the mock: cgsim's reference and mutants here, vLLM's manager where
vLLM 0.32's encoder design is installed (the corpus was recorded on it;
benchmarks/gpu_vllm.sh checks the same corpus on real CUDA graphs)."""

from __future__ import annotations

import json

import pytest

from tests.agreement.encoder_agreement import CORPUS, _differences, observe

with open(CORPUS, encoding="utf-8") as _fh:
    ENTRIES = [json.loads(line) for line in _fh if line.strip()]
OWN = [e for e in ENTRIES if e["target"] != "vllm-encoder"]
VLLM = [e for e in ENTRIES if e["target"] == "vllm-encoder"]


def test_the_corpus_covers_every_mutant_both_vllm_defects_and_data_parallel_ranks():
    from cgsim.encoder.mutants import ENCODER_MUTANTS

    assert {e["target"] for e in OWN} == {"encoder-reference"} | {f"encoder-mutant:{m}" for m in ENCODER_MUTANTS}
    assert len(ENTRIES) >= 40
    assert any(e["scenario"]["config"]["dp_encoder"] for e in VLLM)
    assert {"ENC-CAPTURE-ONCE", "ENC-FIT"} <= {p for e in VLLM for p in e["expected"]["violated"]}


@pytest.mark.parametrize("i", range(len(OWN)))
def test_cgsims_own_entries_agree_on_the_mock(i):
    e = OWN[i]
    assert _differences(e["expected"], observe(e["target"], e["scenario"], "mock")) == []


@pytest.mark.vllm
@pytest.mark.parametrize("i", range(len(VLLM)))
def test_vllms_entries_agree_on_the_mock(i):
    from tests.vllm_required import skip_unless_vllm

    skip_unless_vllm()
    from cgsim.targets.vllm.encoder import tree_design

    if tree_design() != "vllm-encoder-0.32":
        pytest.skip(f"the corpus was recorded on vLLM 0.32's encoder design; this tree follows {tree_design()}")
    e = VLLM[i]
    assert _differences(e["expected"], observe(e["target"], e["scenario"], "mock")) == []
