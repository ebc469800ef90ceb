"""The fit rule an exported vLLM test carries is cgsim's.

export-test generates ``fits`` and ``best_choices`` from ``cgsim/spec/fit.py``'s
source (``fuzz/export_test/vllm_fit.py``).  Executed from the generated text,
against stand-ins for vLLM's descriptor and mode (of a current release and of
older ones that lack fields), they decide every drawn (graph, batch) and every
drawn set of captured graphs as ``cgsim.spec.fit`` does; an altered text
disagrees somewhere Hypothesis finds."""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass, make_dataclass
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from cgsim.descriptors import Batch, BatchDescriptor
from cgsim.modes import CUDAGraphMode as CgsimMode
from cgsim.spec import fit
from fuzz.export_test import vllm_code
from fuzz.export_test.vllm_fit import FIT_IMPORTS

# vLLM's CUDAGraphMode as the exported test imports it (its own enum, not cgsim's).
VllmMode = enum.Enum("CUDAGraphMode", {"NONE": 0, "PIECEWISE": 1, "FULL": 2, "FULL_DECODE_ONLY": (2, 0),
                                      "FULL_AND_PIECEWISE": (2, 1)})
RUNTIME = ("NONE", "PIECEWISE", "FULL")

# vLLM's BatchExecutionDescriptor by release: the fields it has (older
# releases lack LoRA cases, max_query_len, micro-batches).
OPTIONAL = (("uniform_token_count", None), ("max_query_len", None), ("num_active_loras", 0), ("num_ubatches", 1))
RELEASES = {
    "0.32": OPTIONAL,
    "0.28": OPTIONAL[:3],
    "0.24": OPTIONAL[:1] + OPTIONAL[2:3],
    "0.21": OPTIONAL[:1],
}


def vllm_descriptor_class(fields):
    return make_dataclass("BatchExecutionDescriptor", [("cg_mode", object), ("num_tokens", int), ("num_reqs", object)]
                          + [(n, object, default) for n, default in ((f, d) for f, d in fields)], frozen=True)


DESCRIPTOR_CLASSES = {release: vllm_descriptor_class(fields) for release, fields in RELEASES.items()}


def exported_namespace(fit_text: str = vllm_code.HELPER_FITS, batch_text: str = vllm_code.HELPER_BATCH,
                       lora_cases=(0,)) -> dict:
    """The exported module's helpers, executed as the module runs them."""
    namespace = {"NamedTuple": NamedTuple, "CUDAGraphMode": VllmMode, "LORA_CASES": lora_cases}
    exec("\n".join(FIT_IMPORTS) + "\n" + batch_text + "\n" + fit_text, namespace)  # noqa: S102 - generated here
    return namespace


@dataclass(frozen=True)
class Case:
    """Drawn: a release's descriptor fields, LoRA cases, captured graphs, a batch."""

    release: str
    lora_cases: tuple[int, ...]
    descs: tuple[BatchDescriptor, ...]  # cgsim's, with what the release lacks at its default
    batch: Batch


@st.composite
def cases(draw) -> Case:
    release = draw(st.sampled_from(sorted(RELEASES)))
    have = {name for name, _ in RELEASES[release]}
    lora_cases = tuple(sorted(set(draw(st.lists(st.integers(0, 4), max_size=3))) | {0}))
    ubatches = draw(st.sampled_from((1, 2)))
    if ubatches == 2:
        # Micro-batched: a uniform decode (the runner splits those), large or
        # small beside the graphs (an empty second micro-batch).
        lens = (draw(st.integers(1, 3)),) * draw(st.integers(1, 6))
        prefill = False
    else:
        lens = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=5)))
        prefill = draw(st.booleans())
    batch = Batch(lens, draw(st.integers(0, 5)), ubatches, has_prefill=prefill)

    def field(name, values, default):
        return draw(st.sampled_from(values)) if name in have else default

    descs = []
    for _ in range(draw(st.integers(0, 6))):
        descs.append(BatchDescriptor(
            CgsimMode[draw(st.sampled_from(("FULL", "PIECEWISE")))], draw(st.integers(1, 40)),
            draw(st.sampled_from((None, 1, 2, 4, 8))),
            field("uniform_token_count", (None, 1, 2, 3), None),
            field("max_query_len", (None, 2, 4), None),
            field("num_active_loras", lora_cases, 0),
            field("num_ubatches", (1, ubatches), 1)))
    descs = list(dict.fromkeys(descs))
    return Case(release, lora_cases, tuple(descs), batch)


def as_vllm(desc: BatchDescriptor, release: str):
    """cgsim's descriptor as that release's vLLM descriptor (fields it lacks left out)."""
    have = [name for name, _ in RELEASES[release]]
    return DESCRIPTOR_CLASSES[release](VllmMode[desc.cg_mode.name], desc.num_tokens, desc.num_reqs,
                                       **{n: getattr(desc, n) for n in have})


def as_exported_batch(namespace: dict, b: Batch):
    return namespace["Batch"](b.query_lens, b.num_active_loras, b.num_ubatches, b.has_prefill)


def disagreement(case: Case, fit_text: str = vllm_code.HELPER_FITS,
                 batch_text: str = vllm_code.HELPER_BATCH) -> str | None:
    """Where the exported helpers decide ``case`` otherwise than cgsim.spec.fit
    (None: they agree)."""
    ns = exported_namespace(fit_text, batch_text, case.lora_cases)
    batch = as_exported_batch(ns, case.batch)
    vllm_of = {d: as_vllm(d, case.release) for d in case.descs}
    for d in case.descs:
        theirs, ours = ns["fits"](vllm_of[d], batch), fit.compatible(d, case.batch, case.lora_cases)
        if theirs != ours:
            return f"fits({d.short()}) = {theirs}, cgsim: {ours}"
    theirs = ns["best_choices"](batch, list(vllm_of.values()))
    ours = {vllm_of[d] for d in fit.dispatch_choices(case.batch, case.descs, case.lora_cases)}
    if theirs != ours:
        return f"best_choices = {theirs}, cgsim: {ours}"
    best = ns["best"](list(vllm_of.values()), batch)
    if case.descs and fit.padding_waste(best, case.batch) != min(fit.padding_waste(d, case.batch) for d in case.descs):
        return f"best = {best}: pads more than another"
    return None


@settings(max_examples=600, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_the_exported_fit_rule_decides_as_cgsims(case):
    assert disagreement(case) is None, case


# Edits to the generated text (or to the exported batch it reads) that the
# differential test must catch: (what it breaks, the text, the replacement).
ALTERATIONS = [
    ("the empty second micro-batch", "return num_ubatches > 1 and 2 * batch_tokens < graph_tokens", "return False"),
    ("max_query_len's bound", "batch.decode_max_query_len > desc.max_query_len",
     "batch.decode_max_query_len >= desc.max_query_len"),
    ("uniform decode", "desc.uniform_token_count != batch.uniform_token_count", "False"),
    ("the LoRA case", "return _lora_case(num_active_loras, tuple(lora_cases))", "return num_active_loras"),
    ("request padding", "desc.num_reqs < batch.num_reqs", "desc.num_reqs < batch.num_reqs - 1"),
    ("micro-batch count", "return desc.num_ubatches == batch.num_ubatches and", "return"),
    ("FULL over PIECEWISE", "CUDAGraphMode.PIECEWISE: 1", "CUDAGraphMode.PIECEWISE: 3"),
    ("least padding", "least = min(", "least = max("),
    ("an older release's missing field", 'getattr(desc, "num_active_loras", 0)', 'getattr(desc, "num_active_loras", 1)'),
]


@pytest.mark.parametrize("what,old,new", ALTERATIONS, ids=[a[0] for a in ALTERATIONS])
def test_an_altered_fit_rule_disagrees(what, old, new):
    assert vllm_code.HELPER_FITS.count(old) == 1, f"{what}: the generated text no longer holds {old!r}"
    altered = vllm_code.HELPER_FITS.replace(old, new)
    example = find(cases(), lambda case: disagreement(case, fit_text=altered) is not None,
                   settings=settings(max_examples=5000, database=None, deadline=None))
    assert disagreement(example, fit_text=altered)


def test_an_exported_batch_reading_the_wrong_max_query_len_disagrees():
    """The exported batch tells dispatch no max_query_len for a micro-batch;
    the rule reads the decode's longest request (``decode_max_query_len``)."""
    old = "return None if self.has_prefill else max(self.query_lens)"
    assert vllm_code.HELPER_BATCH.count(old) == 1
    altered = vllm_code.HELPER_BATCH.replace(old, "return self.max_query_len")
    example = find(cases(), lambda case: disagreement(case, batch_text=altered) is not None,
                   settings=settings(max_examples=5000, database=None, deadline=None))
    assert example.batch.num_ubatches > 1 or example.batch.has_prefill


@pytest.mark.parametrize("function", [fit.empty_second_ubatch, fit.fits_in_case, fit.compatible, fit.padding_waste,
                                      fit.dispatch_choices])
def test_the_exported_rule_is_generated_from_cgsims_source(function):
    """Every line of each function's body is in the exported text as written
    in cgsim/spec/fit.py (the signature loses its annotations only)."""
    lines = inspect.getsource(function).splitlines()
    body = lines[next(i for i, line in enumerate(lines) if line.rstrip().endswith(":")) + 1:]
    text = vllm_code.HELPER_FITS
    assert all(line in text for line in body), [line for line in body if line not in text]
    assert f"def {function.__name__}(" in text
