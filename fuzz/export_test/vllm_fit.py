"""cgsim's fit rule (SPEC §2, ``cgsim/spec/fit.py``) as an exported vLLM test
carries it: the functions generated from their source (``standalone``), never
retyped, and a thin adapter for what differs in the exported world.

What differs: the test's descriptors are vLLM's, whose older releases lack
fields (read with cgsim's defaults), its ``CUDAGraphMode`` is vLLM's (the
runtime members cgsim's ``RUNTIME_RANK`` names exist there under the same
names), and its batch is the exported ``Batch`` (``vllm_code.HELPER_BATCH``,
which carries the fields the rule reads).  tests/fuzz/export_test/test_export_fit.py holds the
generated text equal to cgsim's rule on drawn descriptors and batches."""

from __future__ import annotations

from fuzz.export_test.standalone import Part, standalone

__all__ = ["FIT_ADAPTER", "FIT_IMPORTS", "FIT_PARTS", "FIT_RULE"]

# What the exported helpers call; everything these use from cgsim follows.
FIT_PARTS = (Part("cgsim.spec.fit", ("compatible", "padding_waste", "dispatch_choices")),)

# The import lines the generated functions need, and the functions themselves.
FIT_IMPORTS, FIT_RULE = standalone(list(FIT_PARTS), provided=frozenset({"CUDAGraphMode"}), annotations=False)

FIT_ADAPTER = '''

# The exported world's side of cgsim's rule above: vLLM's descriptors, this
# test's LORA_CASES.
class Descriptor(NamedTuple):
    """A vLLM descriptor as cgsim's rule reads it: the fields a release lacks
    (LoRA cases before 0.24, max_query_len before 0.28, micro-batches before
    0.30) at the value that release always means."""

    cg_mode: CUDAGraphMode
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None = None
    max_query_len: int | None = None
    num_active_loras: int = 0
    num_ubatches: int = 1

    @classmethod
    def of(cls, desc):
        return cls(
            desc.cg_mode,
            desc.num_tokens,
            desc.num_reqs,
            getattr(desc, "uniform_token_count", None),
            getattr(desc, "max_query_len", None),
            getattr(desc, "num_active_loras", 0),
            getattr(desc, "num_ubatches", 1),
        )


def fits(desc, batch):
    """Whether a graph captured for ``desc`` can run ``batch`` (cgsim's SPEC §2)."""
    return compatible(Descriptor.of(desc), batch, LORA_CASES)


def best_choices(batch, captured):
    """The graphs dispatch may pick for ``batch``: those that fit, of the
    highest mode (FULL over PIECEWISE), padding least."""
    by_view = {Descriptor.of(d): d for d in captured}
    return {by_view[v] for v in dispatch_choices(batch, by_view, LORA_CASES)}


def fitting(captured, batch, mode=None):
    """The captured graphs (of ``mode``; None: any) that fit ``batch``."""
    return [d for d in captured if (mode is None or d.cg_mode == mode) and fits(d, batch)]


def best(descs, batch):
    """One graph of ``descs`` that pads ``batch`` least (for messages)."""
    return min(descs, key=lambda d: padding_waste(d, batch)) if descs else None
'''
