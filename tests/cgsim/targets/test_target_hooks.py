"""Engines behind the target interface: optional hooks as typed members of a
target by role (``cgsim.targets.base``: drawing, triage, tooling), checked
when the registry creates a target, never fetched by name (a scan); what a
family declares beside its targets (source option, pytest adapter); and a
scan of the source tree that no generic module compares a string with an
engine's name."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from cgsim.targets import registry
from cgsim.targets.base import (ENCODER_HOOKS, TARGET_HOOKS, Drawing, PytestAdapter, SourceOption,
                                TargetEnvironmentError, Tooling, Triage, hook_fields)
from cgsim.targets.registry import TargetFamily, families, get_target, source_options
from tests.source_trees import parsed_modules, string_literals

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


# -- hooks -----------------------------------------------------------------------------------


class _Bare:
    name = "bare"
    capabilities = frozenset({"mock"})


class _Plain(_Bare):
    name = "plain"
    drawing, triage, tooling = Drawing(), Triage(), Tooling()


def _serve_without_requests(config):  # declared as serve(config, requests)
    return (), None


class _WrongArity(_Plain):
    name = "wrong-arity"
    drawing = Drawing(serve=_serve_without_requests)


class _NotCallable(_Plain):
    name = "not-callable"
    triage = Triage(classify={"known_defect": "x"})


class _HalfCoverage(_Plain):
    name = "half-coverage"
    tooling = Tooling(coverage_start=lambda data_dir: None)  # without coverage_report


class _Untyped(_Plain):
    name = "untyped"
    drawing = {"serve": _serve_without_requests}  # a role is its typed value, not a table of names


def _doctor(findings_dir=None, progress=None, announce=None):
    return "", [], None


class _Keywords(_Plain):
    name = "keywords"
    tooling = Tooling(doctor=_doctor)


def _with_family(monkeypatch, cls) -> None:
    fam = TargetFamily(cls.name, "a test target", lambda _variant: cls())
    monkeypatch.setattr(registry, "families", lambda: {cls.name: fam})


@pytest.mark.parametrize("cls, says", [
    (_WrongArity, r"^target wrong-arity: optional hook drawing.serve cannot be called with 2 argument\(s\) .*"
                  r"declared as drawing.serve\(config, requests\)"),
    (_NotCallable, r"^target not-callable: optional hook triage.classify is a dict, not callable"),
    (_HalfCoverage, r"^target half-coverage: optional hook tooling.coverage_start comes without "
                    r"tooling.coverage_report"),
    (_Untyped, r"^target untyped: its drawing is a dict, not a cgsim.targets.base.Drawing"),
    (_Bare, r"^target bare: its drawing is a NoneType, not a cgsim.targets.base.Drawing"),
])
def test_a_target_whose_hooks_are_not_as_declared_is_one_line_when_the_registry_creates_it(monkeypatch, cls, says):
    _with_family(monkeypatch, cls)
    with pytest.raises(TargetEnvironmentError) as exc:
        get_target(cls.name)
    assert "\n" not in str(exc.value)
    assert re.search(says, str(exc.value)), str(exc.value)


def test_hooks_defined_as_declared_pass_and_keyword_hooks_are_bound_by_name(monkeypatch):
    for cls in (_Plain, _Keywords):
        _with_family(monkeypatch, cls)
        assert isinstance(get_target(cls.name), cls)
    assert _Keywords().tooling.doctor is _doctor and _Plain().tooling.doctor is None


def test_a_misspelt_hook_is_an_error_so_a_typo_cannot_switch_a_hook_off():
    with pytest.raises(TypeError, match="serv"):
        Drawing(serv=_serve_without_requests)  # type: ignore[call-arg]
    with pytest.raises(AttributeError, match="serv"):
        Drawing().serv  # type: ignore[attr-defined]  # noqa: B018


def test_every_declared_hook_says_what_it_does_and_how_it_is_called():
    for hooks in (TARGET_HOOKS, ENCODER_HOOKS):
        for _member, role in hooks.roles:
            for name, declared in hook_fields(role).items():
                assert declared.does and declared.call_text(name).startswith(f"{name}("), (role, name)
                assert set(declared.needs) <= set(hook_fields(role)), (role, name)


def _one_of_each_family() -> list[str]:
    out = []
    for fam in families().values():
        variants = fam.variants()
        out.append(f"{fam.name}:{sorted(variants)[0]}" if variants else fam.name)
    return out


@pytest.mark.parametrize("name", _one_of_each_family())
def test_every_registered_target_defines_its_hooks_as_declared(name):
    target = get_target(name)  # checks TARGET_HOOKS
    TARGET_HOOKS.check(target)


# Public attributes of cgsim's targets beside the contract.
NOT_HOOKS = {
    "engine": "the engine whose designs a target follows (read by registry.target_engine)",
    "manager_class": "the reference target's manager class (a mutant's subclass)",
    "caps": "the vLLM target's capabilities of the tree here",
    "ruleset": "the vLLM target's ruleset of the tree here (SPEC section 3)",
}


def _defined(hooks, target) -> set[str]:
    return {f"{member}.{name}" for member, role in hooks.roles for name in hook_fields(role)
            if getattr(getattr(target, member), name) is not None}


def _declared(hooks) -> set[str]:
    return {f"{member}.{name}" for member, role in hooks.roles for name in hook_fields(role)}


def _contract(name: str) -> set[str]:
    """The public names of the contract a target's family holds it to."""
    from cgsim.encoder.targets import EncoderTarget
    from cgsim.targets.base import Target
    from cgsim.targets.registry import family_of_target_name

    protocol = EncoderTarget if family_of_target_name(name).capture_family == "encoder" else Target
    return {n for n in dir(protocol) if not n.startswith("_")}


def test_hooks_live_in_the_roles_and_every_declared_hook_is_defined_somewhere():
    """A target's public methods are its family's contract: a hook is reached
    through its role, never as a method beside it; and no declared hook is dead."""
    from cgsim.targets.registry import family_of_target_name

    defined: set[str] = set()
    declared: set[str] = set()
    for name in _one_of_each_family():
        t = get_target(name)
        public = {n for n in dir(type(t)) if not n.startswith("_") and callable(getattr(type(t), n, None))}
        beside = public - _contract(name) - set(NOT_HOOKS)
        assert not beside, f"{name} defines {sorted(beside)}: put a hook into its role (drawing, triage, tooling)"
        hooks = family_of_target_name(name).hooks
        hooks.check(t)
        defined |= _defined(hooks, t)
        declared |= _declared(hooks)
    assert defined == declared, f"declared but defined by no target: {sorted(declared - defined)}"


# -- no module fetches a hook by its name --------------------------------------------------------

HOOK_NAMES = frozenset(name for hooks in (TARGET_HOOKS, ENCODER_HOOKS) for _member, role in hooks.roles
                       for name in hook_fields(role))
BY_NAME = ("getattr", "hasattr", "optional_hook")


def hooks_fetched_by_name(root: str) -> list[tuple[str, int, str]]:
    """(path, line, what) of each ``getattr``/``hasattr`` (or a lookup
    helper named ``optional_hook``) given a hook's name as a string, in the
    cgsim and fuzz modules."""
    out = []
    for rel, tree in parsed_modules(root):
        for node in ast.walk(tree):
            if isinstance(node, (ast.Name, ast.Attribute)) and "optional_hook" in (
                    getattr(node, "id", None), getattr(node, "attr", None)):
                out.append((rel, node.lineno, "optional_hook"))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BY_NAME:
                out += [(rel, node.lineno, f"{node.func.id}(..., {a.value!r})") for a in node.args
                        if isinstance(a, ast.Constant) and a.value in HOOK_NAMES]
    return out


def test_no_module_fetches_a_hook_by_its_name():
    found = [f"{path}:{line}: {what}" for path, line, what in hooks_fetched_by_name(ROOT)]
    assert not found, "a hook fetched by name (read it from the target's role: target.triage.classify):\n" + (
        "\n".join(found))


@pytest.mark.parametrize("code", [
    'serve = optional_hook(target, "serve_scenarios")\n',
    'classify = getattr(target, "classify", None)\n',
    'if hasattr(target, "self_check"):\n    pass\n',
])
def test_the_hook_scan_finds_the_lookups_by_name_generic_code_used_to_make(tmp_path, code):
    (tmp_path / "fuzz").mkdir()
    (tmp_path / "fuzz" / "generic.py").write_text(code)
    assert {p for p, _, _ in hooks_fetched_by_name(str(tmp_path))} == {"fuzz/generic.py"}


# -- what a family declares ------------------------------------------------------------------


def test_a_family_declaring_the_wrong_kind_of_value_is_named_and_not_loaded():
    fam = TargetFamily("odd", "x", lambda _v: _Plain(), source="--odd-source")  # type: ignore[arg-type]
    assert fam.declaration_problem() == "its source is a str, not a cgsim.targets.base.SourceOption"
    assert TargetFamily("ok", "x", lambda _v: _Plain()).declaration_problem() is None


def test_source_options_keep_the_flags_environment_and_finding_keys_users_know():
    by_flag = {o.flag: o for o in source_options()}
    assert set(by_flag) == {"--vllm-source", "--sglang-source"}
    vllm = by_flag["--vllm-source"]
    assert (vllm.env, vllm.recorded_as, vllm.commit_key, vllm.pytest_flag) == (
        "CGSIM_VLLM_SOURCE", "vllm_source", "vllm_source_commit", "--cgsim-vllm-source")
    assert by_flag["--sglang-source"].env == "CGSIM_SGLANG_SOURCE"
    assert all(isinstance(o, SourceOption) for o in source_options())


def test_every_command_that_runs_a_target_takes_each_source_option():
    from fuzz.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    for command in ("run", "replay", "doctor"):
        flags = {s for a in sub[command]._actions for s in a.option_strings}
        assert {o.flag for o in source_options()} <= flags, command


def test_an_empty_source_option_is_one_line_naming_what_to_give(capsys):
    from fuzz.cli import main

    assert main(["replay", "x.json", "--sglang-source", " "]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --sglang-source is empty; give an sglang checkout or an unpacked sglang wheel")


def _repro(tmp_path, extra: dict) -> str:
    from cgsim.config import ManagerConfig
    from cgsim.finding import Finding
    from cgsim.report.repro import render_repro
    from cgsim.scenario import Scenario, Step

    scenario = Scenario(ManagerConfig(capture_sizes=(1, 2)), (Step.capture(),)).to_json()
    finding = Finding(property="NO-CRASH", message="m", target="no-such-target", backend="mock", scenario=scenario,
                      extra=extra)
    path = tmp_path / "repro_f.py"
    path.write_text(render_repro(finding))
    return str(path)


def _run(path: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {o.env for o in source_options()}}
    return subprocess.run([sys.executable, path, *args], capture_output=True, text=True, timeout=120,
                          env={**clean, "PYTHONPATH": ROOT, **env})


@pytest.mark.slow
def test_a_repro_script_takes_each_source_option_and_replays_on_the_recorded_tree(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    path = _repro(tmp_path, {"vllm_source": str(tree), "vllm_source_commit": "abc"})
    assert all(o.flag in _run(path, "--help").stdout for o in source_options())
    out = _run(path).stdout
    assert f"using the vLLM source tree the finding was found on: {tree} (commit abc)" in out
    # The flag and the environment variable each override the recorded tree.
    assert "using the vLLM" not in _run(path, "--vllm-source", str(tmp_path)).stdout
    assert "using the vLLM" not in _run(path, CGSIM_VLLM_SOURCE=str(tmp_path)).stdout


def test_a_repro_script_puts_a_given_source_tree_into_the_environment(tmp_path, monkeypatch):
    import importlib.util

    path = _repro(tmp_path, {})
    spec = importlib.util.spec_from_file_location("repro_f", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.chdir(tmp_path)
    for option in source_options():
        # setenv records what was there (delenv of an absent variable records nothing), so teardown restores it.
        monkeypatch.setenv(option.env, "recorded")
        monkeypatch.delenv(option.env)
        module.main([option.flag, "some-tree"])  # the target does not exist: exit 2 after the option is applied
        assert os.environ.pop(option.env) == str(tmp_path / "some-tree")


def test_the_mock_engine_adapters_come_from_the_families_and_restate_the_targets_patch_rows():
    from cgsim.targets.registry import mock_engine_adapters
    from cgsim.targets.vllm.compat import PATCHES, SESSION_PATCHES

    adapters = mock_engine_adapters()
    assert set(adapters) == {"vllm"} and all(isinstance(a, PytestAdapter) for a in adapters.values())
    assert adapters["vllm"].patches == tuple(p.name for p in SESSION_PATCHES)
    process = {p.name for p in PATCHES}
    assert {p.restates for p in SESSION_PATCHES if p.restates} <= process


def test_the_timeout_counts_the_draft_managers_the_ruleset_states():
    import dataclasses

    from cgsim.config import ManagerConfig
    from cgsim.observe import scenario_timeout
    from cgsim.scenario import Scenario, Step
    from cgsim.spec.rulesets import RULESETS

    assert {r.draft_managers for r in RULESETS.values()} == {2}
    base = ManagerConfig(capture_sizes=tuple(range(8, 409, 8)), max_num_reqs=64, lora_cases=(0, 1, 2, 4, 8))
    steps = (Step.capture(),)
    plain = scenario_timeout(Scenario(base, steps), 10)
    drafted = scenario_timeout(Scenario(dataclasses.replace(base, decode_query_len=2), steps), 10)
    assert drafted > 2.5 * plain


# -- no generic module tests an engine's name ---------------------------------------------------

ENGINE_NAME = re.compile(r"^(vllm|sglang)([-_:.].*)?$", re.IGNORECASE)

# Modules that are an engine's own: they may name it.
ENGINE_MODULES = (
    "cgsim/targets/vllm/",
    "cgsim/targets/sglang/",
    "cgsim/encoder/targets.py",  # the encoder targets' own registry (encoder-reference, vllm-encoder)
    "fuzz/export_test/vllm",  # vLLM's test style (vllm.py, vllm_code.py, vllm_encoder.py)
)


@dataclass(frozen=True)
class Allowed:
    path: str
    literal: str
    why: str


# None: an engine's own properties say so in their declaration (``declare(..., engine=...)``), read
# by the judge and the reports against the ruleset's engine, never by comparing a name.
ALLOWED: tuple[Allowed, ...] = ()


def engine_comparisons(root: str) -> list[tuple[str, int, str]]:
    """(path, line, literal) of each comparison (``==``, ``!=``, ``in``) or
    ``startswith``/``endswith`` test against a string naming an engine, in
    the cgsim and fuzz modules outside the engines' own."""
    return [(rel, node.lineno, lit) for rel, tree in parsed_modules(root, skip=ENGINE_MODULES)
            for node in ast.walk(tree) for lit in _compared(node)]


def _compared(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
            "startswith", "endswith"):
        operands = list(node.args)
    else:
        return []
    return [lit for operand in operands for lit in string_literals(operand) if ENGINE_NAME.match(lit)]


def test_no_generic_module_compares_with_an_engine_name():
    allowed = {(a.path, a.literal) for a in ALLOWED}
    found = [f"{path}:{line}: {lit!r}" for path, line, lit in engine_comparisons(ROOT) if (path, lit) not in allowed]
    assert not found, ("generic code tests an engine's name (ask the target through a hook of its roles, "
                       "cgsim.targets.base, or allow it with a reason):\n" + "\n".join(found))


def test_every_allowed_comparison_is_still_there():
    found = {(path, lit) for path, _, lit in engine_comparisons(ROOT)}
    assert all((a.path, a.literal) in found for a in ALLOWED), "an allow-list entry no longer applies: remove it"


@pytest.mark.parametrize("code", [
    'if get_ruleset(ruleset).engine == "sglang":\n    pass\n',
    'ok = os.environ.get("CGSIM_TARGET", "").split(":")[0] == "vllm"\n',
    'ok = engine in ("vllm",)\n',
    'keys = [k for k in env if k.startswith("vllm_source")]\n',
])
def test_the_scan_finds_the_comparisons_generic_code_used_to_make(tmp_path, code):
    (tmp_path / "cgsim").mkdir()
    (tmp_path / "cgsim" / "generic.py").write_text(code)
    assert [(p, lit) for p, _, lit in engine_comparisons(str(tmp_path))][0][0] == "cgsim/generic.py"


def test_the_repro_script_test_leaves_no_source_tree_behind():
    """Runs after the test above in one process (file order): the tree it set is gone."""
    assert not any(o.env in os.environ and os.environ[o.env].endswith("some-tree") for o in source_options())
