"""cgsim's property rules (the predicate each property names with ``rule=``
in its declaration, ``cgsim/properties/registry.py``: DISPATCH-SOUND's
``sound_fit`` (with ``view.py``'s ``graph_gap``, its runner half), DISPATCH-PRIORITY's ``priority_ok``, DISPATCH-COMPLETE's
``complete_ok``, DISPATCH-ROUNDTRIP's ``roundtrip_ok``, INIT-TOTAL's
``descriptor_problems``, PAD-CONSISTENT's ``covers_query_len``,
CAPTURE-USEFUL's ``sole_choice``, DECODE-LENGTHS' ``decode_length_gaps``,
CAND-ORDER's ``capture_list_diff``, RELEASE-RECAPTURE's ``release_problems``,
BEFORE-CAPTURE's ``capture_flag_problem``) and scheduler model
(``cgsim/spec/scheduler.py`` ``producible_batches``) as an exported vLLM test
carries them: generated from their source (``standalone``), never retyped,
each with a thin adapter for what differs in the exported world.  A rule is
found through the registry (``rule_parts``), so the exported check is the one
the judge calls.

Both are generated beside the fit rule (``vllm_fit.FIT_RULE``, always in the
same module before them): the names it defines are left to it, as are vLLM's
``CUDAGraphMode`` and the exported ``Batch`` (``vllm_code.HELPER_BATCH``,
whose constructor takes cgsim's ``Batch`` arguments).
tests/fuzz/export_test/test_export_rules.py holds the generated text equal to cgsim's rules and
model on drawn inputs."""

from __future__ import annotations

import ast

from cgsim.properties import registered
from fuzz.export_test.standalone import Part, StandaloneError, standalone
from fuzz.export_test.vllm_fit import FIT_RULE

__all__ = ["COMPLETE_ADAPTER", "COMPLETE_RULE", "PRIORITY_ADAPTER", "PRIORITY_RULE", "ROUNDTRIP_ADAPTER",
           "ROUNDTRIP_PARTS", "ROUNDTRIP_RULE", "SCHEDULER_ADAPTER", "SCHEDULER_PARTS", "SCHEDULER_RULE",
           "SOUND_ADAPTER", "SOUND_PARTS", "SOUND_RULE", "INIT_TOTAL_ADAPTER", "INIT_TOTAL_RULE", "PAD_ADAPTER", "PAD_RULE", "USEFUL_RULE",
           "DECODE_LENGTHS_RULE", "CAND_ORDER_RULE", "RELEASE_RECAPTURE_RULE",
           "BEFORE_CAPTURE_RULE", "rule_parts"]


def _defined(text: str) -> frozenset[str]:
    """The top-level names a generated text defines."""
    out = set()
    for stmt in ast.parse(text).body:
        if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            out.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            out |= {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return frozenset(out)


# What the exported module defines itself: vLLM's mode, the exported batch, the fit rule.
_PROVIDED = frozenset({"CUDAGraphMode", "Batch"}) | _defined(FIT_RULE)


def _generate(parts: tuple[Part, ...]) -> str:
    imports, text = standalone(list(parts), provided=_PROVIDED, annotations=False)
    if imports:  # the exported module's imports are the fit rule's (vllm_fit.FIT_IMPORTS)
        raise StandaloneError(f"{[p.module for p in parts]} now import {imports}; add them to the exported module")
    return text


def rule_parts(pid: str) -> tuple[Part, ...]:
    """The rule property ``pid`` declares (``rule=``), as a part to generate."""
    rule = registered()[pid].rule
    if rule is None:
        raise StandaloneError(f"{pid} declares no rule; the exported test has none to carry")
    return (Part(rule.__module__, (rule.__name__,)),)


ROUNDTRIP_PARTS = rule_parts("DISPATCH-ROUNDTRIP")
ROUNDTRIP_RULE = _generate(ROUNDTRIP_PARTS)

ROUNDTRIP_ADAPTER = '''

# The exported world's side of cgsim's rule above: vLLM's descriptors.
def rank(desc):
    """Dispatch priority: FULL over PIECEWISE over eager (cgsim's RUNTIME_RANK)."""
    return RUNTIME_RANK[desc.cg_mode]


def exact_shape(desc, batch):
    """A graph of exactly the batch's shape: it fits with no padding at all."""
    return fits(desc, batch) and padding_waste(desc, batch) == (0, 0)


def roundtrip_holds(desc, batch, target, captured):
    """cgsim's DISPATCH-ROUNDTRIP rule: ``batch``, of exactly the shape of the
    captured ``target``, goes to a graph dispatch may pick (best_choices), or
    to one it fits of higher priority that pads no token, or of equal priority
    that pads no more."""
    choices = {Descriptor.of(d) for d in best_choices(batch, captured)}
    return roundtrip_ok(Descriptor.of(desc), batch, Descriptor.of(target), LORA_CASES, choices)
'''

SCHEDULER_PARTS = (Part("cgsim.spec.scheduler", ("producible_batches",)),)
SCHEDULER_RULE = _generate(SCHEDULER_PARTS)

SCHEDULER_ADAPTER = '''

# The exported world's side of cgsim's model above: the config as the
# constants above, every query-length partition as the shapes.
class SchedulerLimits(NamedTuple):
    """cgsim's config as its scheduler model reads it."""

    max_num_reqs: int
    num_ubatches: int
    ubatch_threshold: int  # None without DBO (never read then)
    longest_decode_len_for_reqs: dict

    def scheduler_longest_decode_len(self, num_reqs):
        return self.longest_decode_len_for_reqs[min(num_reqs, self.max_num_reqs)]


SCHEDULER = SchedulerLimits(
    MAX_NUM_REQS, NUM_UBATCHES, UBATCH_THRESHOLD, LONGEST_DECODE_LEN_FOR_REQS
)


def _partitions(total, max_parts, largest=None):
    """Query lengths (longest first) of at most ``max_parts`` requests, summing
    to ``total``."""
    largest = total if largest is None else largest
    if total == 0:
        yield ()
        return
    if max_parts == 0:
        return
    for first in range(min(total, largest), 0, -1):
        for rest in _partitions(total - first, max_parts - 1, first):
            yield (first,) + rest


def every_producible_batch():
    """Every batch the scheduler can hand the runner that a graph could fit:
    each query-length partition up to the largest capture size, through
    cgsim's model (producible_batches), per LoRA case and micro-batch count."""
    for num_tokens in range(1, MAX_CAPTURE_SIZE + 1):
        for lens in _partitions(num_tokens, MAX_NUM_REQS):
            for loras in LORA_CASES:
                for ubatches in sorted({1, NUM_UBATCHES}):
                    yield from producible_batches(SCHEDULER, [lens], loras, ubatches)
'''

# DISPATCH-SOUND's second half, whether something runs the graph, is the
# oracle's too: view.py's graph_gap, generated beside the declared rule.
SOUND_PARTS = rule_parts("DISPATCH-SOUND") + (Part("cgsim.properties.view", ("graph_gap",)),)
SOUND_RULE = _generate(SOUND_PARTS)

SOUND_ADAPTER = '''

# The exported world's side of cgsim's rule above: vLLM's descriptors, this
# test's LORA_CASES and doubles.
def sound_fit_holds(desc, batch):
    """cgsim's DISPATCH-SOUND fit rule: an eager ``desc`` keeps every token of
    ``batch``, a graph fits it."""
    return sound_fit(Descriptor.of(desc), batch, lora_case(batch.num_active_loras, LORA_CASES))


def runs_gap(desc, manager, recorder):
    """cgsim's DISPATCH-SOUND runner rule: why nothing runs graph ``desc``
    (None: something does): a FULL graph must be stored, a PIECEWISE one
    captured, and something (the compiled model, breakable graphs) must run
    piecewise graphs."""
    piecewise_runner = COMPILED_MODEL or getattr(manager, "use_breakable_cg", False)
    return graph_gap(desc.cg_mode, desc in manager.graphs, piecewise_runner, desc in recorder.captured(manager))
'''

PRIORITY_RULE = _generate(rule_parts("DISPATCH-PRIORITY"))

PRIORITY_ADAPTER = '''

# The exported world's side of cgsim's rule above: vLLM's descriptors.
def priority_holds(desc, batch, captured):
    """cgsim's DISPATCH-PRIORITY rule: ``desc`` is FULL, or no captured FULL
    graph fits ``batch``."""
    full = fitting(captured, batch, CUDAGraphMode.FULL)
    return priority_ok(Descriptor.of(desc), bool(full))
'''

COMPLETE_RULE = _generate(rule_parts("DISPATCH-COMPLETE"))

COMPLETE_ADAPTER = '''

# The exported world's side of cgsim's rule above: vLLM's descriptors.
def complete_holds(desc, batch, captured):
    """cgsim's DISPATCH-COMPLETE rule: ``desc`` is a graph, or no captured
    graph fits ``batch``."""
    return complete_ok(Descriptor.of(desc), bool(fitting(captured, batch)))
'''

INIT_TOTAL_RULE = _generate(rule_parts("INIT-TOTAL"))

INIT_TOTAL_ADAPTER = '''

# The exported world's side of cgsim's rule above: vLLM's descriptors, this
# test's config.
def insane(desc):
    """cgsim's INIT-TOTAL rule: what is insane about capture descriptor ``desc``."""
    return descriptor_problems(Descriptor.of(desc), DECODE_QUERY_LEN, LORA_CASES, NUM_UBATCHES)
'''

PAD_RULE = _generate(rule_parts("PAD-CONSISTENT"))

PAD_ADAPTER = '''

# The exported world's side of cgsim's rule above: the exported batch.
def metadata_covers(captured_max_query_len, batch):
    """cgsim's PAD-CONSISTENT rule: metadata captured for
    ``captured_max_query_len`` covers ``batch``'s longest request."""
    return covers_query_len(captured_max_query_len, max(batch.query_lens))
'''

# CAPTURE-USEFUL's rule: the exported test asks it of best_choices (the fit
# rule's adapter) for every producible batch; DECODE-LENGTHS': of vLLM's
# descriptors as they are, as CAND-ORDER's (both read only fields every
# release has, and compare descriptors whole).
USEFUL_RULE = _generate(rule_parts("CAPTURE-USEFUL"))
DECODE_LENGTHS_RULE = _generate(rule_parts("DECODE-LENGTHS"))
CAND_ORDER_RULE = _generate(rule_parts("CAND-ORDER"))

# RELEASE-RECAPTURE's and BEFORE-CAPTURE's rules take plain values (a graph
# count, flags): the exported test reads them off vLLM's manager.
RELEASE_RECAPTURE_RULE = _generate(rule_parts("RELEASE-RECAPTURE"))
BEFORE_CAPTURE_RULE = _generate(rule_parts("BEFORE-CAPTURE"))
