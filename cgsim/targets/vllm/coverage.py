"""Did the campaign exercise my change?  Which lines of vLLM's CUDA-graph
modules a campaign's workers executed (coverage.py, measured in the workers),
and, for a ``--vllm-source`` git checkout, which lines changed against its
merge base (or ``--diff-base``) never ran.

The campaign names a directory (``CGSIM_TARGET_COVERAGE``) and its own pid
(``CGSIM_TARGET_COVERAGE_PARENT``); every worker process measures the
modules in ``MODULES`` from its first scenario on and saves its data there
every few seconds (a worker may be killed at any time; it loses at most the
last interval).  It measures only while the adapter runs vLLM (``measuring``,
around each call the runner makes into the manager): the measured modules
run nowhere else, and tracing every call of Hypothesis and of the
properties as well made a scenario cost 1.92 times as much as without
coverage, against 1.66 (``benchmarks/bench_target_coverage.py``).  The
campaign process itself measures nothing: the adapter's self-check runs
there and is not the campaign's exploration.  Each worker writes its own
data file; the report combines them.  Lines that run
when a module is imported (imports, def and class statements) count as
executed for every measured module: forked workers inherit the import.

coverage.py is optional (``pip install 'cgsim[coverage]'``); without it the
report says so and nothing is measured.
"""

from __future__ import annotations

import ast
import contextlib
import glob
import importlib.util
import os
import re
import secrets
import socket
import subprocess
import time
from typing import Any, Iterable

__all__ = ["COVERAGE_ENV", "PARENT_ENV", "MODULES", "coverage_available", "request", "start_in_worker",
           "measuring", "checkpoint", "summarize", "changed_lines"]

COVERAGE_ENV = "CGSIM_TARGET_COVERAGE"
PARENT_ENV = "CGSIM_TARGET_COVERAGE_PARENT"
# The target's CUDA-graph modules, relative to the vllm package.
MODULES = (
    "v1/worker/gpu/cudagraph_utils.py",
    "v1/worker/gpu/spec_decode/*/cudagraph*.py",
    "compilation/breakable_cudagraph.py",
)
SAVE_EVERY_S = 2.0
_INSTALL = "pip install 'cgsim[coverage]' (coverage.py)"

_cov: Any = None
_last_save = 0.0
_depth = 0  # nesting of measuring(): a capture dispatches, a target's capture captures its drafts


def coverage_available() -> bool:
    return importlib.util.find_spec("coverage") is not None


def request(data_dir: str) -> None:
    """The campaign asks its workers to measure (they inherit the environment)."""
    os.makedirs(data_dir, exist_ok=True)
    os.environ[COVERAGE_ENV] = os.path.abspath(data_dir)
    os.environ[PARENT_ENV] = str(os.getpid())


def _package_dir() -> str | None:
    spec = importlib.util.find_spec("vllm")  # the source overlay's tree when one is applied
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.realpath(list(spec.submodule_search_locations)[0])


def module_files(package_dir: str) -> list[str]:
    out: list[str] = []
    for pattern in MODULES:
        out += sorted(glob.glob(os.path.join(package_dir, pattern)))
    return out


def start_in_worker() -> None:
    """Set up measuring in this process if a campaign asked for it and this
    is one of its workers; idempotent.  Nothing is traced until ``measuring``."""
    global _cov, _last_save
    data_dir = os.environ.get(COVERAGE_ENV)
    if _cov is not None or not data_dir or os.environ.get(PARENT_ENV) == str(os.getpid()):
        return
    if not coverage_available():
        return
    pkg = _package_dir()
    if pkg is None:
        return
    import coverage  # noqa: PLC0415

    # Its own file from the start: coverage.py names a suffixed file only at
    # start(), and a save before it went to the one ".coverage" all workers shared.
    own = f".coverage.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}"
    # A worker that never reaches these modules (a refused config) saves no data: not worth a warning.
    cov = coverage.Coverage(data_file=os.path.join(data_dir, own), data_suffix=None,
                            include=[os.path.join(pkg, p) for p in MODULES], config_file=False)
    cov.set_option("run:disable_warnings", ["no-data-collected", "module-not-measured"])
    _cov, _last_save = cov, time.monotonic()


@contextlib.contextmanager
def measuring() -> Any:
    """Trace the measured modules while the body runs (nested uses trace once)."""
    global _depth
    if _cov is None:
        yield
        return
    if _depth == 0:
        with _measurement_failures():
            _cov.start()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            with _measurement_failures():
                _cov.stop()


@contextlib.contextmanager
def _measurement_failures() -> Any:
    """coverage.py failing (a data file it cannot use) is this machine's
    problem, never the target's: an environment error, not a finding."""
    from cgsim.targets.base import TargetEnvironmentError  # noqa: PLC0415

    try:
        yield
    except Exception as exc:  # noqa: BLE001 - any failure of the measurement itself
        raise TargetEnvironmentError(f"measuring the target's coverage failed: {type(exc).__name__}: "
                                     f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from None


def checkpoint(force: bool = False) -> None:
    """Save this worker's data (at most every SAVE_EVERY_S seconds unless forced)."""
    global _last_save
    if _cov is None:
        return
    now = time.monotonic()
    if force or now - _last_save >= SAVE_EVERY_S:
        with _measurement_failures():
            _cov.save()
        _last_save = now


# -- the report -------------------------------------------------------------------------


def _import_time_lines(path: str) -> set[int]:
    """Lines that run when the module is imported: module-level statements and
    class bodies (def and class statements, their decorators, assignments)."""
    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError):
        return set()
    out: set[int] = set()

    def visit(body: Iterable[ast.stmt]) -> None:
        for node in body:
            out.add(node.lineno)
            for dec in getattr(node, "decorator_list", ()):
                out.add(dec.lineno)
            if isinstance(node, ast.ClassDef):
                visit(node.body)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                for h in getattr(node, "handlers", ()):
                    visit(h.body)
                visit(getattr(node, "orelse", ()))
                visit(getattr(node, "finalbody", ()))

    visit(tree.body)
    return out


def _ranges(lines: Iterable[int]) -> str:
    nums = sorted(set(lines))
    parts, start = [], None
    for i, n in enumerate(nums):
        if start is None:
            start = n
        if i + 1 == len(nums) or nums[i + 1] != n + 1:
            parts.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(parts)


def changed_lines(root: str, base: str, paths: list[str]) -> dict[str, set[int]]:
    """Line numbers (in the working tree) that differ from ``base``, per path
    relative to ``root``."""
    out = subprocess.run(["git", "-C", root, "diff", "-U0", "--no-color", base, "--", *paths],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "git diff failed")
    changed: dict[str, set[int]] = {}
    current = None
    for line in out.stdout.splitlines():
        if line.startswith("+++ "):
            current = line[6:] if line.startswith("+++ b/") else None
        m = re.match(r"@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", line)
        if m and current is not None:
            start, count = int(m.group(1)), int(m.group(2) or 1)
            changed.setdefault(current, set()).update(range(start, start + count))
    return changed


def _merge_base(root: str) -> tuple[str | None, str]:
    for upstream in ("origin/main", "upstream/main", "main", "origin/master"):
        out = subprocess.run(["git", "-C", root, "merge-base", "HEAD", upstream], capture_output=True, text=True,
                             timeout=60)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip(), f"merge base of HEAD and {upstream}"
    return None, "no upstream branch (origin/main, upstream/main, main) to take a merge base with; pass --diff-base REF"


def summarize(data_dir: str | None, package_dir: str, source_root: str | None = None, git: bool = False,
              diff_base: str | None = None) -> dict:
    """The summary's target_coverage section (plain data)."""
    section: dict[str, Any] = {"modules": list(MODULES), "files": [], "diff": None}
    if not coverage_available():
        section.update(available=False, note=f"not measured: coverage.py is not installed here ({_INSTALL})")
        return section
    section["available"] = True
    data = sorted(glob.glob(os.path.join(data_dir, ".coverage.*"))) if data_dir else []
    if not data:
        section["note"] = "no coverage data: no worker ran a scenario long enough to save its first measurement"
        return section
    import coverage  # noqa: PLC0415

    section["tool"] = f"coverage.py {coverage.__version__}"
    cov = coverage.Coverage(data_file=os.path.join(data_dir, ".coverage-combined"), config_file=False)
    cov.set_option("run:disable_warnings", ["no-data-collected"])
    cov.combine(data, keep=True)
    measured = set(cov.get_data().measured_files())
    total_s = total_x = 0
    analysed: dict[str, tuple[set[int], set[int]]] = {}
    for path in module_files(package_dir):
        rel = os.path.relpath(path, os.path.dirname(package_dir))
        try:
            _, statements, _, missing, _ = cov.analysis2(path)
        except Exception:  # noqa: BLE001 - a module coverage cannot parse: say so, go on
            section["files"].append({"path": rel, "error": "coverage could not analyse it"})
            continue
        statements, missing = set(statements), set(missing)
        if path in measured:
            missing -= _import_time_lines(path)
        executed = statements - missing
        analysed[rel] = (statements, missing)
        total_s += len(statements)
        total_x += len(executed)
        section["files"].append({
            "path": rel, "statements": len(statements), "executed": len(executed),
            "percent": round(100.0 * len(executed) / len(statements), 1) if statements else 100.0,
            "missing": _ranges(missing),
        })
    section["total"] = {"statements": total_s, "executed": total_x,
                        "percent": round(100.0 * total_x / total_s, 1) if total_s else 100.0}
    if source_root is not None and git:
        section["diff"] = _diff(source_root, diff_base, analysed)
    return section


def _diff(root: str, diff_base: str | None, analysed: dict[str, tuple[set[int], set[int]]]) -> dict:
    if diff_base:
        base, how = diff_base, f"--diff-base {diff_base}"
    else:
        base, how = _merge_base(root)
        if base is None:
            return {"base": None, "note": how}
    try:
        changed = changed_lines(root, base, list(analysed))
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return {"base": base, "note": f"git diff against {base} failed: {exc}"}
    files = []
    for rel, lines in sorted(changed.items()):
        statements, missing = analysed.get(rel, (set(), set()))
        changed_statements = lines & statements
        never = changed_statements & missing
        files.append({"path": rel, "changed_lines": len(lines), "changed_statements": len(changed_statements),
                      "never_ran": _ranges(never), "never_ran_count": len(never)})
    return {"base": base, "how": how, "files": files,
            "never_ran_total": sum(f["never_ran_count"] for f in files)}
