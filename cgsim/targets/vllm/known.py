"""The real defects cgsim found in vLLM's CUDA-graph manager (docs/findings.md),
each with the releases it is in and a rule that recognises its findings.

A finding on vLLM is a claim about someone else's code: a campaign labels
each finding with the documented defect it is an instance of, or leaves it
unlabelled (a new defect to document with its cause, or a cgsim bug to fix).
``docs/findings.md`` has each defect's cause in vLLM's code and its replay
commands; the rows here are numbered as there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from cgsim.config import ManagerConfig
from cgsim.descriptors import BatchDescriptor
from cgsim.finding import Finding
from cgsim.modes import CUDAGraphMode
from cgsim.targets.releases import in_range

__all__ = ["KnownDefect", "KNOWN_DEFECTS", "classify", "label", "present_in", "stopped_by"]


@dataclass(frozen=True)
class KnownDefect:
    row: int  # docs/findings.md section
    name: str
    title: str
    first: str  # first release it is in
    fixed: str | None  # first release without it; None: not fixed
    properties: frozenset[str]  # the properties its findings violate
    matches: Callable[[Finding, ManagerConfig], bool]
    # First release in which its documented finding (docs/findings JSON)
    # reproduces, where in the releases before another defect stops that
    # scenario (None: ``first``).  The defect is in the code from ``first``,
    # and other scenarios can show it earlier: other properties, or configs
    # the stopping defect spares (#1 and #6 on 0.25-0.31, where #3 stops
    # only the engines whose draft decode manager captures a graph).
    reachable_from: str | None = None
    # A documented defect whose findings, where both are in a release, look
    # like this one's and have that one's cause there: they are its findings.
    shadowed_by: int | None = None
    # Releases [first, until) where no launch reaches it: vLLM's own config
    # path never gives the manager its config there (docs/findings.md,
    # "Manager-level only"); until None: every release from first.
    manager_level: tuple[tuple[str, str | None], ...] = ()

    def present_in(self, version: str) -> bool:
        return in_range(version, self.first, self.fixed)

    def reachable_in(self, version: str) -> bool:
        """Its documented finding reproduces there, through vLLM's front door."""
        blocked = any(in_range(version, lo, hi) for lo, hi in self.manager_level)
        return self.present_in(version) and not blocked and (
            self.reachable_from is None or in_range(version, self.reachable_from, None))


def _decode_lengths(cfg: ManagerConfig) -> int:
    return len(cfg.scheduler_decode_query_lens())


def _decode_batch(f: Finding) -> bool:
    """A dispatch finding about a pure decode batch (every request of one length)."""
    batch = f.batch
    return batch is not None and batch.uniform_token_count is not None


def _micro_batched(f: Finding) -> bool:
    batch = f.batch
    return batch is not None and batch.num_ubatches > 1


def _fitting_full(f: Finding) -> bool:
    """What a correct dispatcher returns for the batch is a FULL graph."""
    return any(d.cg_mode is CUDAGraphMode.FULL for d in f.expected or ())


def _nearest_group(f: Finding, c: ManagerConfig) -> bool:
    """#1: a decode batch misses a larger FULL graph of its shape because its
    candidates are only the nearest group by token count: one of several
    scheduled lengths (dynamic speculative decoding)."""
    several = c.spec_schedule is not None and _decode_lengths(c) > 1 and not _micro_batched(f)
    return several and _missed_fitting_full(f)


def _micro_batched_nearest_group(f: Finding, c: ManagerConfig) -> bool:
    """#16: the same candidate lists, for a micro-batched decode batch whose
    nearest group holds only twins of mixed descriptors (DBO)."""
    return c.num_ubatches > 1 and _micro_batched(f) and _missed_fitting_full(f)


def _missed_fitting_full(f: Finding) -> bool:
    # The cause of #1 and #16: the fitting graph is not in the manager's
    # candidate list for the batch.  Where the list held one, something else rejected it.
    if f.fact("fit_in_candidates") is True:
        return False
    return _decode_batch(f) and _fitting_full(f)


def _desc(data: dict | None) -> BatchDescriptor | None:
    return BatchDescriptor.from_json(data) if data is not None else None


def _sized(d: BatchDescriptor) -> bool:
    """No count below zero: such a descriptor (#3's draft decode lengths) is no graph of another defect."""
    counts = (d.num_tokens, d.num_reqs, d.uniform_token_count, d.max_query_len, d.num_active_loras, d.num_ubatches)
    return all(n is None or n >= 0 for n in counts)


def _named_graphs(f: Finding) -> list[BatchDescriptor]:
    """The graphs a capture or init finding is about: CAPTURE-USEFUL's useless
    graph, the descriptors CAND-ORDER and INIT-TOTAL name."""
    graph = f.fact("graph")
    if graph is not None:
        return [BatchDescriptor.from_json(graph)]
    return [d for d in map(BatchDescriptor.from_json, f.fact("graphs") or ()) if _sized(d)]


def _names_piecewise(f: Finding) -> bool:
    """The violation names a PIECEWISE graph (dispatched, fitting, captured,
    replayed) or a mode with PIECEWISE graphs."""
    graphs = [f.got, _desc(f.fact("exact")), _desc(f.fact("graph")), *map(_desc, f.fact("graphs") or ())]
    if f.property == "DISPATCH-COMPLETE" and f.expected:
        graphs.append(f.expected[0])  # the best fit it names
    if any(d is not None and d.cg_mode is CUDAGraphMode.PIECEWISE for d in graphs):
        return True
    if any(_has_piecewise(f.fact(k)) for k in ("requested", "routed", "resolved", "spec_mode")):
        return True
    # A config the spec rejects: its reason asks for PIECEWISE or NONE (cgsim.modes.resolve_mode).
    return (f.fact("spec_rejects") is not None or f.fact("forward_mode") == "PIECEWISE"
            or f.fact("path") == "piecewise")


def _has_piecewise(mode: str | None) -> bool:
    try:
        return mode is not None and CUDAGraphMode.parse(mode).has_piecewise()
    except ValueError:
        return False


def _graph_mode(f: Finding) -> CUDAGraphMode | None:
    graph = _desc(f.fact("graph"))
    return graph.cg_mode if graph is not None else None


def _uniforms(f: Finding) -> set[int]:
    return {d.uniform_token_count for d in _named_graphs(f) if d.uniform_token_count is not None}


def _dead_decode_graph(f: Finding, c: ManagerConfig) -> bool:
    """#6: a FULL graph for a scheduled decode length at more requests than
    any batch the schedule gives that length (micro-batched twins of one
    included).  Fewer requests do verify it: a batch that shrank keeps the
    drafts chosen for it (vLLM's scheduler, tests/cgsim/targets/vllm/test_vllm_scheduler.py)."""
    lens = set(c.scheduler_decode_query_lens())
    return c.spec_schedule is not None and bool(_uniforms(f)) and _uniforms(f) <= lens


def _twin_of_mixed(f: Finding, c: ManagerConfig) -> bool:
    """#8: the micro-batched twin of a mixed FULL graph: its uniform count is
    num_tokens / num_reqs, which is no decode length at all."""
    lens = set(c.scheduler_decode_query_lens())
    return c.num_ubatches > 1 and any(d.num_ubatches > 1 for d in _named_graphs(f)) and bool(_uniforms(f) - lens)


def _raised(f: Finding) -> str:
    """What the engine raised (a crash's or a failed build's exception), as its type and text."""
    return f.fact("raised") or ""


def _draft_lengths_not_positive(c: ManagerConfig) -> bool:
    """#3: the draft decode manager (decode_query_len 1) computes its lengths
    as k + 1 - K from the target's schedule: every scheduled k < K gives a
    length of 0 (k = K - 1) or less."""
    return c.spec_schedule is not None and any(k < c.num_speculative_tokens for _, _, k in c.spec_schedule)


def _draft_decode_lengths(f: Finding, c: ManagerConfig) -> bool:
    """#3: the draft decode manager divides by zero building its candidates,
    or builds descriptors of non-positive sizes whose capture trips vLLM's
    assertion in InputBatch.make_dummy; the target then holds graphs although
    capture never finished (BEFORE-CAPTURE)."""
    if not _draft_lengths_not_positive(c):
        return False
    if f.property == "BEFORE-CAPTURE":
        return not _after_release(f)
    # The draft decode manager's own violations, or a build it failed that names it.
    return f.manager == "draft-decode" or "draft decode manager" in _raised(f)


def _after_release(f: Finding) -> bool:
    steps = f.scenario.get("steps", [])
    return any(s.get("kind") == "release" for s in steps[: (f.step or 0) + 1]) or f.fact("swept_after") == "release"


def _uniform_prefill_on_decode_graph(f: Finding, c: ManagerConfig) -> bool:
    """#12: a batch with a prefill whose requests all have the same length
    went to a FULL graph captured for uniform decodes (uniform=...)."""
    got, batch = f.got, f.batch
    if got is None or batch is None:
        return False
    return (batch.has_prefill or _prefill_step(f)) and got.cg_mode is CUDAGraphMode.FULL and got.uniform_token_count is not None


def _cross_mode(f: Finding, c: ManagerConfig) -> bool:
    """#2: graphs of both modes, or a PIECEWISE graph named as dispatched,
    fitting or of the batch's exact shape: only there can one candidate list mix modes."""
    from cgsim.spec.candidates import resolved_mode  # noqa: PLC0415 - the spec, only when asked

    try:
        mode = resolved_mode(c)
        both = mode.has_full() and mode.has_piecewise()
    except Exception:  # noqa: BLE001 - a config the spec cannot resolve: judge by the requested mode
        both = c.mode.value == "FULL_AND_PIECEWISE"
    return both or _names_piecewise(f)


def _prefill_step(f: Finding) -> bool:
    steps = f.scenario.get("steps", [])
    if f.step is not None and 0 <= f.step < len(steps) and steps[f.step].get("batch"):
        return bool(steps[f.step]["batch"].get("has_prefill"))
    return False


KNOWN_DEFECTS: tuple[KnownDefect, ...] = (
    # First: its shape (a prefill on a FULL uniform-decode graph) is specific; #2 and #4 would also match.
    KnownDefect(
        12, "uniform-prefill-on-decode-graph", "uniform prefill batches dispatched to FULL decode graphs",
        "0.20.0", "0.28.0", frozenset({"DISPATCH-SOUND", "DISPATCH-ROUNDTRIP", "DISPATCH-PRIORITY", "DISPATCH-MINIMAL",
                                       "PAD-CONSISTENT", "REPLAY-EQUALS-EAGER"}),
        _uniform_prefill_on_decode_graph,
    ),
    # #1 and #6 need several scheduled decode lengths, so a k < K, which stops
    # the draft decode manager of 0.25-0.31 (#3) in their documented scenarios.
    KnownDefect(
        1, "dynsd-nearest-group", "dynamic speculative decoding: the nearest FULL group lacks the batch's decode length",
        "0.25.0", "0.34.0", frozenset({"DISPATCH-PRIORITY", "DISPATCH-COMPLETE"}), _nearest_group,
        reachable_from="0.32.0",
        # On 0.25-0.28 #2's cross-mode lists lose the same FULL graph (and 0.29,
        # which groups per mode, dispatches those batches to it).
        shadowed_by=2,
    ),
    # Micro-batched graphs need a drafter's K + 1 here, and DBO with speculative
    # decoding is refused before 0.34 (VllmConfig._get_dbo_unsupported_features).
    KnownDefect(
        16, "dbo-nearest-group",
        "micro-batched decode batches: the nearest FULL group holds no micro-batched graph of their shape",
        "0.30.0", None, frozenset({"DISPATCH-PRIORITY", "DISPATCH-COMPLETE"}), _micro_batched_nearest_group,
        manager_level=(("0.30.0", "0.34.0"),),
    ),
    KnownDefect(
        2, "cross-mode-candidates", "candidate lists keyed by the nearest token count over all modes",
        "0.25.0", "0.29.0", frozenset({"DISPATCH-PRIORITY", "DISPATCH-COMPLETE", "DISPATCH-ROUNDTRIP"}),
        _cross_mode,
    ),
    KnownDefect(
        3, "draft-decode-lengths", "the draft decode manager takes the target's dynamic lengths: k = K - 1 divides by "
        "zero, smaller k give graphs of non-positive size whose capture asserts",
        "0.25.0", "0.32.0", frozenset({"INIT-TOTAL", "NO-CRASH", "BEFORE-CAPTURE", "CAND-BOUNDS", "CAND-ORDER",
                                       "DECODE-LENGTHS"}),
        _draft_decode_lengths,
    ),
    KnownDefect(
        4, "capture-max-query-len", "graphs that may replay a prefill captured with the dummy batch's max_query_len",
        "0.20.0", "0.31.0", frozenset({"PAD-CONSISTENT"}),
        lambda f, c: f.fact("mismatch") == "max_query_len" and not _uniform_prefill_on_decode_graph(f, c),
    ),
    KnownDefect(
        5, "raw-schedule-lengths", "decode lengths from the raw schedule entries",
        "0.25.0", "0.29.0", frozenset({"DECODE-LENGTHS", "CAND-ORDER", "CAPTURE-USEFUL"}),
        lambda f, c: c.spec_schedule is not None and (
            f.property == "DECODE-LENGTHS" or bool(_uniforms(f) - set(c.scheduler_decode_query_lens()))),
    ),
    KnownDefect(
        # 0.34 captures each length only up to the most requests it runs at (get_decode_cudagraph_query_lens).
        6, "dynsd-every-length", "dynamic speculative decoding captures every length at every size, also past the most "
        "requests the schedule drafts it at",
        "0.25.0", "0.34.0", frozenset({"CAPTURE-USEFUL", "CAND-ORDER"}), _dead_decode_graph, reachable_from="0.32.0",
    ),
    # Before #7, which takes any failure after a release: this one names the host allocator.
    KnownDefect(
        15, "breakable-recapture-into-host-pool",
        "breakable graphs re-captured into the released global pool without emptying the host cache (torch >= 2.11)",
        "0.32.0", "0.34.0", frozenset({"NO-CRASH"}),
        lambda f, c: c.breakable and _after_release(f) and "CachingHostAllocator" in _raised(f),
    ),
    KnownDefect(
        7, "release-keeps-graphs", "release never reaches the MRV2 manager; the recapture asserts",
        "0.20.0", "0.32.0",
        frozenset({"RELEASE-RECAPTURE", "NO-CRASH", "BEFORE-CAPTURE", "CAPTURE-ONCE", "WARMUP-FIRST"}),
        lambda f, c: f.property == "RELEASE-RECAPTURE" or "already captured" in _raised(f) or _after_release(f),
        # 0.24-0.31: the V2 runner refuses elastic expert parallelism, the only release path.  0.20-0.23:
        # the scale event's switch_and_prepare reads model_runner.input_batch, which the V2 runner lacks,
        # before it captures again (elastic_execute.py): the engine dies of that first.
        manager_level=(("0.20.0", "0.32.0"),),
    ),
    KnownDefect(
        8, "dbo-twin-of-mixed-full", "micro-batched twins of mixed FULL descriptors",
        "0.30.0", None, frozenset({"CAPTURE-USEFUL", "INIT-TOTAL", "CAND-ORDER"}), _twin_of_mixed,
    ),
    # More specific than #9 where both apply (varlen decode forced onto PIECEWISE graphs).
    KnownDefect(
        13, "adaptive-verification-forces-mode", "adaptive verification forces FULL_AND_PIECEWISE over the requested mode",
        "0.28.0", "0.30.0", frozenset({"MODE-RESOLUTION", "CAND-ORDER", "DISPATCH-SOUND", "CAPTURE-USEFUL",
                                       "DISPATCH-COMPLETE"}),
        lambda f, c: c.varlen_decode,
        # SpeculativeConfig refuses adaptive verification outside DSpark there.
        manager_level=(("0.28.0", None),),
    ),
    KnownDefect(
        9, "piecewise-without-runner", "PIECEWISE kept with nothing to run it",
        "0.20.0", "0.30.0", frozenset({"MODE-RESOLUTION", "DISPATCH-SOUND", "CAND-ORDER"}),
        lambda f, c: not c.piecewise_available and _names_piecewise(f),
        # vLLM's config path turns such a mode into NONE before the manager sees it.
        manager_level=(("0.20.0", None),),
    ),
    # Before #10: where both are present (0.21) a draft prefill's graph is #14's.
    KnownDefect(
        14, "draft-prefill-reuses-warmup-metadata",
        "the draft prefill manager warms up and captures its FULL graphs with one attention state",
        "0.21.0", "0.23.0", frozenset({"FRESH-METADATA"}),
        lambda f, c: f.manager == "draft-prefill" and _graph_mode(f) is not None,
    ),
    KnownDefect(
        10, "full-capture-reuses-warmup-metadata", "FULL graphs captured with the warmup's attention metadata",
        "0.20.0", "0.22.0", frozenset({"FRESH-METADATA"}),
        lambda f, c: _graph_mode(f) is CUDAGraphMode.FULL,
    ),
    # vllm PR #53818: torch.cuda.graph without stream= captures on torch's own class-level stream.
    KnownDefect(
        17, "capture-off-warmup-stream",
        "MRV2 captures each graph on torch.cuda.graph's own stream, not the graph_capture() stream its warm-up ran on",
        "0.20.0", "0.29.0", frozenset({"CAPTURE-STREAM-CONSISTENT"}),
        lambda f, c: f.fact("captured_on") is not None,
    ),
    KnownDefect(
        11, "breakable-piecewise-without-metadata", "breakable PIECEWISE graphs captured without attention metadata",
        "0.23.0", "0.26.0", frozenset({"SKIP-ATTN", "REPLAY-EQUALS-EAGER", "FRESH-METADATA", "SERVED-EQUALS-EAGER"}),
        # Served through vLLM's runner (0.23: attention captured as a zero fill), the launch's own tokens differ.
        lambda f, c: c.breakable and (_names_piecewise(f) or (f.property == "SERVED-EQUALS-EAGER"
                                                               and _has_piecewise(c.mode.value))),
    ),
)


def present_in(version: str) -> list[KnownDefect]:
    return [d for d in KNOWN_DEFECTS if d.present_in(version)]


def classify(finding: Finding, version: str | None = None) -> KnownDefect | None:
    """The documented defect this finding is an instance of: among the
    defects of ``version`` (None: of any release), the first that matches."""
    try:
        config = ManagerConfig.from_json(finding.scenario["config"])
    except Exception:  # noqa: BLE001 - an unreadable scenario matches nothing
        return None
    candidates = present_in(version) if version is not None else list(KNOWN_DEFECTS)
    by_row = {d.row: d for d in candidates}
    for d in candidates:
        if finding.property in d.properties and d.matches(finding, config):
            other = by_row.get(d.shadowed_by) if d.shadowed_by is not None and version is not None else None
            if other is not None and finding.property in other.properties and other.matches(finding, config):
                return other
            return d
    return None


# Violations after which a scenario's later steps never ran.
_STOPPING = frozenset({"NO-CRASH", "NO-HANG", "INIT-TOTAL"})


def stopped_by(found: list[Finding], defect: KnownDefect, version: str) -> list[int]:
    """The rows of the other documented defects of ``version`` that stopped a
    scenario (a crash, a hang, a manager that could not be built) before
    ``defect`` could show."""
    rows = {d.row for d in (classify(f, version) for f in found if f.property in _STOPPING) if d is not None}
    return sorted(rows - {defect.row})


def label(finding: Finding, version: str) -> dict:
    """What a campaign writes into a finding's extra: the documented defect of
    ``version`` it is, or that it is none (a new defect, or a cgsim bug)."""
    d = classify(finding, version)
    if d is None:
        return {"known_defect": None}
    fixed = f", fixed in {d.fixed}" if d.fixed else ", not fixed"
    return {"known_defect": d.name,
            "known_defect_doc": f"docs/findings.md #{d.row}: {d.title} (vLLM {d.first}{fixed})"}
