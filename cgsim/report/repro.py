"""Write ``repro_<id>.py``: the fixed template plus the finding as a JSON
string literal.  The only thing substituted into the script is that literal,
and it is checked to parse back to exactly the finding."""

from __future__ import annotations

import ast
import json
import os

from cgsim.finding import Finding
from cgsim.report.atomic import atomic_write_text

__all__ = ["render_repro", "write_repro", "TEMPLATE_PATH"]

TEMPLATE_PATH = os.path.join(os.path.dirname(__file__), "repro_template.py")
_MARKER_LINE = 'FINDING_JSON = "{}"  # @@CGSIM-FINDING@@ (replaced by the finding as a JSON string literal)'


def render_repro(finding: Finding) -> str:
    with open(TEMPLATE_PATH, encoding="utf-8") as fh:
        template = fh.read()
    if template.count(_MARKER_LINE) != 1:
        raise RuntimeError(f"{TEMPLATE_PATH} lost its FINDING_JSON marker line")
    text = json.dumps(finding.to_json(), indent=None, sort_keys=True, ensure_ascii=True)
    literal = json.dumps(text, ensure_ascii=True)  # a JSON string is a valid Python str literal here
    if ast.literal_eval(literal) != text:  # pragma: no cover - guards the claim above
        raise RuntimeError("finding JSON does not survive as a Python string literal")
    return template.replace(_MARKER_LINE, f"FINDING_JSON = {literal}", 1)


def write_repro(findings_dir: str, finding: Finding) -> str:
    path = os.path.join(findings_dir, finding.repro)
    atomic_write_text(path, render_repro(finding), mode=0o755)
    return path
