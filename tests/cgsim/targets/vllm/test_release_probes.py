"""Release knowledge in one place: the shape of the imported vLLM tree is
probed only by ``cgsim.targets.vllm.compat`` (``Capabilities``, read once).
The handle, the front door and the scheduling code read Capabilities; a scan
of their source finds no probe of their own (``hasattr``, ``getattr`` with a
default, ``inspect``, ``find_spec``, an ``except AttributeError``).

Nothing here needs vLLM."""

from __future__ import annotations

import ast
import os
import types
from dataclasses import dataclass

import pytest

from cgsim.descriptors import BatchDescriptor
from cgsim.modes import CUDAGraphMode
from cgsim.targets.vllm.handle import from_vllm_desc
# The same probes the scan of every adapter module looks for (its allow-list does not apply here).
from tests.cgsim.targets.test_tree_probes import probe_kinds as _probes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

# The modules that read Capabilities instead of probing: files, or folders (every .py in them).
SCANNED = ("cgsim/targets/vllm/handle.py", "cgsim/targets/vllm/engine.py", "cgsim/targets/vllm/scheduling/")


@dataclass(frozen=True)
class Allowed:
    path: str
    probe: str
    why: str


# Probes of cgsim's own values (never of the tree's shape), each with its reason.
ALLOWED: tuple[Allowed, ...] = ()


def _scanned_files(root: str) -> list[str]:
    out = []
    for entry in SCANNED:
        path = os.path.join(root, entry)
        if entry.endswith("/"):
            out += sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".py")) if os.path.isdir(path) else []
        elif os.path.exists(path):
            out.append(path)
    return out


def probes(root: str) -> list[tuple[str, int, str]]:
    """(path, line, probe) of each probe of a module's shape in the scanned modules."""
    out = []
    for path in _scanned_files(root):
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), rel)
        out += sorted((rel, node.lineno, probe) for node in ast.walk(tree) for probe in _probes(node))
    return out


def test_the_handle_engine_and_scheduling_code_probe_no_tree_shape():
    allowed = {(a.path, a.probe) for a in ALLOWED}
    found = [f"{path}:{line}: {probe}" for path, line, probe in probes(ROOT) if (path, probe) not in allowed]
    assert not found, ("a probe of vLLM's tree outside cgsim.targets.vllm.compat (make it a Capabilities field "
                       "read once in compat.probe, or allow it with a reason if it probes cgsim's own value):\n"
                       + "\n".join(found))


def test_the_scan_reads_every_module_it_names():
    for entry in SCANNED:
        assert os.path.exists(os.path.join(ROOT, entry)), f"{entry} is gone: scan what replaced it"
    assert any(p.endswith(".py") for p in _scanned_files(ROOT) if "/scheduling/" in p.replace(os.sep, "/"))


def test_every_allowed_probe_is_still_there():
    found = {(path, probe) for path, _, probe in probes(ROOT)}
    assert all((a.path, a.probe) in found for a in ALLOWED), "an allow-list entry no longer applies: remove it"


@pytest.mark.parametrize("code, probe", [
    ('kw = {f: getattr(d, f) for f in caps.desc_fields if hasattr(d, f)}\n', "hasattr()"),
    ('mql = getattr(input_batch, "max_query_len", None)\n', "getattr() with a default"),
    ('def f(cls):\n    import inspect\n    return frozenset(inspect.signature(cls).parameters)\n', "inspect.signature"),
    ('from inspect import signature\n', "from inspect import"),
    ('import importlib.util\nv1 = importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is not None\n',
     "find_spec()"),
    ('try:\n    fn = lu.get_lora_capture_cases\nexcept (ImportError, AttributeError):\n    fn = None\n',
     "except AttributeError"),
], ids=["hasattr", "getattr-default", "inspect", "from-inspect", "find_spec", "except-AttributeError"])
def test_the_scan_finds_the_probes_the_adapter_used_to_make(tmp_path, code, probe):
    folder = tmp_path / "cgsim" / "targets" / "vllm" / "scheduling"
    folder.mkdir(parents=True)
    (folder / "probe.py").write_text(code)
    assert probe in [p for _, _, p in probes(str(tmp_path))]


# -- what the call sites read instead ------------------------------------------------------


@pytest.mark.parametrize("desc_fields, extra, expected", [
    # 0.20-0.23: no max_query_len, num_active_loras or num_ubatches: ours keep their defaults.
    (("cg_mode", "num_tokens", "num_reqs", "uniform_token_count"), {}, (None, 0, 1)),
    # 0.28-0.29: no num_ubatches.
    (("cg_mode", "num_tokens", "num_reqs", "uniform_token_count", "max_query_len", "num_active_loras"),
     {"max_query_len": 3, "num_active_loras": 2}, (3, 2, 1)),
    # 0.30+: every field of ours.
    (("cg_mode", "num_tokens", "num_reqs", "uniform_token_count", "max_query_len", "num_active_loras", "num_ubatches"),
     {"max_query_len": 3, "num_active_loras": 2, "num_ubatches": 2}, (3, 2, 2)),
], ids=["0.20", "0.28", "0.30"])
def test_a_descriptor_is_read_by_the_fields_the_capabilities_name(desc_fields, extra, expected):
    mode = types.SimpleNamespace(name="FULL")
    # A field the tree's descriptor lacks is never read, even where the object has it.
    theirs = types.SimpleNamespace(cg_mode=mode, num_tokens=8, num_reqs=4, uniform_token_count=2,
                                   **{"max_query_len": 9, "num_active_loras": 9, "num_ubatches": 9, **extra})
    caps = types.SimpleNamespace(desc_fields=desc_fields)
    assert from_vllm_desc(theirs, caps) == BatchDescriptor(CUDAGraphMode.FULL, 8, 4, 2, *expected)
