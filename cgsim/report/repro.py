"""Write ``repro_<id>.py``: the fixed template plus the finding as a JSON
string literal, and the scenario as code in a comment block to read.  The
only code substituted into the script is that literal, checked to parse
back to exactly the finding; the scenario's code is comments only."""

from __future__ import annotations

import ast
import json
import os

from cgsim.finding import Finding
from cgsim.report.atomic import atomic_write_text

__all__ = ["render_repro", "write_repro", "TEMPLATE_PATH"]

TEMPLATE_PATH = os.path.join(os.path.dirname(__file__), "repro_template.py")
_MARKER_LINE = 'FINDING_JSON = "{}"  # @@CGSIM-FINDING@@ (replaced by the finding as a JSON string literal)'
_CODE_MARKER_LINE = "# @@CGSIM-SCENARIO-CODE@@ (replaced by the scenario as code, every line a comment)"


def render_repro(finding: Finding) -> str:
    with open(TEMPLATE_PATH, encoding="utf-8") as fh:
        template = fh.read()
    for marker in (_MARKER_LINE, _CODE_MARKER_LINE):
        if template.count(marker) != 1:
            raise RuntimeError(f"{TEMPLATE_PATH} lost its marker line {marker!r}")
    return (template.replace(_MARKER_LINE, f"FINDING_JSON = {_json_literal(finding)}", 1)
            .replace(_CODE_MARKER_LINE, _code_comment(finding), 1))


def _json_literal(finding: Finding) -> str:
    """The finding as a Python string literal of readable JSON (one key a
    line, in a raw triple-quoted string), or of one escaped line where the
    text cannot sit in a raw string."""
    data = finding.to_json()
    text = _readable_json(data)
    literal = f'r"""\n{text}\n"""'
    if ('"""' in text or text.endswith("\\") or _parsed(literal) != f"\n{text}\n"
            or json.loads(text) != json.loads(json.dumps(data))):
        text = json.dumps(finding.to_json(), indent=None, sort_keys=True, ensure_ascii=True)
        literal = json.dumps(text, ensure_ascii=True)  # a JSON string is a valid Python str literal here
        if _parsed(literal) != text:  # pragma: no cover - guards the claim above
            raise RuntimeError("finding JSON does not survive as a Python string literal")
    return literal


def _readable_json(value: object, level: int = 0) -> str:
    """JSON with one key a line and lists of plain values on one line (a
    ladder of 50 capture sizes is one line, not 50); ASCII only."""
    pad, inner = " " * level, " " * (level + 1)
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(str(k), ensure_ascii=True)}: {_readable_json(v, level + 1)}"
                 for k, v in sorted(value.items())]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) and v for v in value):
        return "[\n" + ",\n".join(f"{inner}{_readable_json(v, level + 1)}" for v in value) + f"\n{pad}]"
    return json.dumps(value, ensure_ascii=True)


def _parsed(literal: str) -> object:
    try:
        return ast.literal_eval(literal)
    except (SyntaxError, ValueError):
        return None


def _code_comment(finding: Finding) -> str:
    """The scenario as code, every line a comment ("#| "): never run.  Its
    family writes it (``cgsim.families``), e.g. an encoder scenario as the
    constructor calls of ``cgsim.encoder.values``."""
    from cgsim.families import family_of_finding

    try:
        code = family_of_finding(finding).scenario_code(finding.scenario)
    except (ValueError, TypeError, KeyError) as exc:
        code = f"(the scenario does not load here: {type(exc).__name__})"
    return "\n".join(f"#| {line}".rstrip() for line in code.splitlines())


def write_repro(findings_dir: str, finding: Finding) -> str:
    path = os.path.join(findings_dir, finding.repro)
    atomic_write_text(path, render_repro(finding), mode=0o755)
    return path
