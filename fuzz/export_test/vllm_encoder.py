"""The vLLM encoder writer: a ``vllm-encoder`` finding as a standalone pytest
module that drives vLLM's own ``EncoderCudaGraphManager``
(v1/worker/encoder_cudagraph.py).

The module builds the VllmConfig with vLLM's ``EngineArgs`` from the
finding's launch line (parsed by vLLM's own argument parser, as ``vllm
serve`` parses it; the model a directory holding the config.json of the
architecture cgsim registers, so no weights or tokenizer load), builds the
manager as the model runner does, runs the finding's steps as vLLM's encoder
runner calls the manager (its graphs once captured, the model eagerly when
it hands back nothing) and asserts the violated property in plain code.

What only cgsim has is generated from cgsim's own source
(``standalone``), never retyped: the toy vision encoder that implements the
``SupportsEncoderCudaGraph`` methods the manager calls
(``cgsim/encoder/toy.py`` and what it imports), how cgsim's runner reads the
toy's log and compares outputs (``cgsim/encoder/runner.py``), and the
registration of the toy architecture with vLLM's registries
(``cgsim/targets/vllm/encoder_engine.py``).  What only cgsim's spec can
compute (the plan a design gives the config) is written in as literals.  CUDA
graphs are a CPU double that records the ATen ops a capture runs and runs
them again on replay.  The module imports only vllm, torch, pytest and the
standard library."""

from __future__ import annotations

import json
import os
import re
import textwrap
from typing import Any

from cgsim.encoder.values import EncoderScenario, EncoderScenarioError
from cgsim.finding import Finding
from fuzz.export_test.docs import ExportError
from fuzz.export_test.standalone import Part, standalone

__all__ = [
    "ENCODER_DOC",
    "ENCODER_PROPERTIES_WRITTEN",
    "STANDALONE_PARTS",
    "encoder_defect_doc",
    "write_vllm_encoder_test",
]

ENCODER_DOC = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "encoder.md")
_TOY_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "cgsim", "targets", "vllm", "toy", "vision", "config.json")

# cgsim's code the module carries, generated from its source.
STANDALONE_PARTS = (
    Part("cgsim.encoder.toy", omit=("toy_for",)),  # the test builds its toy from its constants
    Part("cgsim.encoder.values", ("EncoderItem",)),
    Part("cgsim.spec.encoder", ("frame_slots",)),
    Part("cgsim.encoder.runner", ("step_seed", "groups_from_log", "_captures_by_rank", "_compare")),
    Part("cgsim.targets.vllm.encoder_engine", ("register_toy_vision_model",)),
)

ENCODER_PROPERTIES_WRITTEN = ("ENC-PLAN", "ENC-CAPTURED", "ENC-CAPTURE-ONCE", "ENC-FIT", "ENC-MINIMAL", "ENC-COMPLETE",
                              "ENC-COVER", "ENC-ONE-REPLAY", "ENC-EQUAL", "ENC-STABLE", "ENC-UNCAPTURED",
                              "ENC-NO-CRASH")


def _wrap(text: str, indent: str = "", width: int = 79) -> str:
    return textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False)


def encoder_defect_doc(defect: str, path: str = ENCODER_DOC) -> tuple[str, str, tuple[str, ...]]:
    """(the releases and what happens, as docs/encoder.md's table gives
    ``defect``, the paragraphs explaining it); ("", "", ()) where the file
    or the defect is absent."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return "", "", ()
    releases = what = ""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|") and cells and cells[0] == defect and len(cells) > 3:
            releases, what = cells[1], cells[3].replace("`", "")
    paras = [p.strip() for p in re.split(r"\n\s*\n", text)]
    start = next((i for i, p in enumerate(paras) if p.startswith(f"**{defect}.**")), None)
    if start is None:
        return releases, what, ()
    cause = [paras[start].replace(f"**{defect}.**", "", 1).strip()]
    for p in paras[start + 1:]:
        if p.startswith(("**", "#", "|")):
            break
        cause.append(p)
    return releases, what, tuple(" ".join(p.split()) for p in cause)


# --------------------------------------------------------------------------------------------------
# The fixed parts of the module (``<<name>>``: filled by the writer)
# --------------------------------------------------------------------------------------------------

_HARNESS = '''
def launch_engine_args(model_dir):
    """The launch line's environment, and its engine arguments as vLLM's own
    argument parser reads them (as ``vllm serve`` does), for the model in
    ``model_dir`` instead of the checkpoint: no weights, no tokenizer."""
    words = shlex.split(LAUNCH)
    env = {}
    while "=" in words[0]:
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    assert words[:2] == ["vllm", "serve"], LAUNCH
    argv = ["--model", str(model_dir), *words[3:], "--skip-tokenizer-init", "--load-format", "dummy"]
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    return env, EngineArgs.from_cli_args(parser.parse_args(argv))


def clear_envs_cache():
    """vLLM may cache what it read from the environment."""
    getter = getattr(importlib.import_module("vllm.envs"), "__getattr__", None)
    if hasattr(getter, "cache_clear"):
        getter.cache_clear()


@pytest.fixture
def vllm_config(tmp_path, monkeypatch):
    """The VllmConfig vLLM's EngineArgs build from the launch."""
    register_toy_vision_model()
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    env, engine_args = launch_engine_args(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    clear_envs_cache()
    # The launch is for a GPU, which has Triton; vLLM's check for the V2 model
    # runner (config/vllm.py) would refuse it on a CPU host without triton-cpu.
    config_module = importlib.import_module("vllm.config.vllm")
    if hasattr(config_module, "HAS_TRITON"):
        monkeypatch.setattr(config_module, "HAS_TRITON", True)
    try:
        yield engine_args.create_engine_config()
    finally:
        clear_envs_cache()


class CpuGraph:
    """torch.cuda.CUDAGraph on CPU: a capture (``cpu_graph_capture``) records
    the ATen ops it runs with the tensors they ran on and produced; replay()
    runs them again in order and writes each result where the capture's
    result lives, as a CUDA graph replays its kernels on the memory they were
    captured with (so what the replay reads is whatever the buffers hold)."""

    def __init__(self, *args, **kwargs):
        self.ops = []

    def replay(self):
        with torch.inference_mode():
            for func, args, kwargs, out in self.ops:
                write_back(out, func(*args, **kwargs))


def write_back(out, result):
    if isinstance(out, torch.Tensor) and isinstance(result, torch.Tensor):
        # A view or an in-place op wrote into the captured memory already.
        if out.untyped_storage().data_ptr() != result.untyped_storage().data_ptr():
            out.copy_(result)
    elif isinstance(out, (tuple, list)):
        for o, r in zip(out, result):
            write_back(o, r)


class Recording(TorchDispatchMode):
    def __init__(self, graph):
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.graph.ops.append((func, args, kwargs, out))
        return out


@contextlib.contextmanager
def cpu_graph_capture(graph, pool=None, stream=None, **kwargs):
    with Recording(graph):
        yield


@pytest.fixture
def cpu_graphs(monkeypatch):
    """CUDA graphs on CPU; the manager captures on the current stream."""
    monkeypatch.setattr(torch.cuda, "CUDAGraph", CpuGraph)
    monkeypatch.setattr(torch.cuda, "graph", cpu_graph_capture)
    # 0.30+ hands torch.cuda.graph the current stream; the CPU double takes none.
    monkeypatch.setattr(encoder_cudagraph, "current_stream", lambda: None, raising=False)


def build_manager(vllm_config):
    """The toy encoder, answering the manager what Qwen2.5-VL answers (its
    largest budget: max_num_batched_tokens, at most max_model_len), and
    vLLM's manager built from the config as the model runner builds it."""
    mm_config = vllm_config.model_config.multimodal_config
    classes = EncoderClasses(
        item_spec=EncoderItemSpec,
        capture_inputs=EncoderCudaGraphCaptureInputs,
        replay_buffers=EncoderCudaGraphReplayBuffers,
        graph_config=EncoderCudaGraphConfig,
    )
    model = ToyVisionEncoder(
        min_budget=MIN_BUDGET,
        max_budget=min(
            vllm_config.scheduler_config.max_num_batched_tokens,
            vllm_config.model_config.max_model_len,
        ),
        max_frames_per_video=MAX_FRAMES_PER_VIDEO,
        device=torch.device("cpu"),
        classes=classes,
        video=mm_config.get_limit_per_prompt("video") != 0,
        seed=SEED,
    )
    manager = encoder_cudagraph.EncoderCudaGraphManager(
        vllm_config=vllm_config,
        device=torch.device("cpu"),
        dtype=torch.float32,
        model=model,
    )
    return manager, model


def encode(manager, model, mm_kwargs):
    """A batch as vLLM's encoder runner encodes it: through the manager once
    it has captured, eagerly through the model when it hands back nothing."""
    outputs = manager.execute(mm_kwargs) if manager.is_captured() else None
    if outputs is None:
        outputs = model.embed_multimodal(**mm_kwargs)
    return list(outputs)


class Run:
    """What the steps did, in order."""

    def __init__(self):
        self.captures = []  # (step, the budgets capture inputs were asked for in order, is_captured())
        self.captured_for = {}  # budget -> (max_batch_size, max_frames_per_batch) it was captured for
        self.captured_at = {}  # step -> the budgets captured and not cleared when it ran
        self.clears = []  # (step, is_captured() afterwards)
        self.groups = []  # EncGroup: items encoded together, the budget replayed (None: eagerly)
        self.counts = []  # (step, outputs handed back, items)
        self.outputs = []  # (step, item, output, the item encoded alone, equal then, why not)
        self.error = None  # (step, kind, the exception that ended the run)

    def fits(self, group, budget):
        """Whether ``group`` fits the graph of ``budget`` as it was captured
        (its per-frame buffer sized by the model's frame_slots)."""
        max_batch_size, max_frames = self.captured_for[budget]
        slots = frame_slots(max_batch_size, max_frames)
        return group.tokens <= budget and len(group.ids) <= max_batch_size and group.frames <= slots

    def capacity(self, budget):
        max_batch_size, max_frames = self.captured_for.get(budget, (None, None))
        if max_batch_size is None:
            return "never captured"
        return f"max {max_batch_size} items, {frame_slots(max_batch_size, max_frames)} frames"


def run_steps(manager, model):
    run = Run()
    captured = ()
    for step, (kind, items) in enumerate(STEPS):
        run.captured_at[step] = captured
        model.log.clear()
        batch = [EncoderItem(*item) for item in items]
        try:
            if kind == "capture":
                manager.capture(graph_pool=object())
                budgets = dict(_captures_by_rank(model.log))[0]
                run.captures.append((step, budgets, manager.is_captured()))
                for entry in model.log:
                    if entry[0] == "capture_inputs":
                        run.captured_for[entry[1]] = (entry[2], entry[3])
                captured = tuple(sorted(set(budgets)))
            elif kind == "clear":
                manager.clear()
                run.clears.append((step, manager.is_captured()))
                captured = ()
            else:
                # The batch's inputs as cgsim drew them for this step.
                mm_kwargs = model.inputs(batch, seed=step_seed(SEED, step))
                alone = model.reference(mm_kwargs)
                model.log.clear()
                outputs = encode(manager, model, mm_kwargs)
                run.groups += groups_from_log(step, model.log, batch)
                run.counts.append((step, len(outputs), len(batch)))
                for item, (out, ref) in enumerate(zip(outputs, alone)):
                    run.outputs.append((step, item, out, ref, *_compare(out, ref)))
        except Exception as exc:  # noqa: BLE001 - the run ends; the test judges it
            if kind == "encode":
                run.groups += groups_from_log(step, model.log, batch)
            run.error = (step, kind, exc)
            break
    return run


def raised(run):
    step, kind, exc = run.error
    return f"step {step} ({kind}) raised {type(exc).__name__}: {exc}"
'''

_CHECKS = {
    "ENC-PLAN": '''
    # The plan cgsim's spec gives the config (design <<ruleset>>).
    got = (sorted(set(manager.token_budgets)), manager.max_batch_size, manager.max_frames_per_batch)
    expected = (EXPECTED_BUDGETS, EXPECTED_MAX_BATCH_SIZE, EXPECTED_MAX_FRAMES_PER_BATCH)
    assert got == expected, (
        f"ENC-PLAN: the manager plans budgets {got[0]}, {got[1]} items per graph, "
        f"{got[2]} frames per batch; expected {expected[0]}, {expected[1]}, {expected[2]}"
    )''',
    "ENC-CAPTURED": '''
    for step, budgets, captured in run.captures:
        assert sorted(set(budgets)) == EXPECTED_BUDGETS and captured, (
            f"ENC-CAPTURED: step {step} captured budgets {sorted(set(budgets))} "
            f"(is_captured {captured}), expected {EXPECTED_BUDGETS}"
        )''',
    "ENC-CAPTURE-ONCE": '''
    for step, budgets, _ in run.captures:
        twice = sorted({b for b in budgets if budgets.count(b) > 1})
        assert not twice, (
            f"ENC-CAPTURE-ONCE: step {step} captured budgets {twice} more than once "
            f"(capture inputs asked for, in order: {list(budgets)})"
        )''',
    "ENC-FIT": '''
    for g in run.groups:
        if g.budget is None:
            continue
        assert g.budget in run.captured_for and run.fits(g, g.budget), (
            f"ENC-FIT: step {g.step}: items {list(g.ids)} ({g.tokens} tokens, {len(g.ids)} "
            f"items, {g.frames} frames) replayed the graph of budget {g.budget} "
            f"({run.capacity(g.budget)})"
        )''',
    "ENC-MINIMAL": '''
    for g in run.groups:
        if g.budget is None:
            continue
        fitting = [b for b in run.captured_at[g.step] if run.fits(g, b)]
        assert not fitting or g.budget == min(fitting), (
            f"ENC-MINIMAL: step {g.step}: items {list(g.ids)} ({g.tokens} tokens) replayed "
            f"budget {g.budget}; the smallest that fits is {min(fitting)}"
        )''',
    "ENC-COMPLETE": '''
    for g in run.groups:
        if g.budget is not None or g.site != "manager":
            continue
        fitting = [b for b in run.captured_at[g.step] if run.fits(g, b)]
        assert not fitting, (
            f"ENC-COMPLETE: step {g.step}: items {list(g.ids)} ({g.tokens} tokens, "
            f"{len(g.ids)} items, {g.frames} frames) ran eagerly; the graph of budget "
            f"{min(fitting)} fits them"
        )''',
    "ENC-COVER": '''
    failed = run.error[0] if run.error else None
    for step, (kind, items) in enumerate(STEPS):
        if kind != "encode" or step == failed or step not in run.captured_at:
            continue
        seen = sorted(i for g in run.groups if g.step == step for i in g.ids)
        assert seen == list(range(len(items))), (
            f"ENC-COVER: step {step}: items encoded {seen} for a batch of {len(items)}"
        )''',
    "ENC-ONE-REPLAY": '''
    # Design <<ruleset>> replays a batch once (or runs it eagerly).
    for step in sorted({g.step for g in run.groups}):
        groups = [list(g.ids) for g in run.groups if g.step == step and g.site == "manager"]
        assert len(groups) <= 1, f"ENC-ONE-REPLAY: step {step}: {len(groups)} groups: {groups}"''',
    "ENC-EQUAL": '''
    for step, outputs, items in run.counts:
        assert outputs == items, f"ENC-EQUAL: step {step}: {outputs} outputs for {items} items"
    for step, item, out, ref, equal, why in run.outputs:
        assert equal, f"ENC-EQUAL: step {step}, item {item}: {why}"''',
    "ENC-STABLE": '''
    for step, item, out, ref, equal, why in run.outputs:
        if equal:
            still, why_not = _compare(out, ref)
            assert still, (
                f"ENC-STABLE: step {step}, item {item}'s output changed after its step: {why_not}"
            )''',
    "ENC-UNCAPTURED": '''
    for step, captured in run.clears:
        assert not captured, f"ENC-UNCAPTURED: step {step}: is_captured() is True after clear()"
    for g in run.groups:
        assert g.budget is None or run.captured_at[g.step], (
            f"ENC-UNCAPTURED: step {g.step}: items {list(g.ids)} replayed budget {g.budget} "
            "with no graph captured"
        )''',
    "ENC-NO-CRASH": '''
    assert run.error is None, f"ENC-NO-CRASH: {raised(run)}"''',
}


class _EncoderWriter:
    def __init__(self, finding: Finding, source: str | None):
        self.f = finding
        self.source = source
        if finding.property not in _CHECKS:
            raise ExportError(f"finding {finding.id} violates {finding.property}, which export-test cannot write as "
                              f"a vLLM encoder test yet; it writes: {', '.join(ENCODER_PROPERTIES_WRITTEN)}")
        try:
            self.scenario = EncoderScenario.from_json(dict(finding.scenario))
        except EncoderScenarioError as exc:
            raise ExportError(f"finding {finding.id} has no replayable encoder scenario: {exc}") from None
        launch = finding.extra.get("launch")
        self.launch = launch.get("line") if isinstance(launch, dict) else None
        if not self.launch or " vllm serve " not in f" {self.launch} ":
            raise ExportError(f"finding {finding.id} records no vllm serve launch line; replay it with python -m fuzz "
                              "replay (or its repro script)")
        if finding.property == "ENC-ONE-REPLAY":
            from cgsim.spec.encoder import design

            if design(self.scenario.ruleset).packing != "single":
                raise ExportError(f"finding {finding.id} asserts ENC-ONE-REPLAY under design {self.scenario.ruleset}, "
                                  "which packs a batch into several groups: nothing to write")
        if self.scenario.config.use_dp:
            raise ExportError(f"finding {finding.id} runs the encoder data-parallel over {self.scenario.config.tp_size} "
                              "ranks, which needs vLLM's tensor-parallel group; export-test writes one-rank tests: "
                              "replay it with python -m fuzz replay (or its repro script)")

    def write(self) -> str:
        imports, toy = standalone(list(STANDALONE_PARTS))
        blocks = [
            self._docstring(),
            self._imports(imports),
            "pytestmark = pytest.mark.cpu_test",
            self._constants(),
            "# ---- cgsim's code, generated from its source by export-test (not retyped) ----\n" + toy.strip("\n"),
            "# ---- the test's own harness ----\n" + _HARNESS.strip("\n"),
            self._test_function(),
        ]
        return "\n\n\n".join(b.strip("\n") for b in blocks if b) + "\n"

    def _docstring(self) -> str:
        f = self.f
        defect = f.extra.get("known_defect")
        lines = [f'"""cgsim finding {f.id}: an {f.property} regression test for vLLM\'s', "EncoderCudaGraphManager.", ""]
        releases, what, cause = encoder_defect_doc(defect) if defect else ("", "", ())
        if defect:
            lines += [_wrap(f"docs/encoder.md {defect}" + (f" (vLLM {releases})" if releases else "")
                            + (f": {what}." if what else ".")), ""]
        lines += [_wrap(f"Property {f.property}: {f.statement}."), ""]
        lines += [_wrap(f"What cgsim saw (ruleset {self.scenario.ruleset}): {f.message}"), ""]
        lines += [_wrap(f"The finding's steps: {'; '.join(s.short() for s in self.scenario.steps)}."), ""]
        lines += ["Reached by (the launch a user types; vLLM's own EngineArgs build the", "VllmConfig from it):", "",
                  *_wrap(self.launch, "    ").splitlines(), ""]
        if cause:
            lines += ["Cause in vLLM's code (docs/encoder.md):", ""]
            for p in cause:
                lines += [_wrap(p, "    "), ""]
        elif not defect:
            lines += [_wrap("Not documented in cgsim's docs/encoder.md: its cause in vLLM's code is still to be "
                            "established."), ""]
        lines += [_wrap(
            "The test builds the VllmConfig from the launch line with vLLM's EngineArgs, vLLM's real "
            "EncoderCudaGraphManager from it as the model runner does, runs the finding's steps as vLLM's encoder "
            "runner calls the manager and asserts the property in plain code.  The model is cgsim's toy vision "
            "encoder (the SupportsEncoderCudaGraph methods the manager calls, Qwen-VL's buffer layout), generated "
            "with what cgsim's runner reads off it from cgsim's own source; CUDA graphs are a CPU double that "
            "replays the ops its capture recorded.  It imports only vllm, torch, pytest and the standard "
            "library."), ""]
        lines += ["Written by cgsim:", f"    python -m fuzz export-test {self.source or f.id + '.json'}", '"""']
        return "# SPDX-License-Identifier: Apache-2.0\n" + "\n".join(lines)

    def _imports(self, toy_imports: list[str]) -> str:
        std = {"import contextlib", "import importlib", "import json", "import shlex"}
        third = {"import pytest", "import torch", "from torch.utils._python_dispatch import TorchDispatchMode"}
        for line in toy_imports:
            top = line.split()[1].split(".")[0]
            (third if top in ("torch", "vllm", "pytest") else std).add(line)
        vllm = ["from vllm.engine.arg_utils import EngineArgs",
                "from vllm.utils.argparse_utils import FlexibleArgumentParser",
                "from vllm.v1.worker import encoder_cudagraph",
                ("from vllm.v1.worker.encoder_cudagraph_defs import (\n    EncoderCudaGraphCaptureInputs,\n"
                "    EncoderCudaGraphConfig,\n    EncoderCudaGraphReplayBuffers,\n    EncoderItemSpec,\n)")]

        def key(line: str) -> tuple:
            return (line.startswith("from"), line)

        # The steps run as vLLM's V2 encoder runner calls the manager (is_captured(), 0.28+); the V1 runner
        # before builds and asks it otherwise, which this module does not imitate.
        guard = ("\n\nif not hasattr(encoder_cudagraph.EncoderCudaGraphManager, \"is_captured\"):\n"
                 "    pytest.skip(\n        \"calls the encoder manager as vLLM's V2 encoder runner does (vLLM 0.28+)\",\n"
                 "        allow_module_level=True,\n    )")
        return ("from __future__ import annotations\n\n" + "\n".join(sorted(std, key=key)) + "\n\n"
                + "\n".join(sorted(third, key=key)) + "\n\n" + "\n".join(vllm) + guard)

    def _constants(self) -> str:
        c, sc = self.scenario.config, self.scenario
        with open(_TOY_CONFIG, encoding="utf-8") as fh:
            model_config = json.load(fh)
        lines = ["# The finding: its launch line, and what the model answers that is not a setting.",
                 f"LAUNCH = {self.launch!r}",
                 "# The model directory's config.json: Qwen2.5-VL-7B's language model as a plain qwen2",
                 "# config, for cgsim's toy vision architecture (registered below).",
                 "MODEL_CONFIG = " + _literal(model_config),
                 f"MIN_BUDGET = {c.min_budget}  # the model's smallest encoder budget (tokens of its smallest item)",
                 f"MAX_FRAMES_PER_VIDEO = {c.max_frames_per_video}",
                 f"SEED = {sc.seed}  # the toy's weights and inputs",
                 "# The steps; an encode step's items are (frames, height, width, video) patch grids.",
                 "STEPS = ["]
        for s in sc.steps:
            items = [tuple(i.to_json()) for i in s.items]
            lines.append(f"    ({s.kind!r}, {items!r}),")
        lines.append("]")
        if self.f.property in ("ENC-PLAN", "ENC-CAPTURED"):
            from cgsim.spec.encoder import plan

            p = plan(c, sc.ruleset)
            lines += [f"# The plan cgsim's spec gives the config built from the launch (design {sc.ruleset}).",
                      f"EXPECTED_BUDGETS = {list(p.budgets)}",
                      f"EXPECTED_MAX_BATCH_SIZE = {p.max_batch_size}",
                      f"EXPECTED_MAX_FRAMES_PER_BATCH = {p.max_frames_per_batch}"]
        return "\n".join(lines)

    def _test_function(self) -> str:
        f = self.f
        name = "test_" + re.sub(r"[^a-z0-9]+", "_", f.id.lower())
        doc = _wrap(f.statement[:1].upper() + f.statement[1:] + ".", "    ", width=84).strip()
        check = _CHECKS[f.property].replace("<<ruleset>>", self.scenario.ruleset).strip("\n")
        lines = [f"def {name}(vllm_config, cpu_graphs):", f'    """{doc}"""',
                 "    manager, model = build_manager(vllm_config)",
                 "    run = run_steps(manager, model)", check]
        if f.property != "ENC-NO-CRASH":
            lines += ["    # The property held; a run that raised is still no pass.",
                      "    if run.error is not None:",
                      "        raise run.error[2]"]
        return "\n".join(lines)


def _literal(value: dict) -> str:
    """A dict as Python, one key a line."""
    return "{\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in value.items()) + "}"


def write_vllm_encoder_test(finding: Finding, source: str | None = None, doc: Any = None) -> str:
    """The test module for a ``vllm-encoder`` finding (ExportError where it
    cannot be written); ``doc``, docs/findings.md's row, is none of its (its
    defects are docs/encoder.md's)."""
    return _EncoderWriter(finding, source).write()
