"""An encoder campaign's report (``fuzz/encoder_campaign.py``): index.md and
index.html, both rendered from its summary.json alone, so the two say the
same and either can be rebuilt from the summary.

The page is self-contained like the decode campaign's (``html.py``: its
style inline, no script, nothing fetched); its only links are to the
finding files and repro scripts beside it in the run directory."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from cgsim.report.html import REPORT_CSS

__all__ = ["render_encoder_html", "render_encoder_markdown", "replay_command", "repro_command"]

DEFECTS_DOC = "docs/encoder.md"


def replay_command(entry: Mapping) -> str:
    return f"python -m fuzz replay {entry['file']}"


def repro_command(entry: Mapping) -> str:
    return f"python {entry['repro']}"


def _n(value: Any) -> str:
    """A count, or "?" where it is unknown (a report rebuilt after its campaign died)."""
    return "?" if value is None else str(value)


def _headline(summary: Mapping) -> str:
    findings = summary.get("findings", [])
    interrupted = summary.get("interrupted")
    why = f" ({interrupted})" if isinstance(interrupted, str) else " (interrupted)" if interrupted else ""
    return (f"Target `{summary.get('target')}` ({summary.get('ruleset')}) on {summary.get('backend')}: "
            f"{_n(summary.get('scenarios', 0))} scenarios, {_n(summary.get('refused', 0))} refused (by the engine or "
            f"the manager), {len(findings)} findings{why}.")


def render_encoder_markdown(summary: Mapping) -> str:
    lines = [f"# Encoder campaign {summary.get('run_id')}", "", _headline(summary), ""]
    if summary.get("findings"):
        lines += [("Run the commands from this directory; each exits 1 while the bug is there (index.html: the same "
                  "as a page)."), ""]
    for f in summary.get("findings", []):
        label = f" — documented defect {f['defect']} ({DEFECTS_DOC})" if f.get("defect") else " — new"
        lines += [f"## {f['property']} [{f['status']}]{label}", "", f.get("message", ""), "",
                  f"- scenario: `{f.get('scenario')}`"]
        if f.get("launch"):
            lines.append(f"- launch: `{f['launch']}`")
        lines.append(f"- replay: `{replay_command(f)}`")
        if f.get("repro"):
            lines.append(f"- repro script: `{repro_command(f)}`")
        lines.append("")
    lines += ["## Properties", "", "| property | checks | failures | statement |", "|---|---|---|---|"]
    lines += [f"| {pid} | {_n(e['checks'])} | {e['failures']} | {e['statement']} |"
              for pid, e in summary.get("properties", {}).items()]
    return "\n".join(lines) + "\n"


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _finding(f: Mapping) -> str:
    fid = f.get("id", "")
    defect = (f'documented defect <b class="defect-label">{_e(f["defect"])}</b> ({_e(DEFECTS_DOC)})'
              if f.get("defect") else "new: no documented defect explains it")
    rows = [
        ("property", f"<code>{_e(f.get('property'))}</code>: {_e(f.get('statement') or '')}"),
        ("what was seen", _e(f.get("message"))),
        ("defect", defect),
        ("status", _e(f.get("status"))),
        *([("reached by", f'<code class="launch">{_e(f["launch"])}</code>')] if f.get("launch") else []),
        ("shrunk scenario", f'<code class="scenario">{_e(f.get("scenario"))}</code>'),
        ("finding file", f'<a href="{_e(f.get("file"))}"><code>{_e(f.get("file"))}</code></a>'),
        *([("repro script", f'<a href="{_e(f["repro"])}"><code>{_e(f["repro"])}</code></a>')] if f.get("repro") else []),
    ]
    commands = "\n".join([replay_command(f)] + ([repro_command(f)] if f.get("repro") else []))
    return "\n".join([
        f'<section class="defect finding" id="finding-{_e(fid)}" data-property="{_e(f.get("property"))}">',
        f'<h3>{_e(f.get("property"))} <span class="muted"><code>{_e(fid)}</code></span></h3>',
        "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>",
        "<div>Replay (from this directory; exit 1 while the bug is there):</div>",
        f'<pre class="replay"><code>{_e(commands)}</code></pre>',
        "</section>"])


def _properties(summary: Mapping) -> str:
    rows = []
    for pid, v in summary.get("properties", {}).items():
        cls = ' class="failed"' if v.get("failures") else ""
        rows.append(f"<tr{cls}><td><code>{_e(pid)}</code></td><td class=\"num\">{_e(_n(v.get('checks', 0)))}</td>"
                    f"<td class=\"num\">{_e(v.get('failures', 0))}</td><td>{_e(v.get('statement', ''))}</td></tr>")
    return ('<table id="properties"><thead><tr><th>property</th><th>checks</th><th>failures</th><th>statement</th></tr>'
            "</thead><tbody>" + "".join(rows) + "</tbody></table>")


def render_encoder_html(summary: Mapping) -> str:
    findings = summary.get("findings", [])
    title = f"cgsim encoder campaign {summary.get('run_id')}"
    verdict = (f'<span class="verdict fail" id="verdict">{len(findings)} finding{"s" if len(findings) != 1 else ""}</span>'
               if findings else '<span class="verdict ok" id="verdict">no findings</span>')
    body = [f"<h1>{_e(title)}</h1>",
            f'<div class="headline">{verdict}<span>{_e(_headline(summary).replace("`", ""))}</span></div>',
            '<h2 id="findings">Findings</h2>']
    if findings:
        body += [_finding(f) for f in findings]
    else:
        body.append('<p id="no-findings">None: every property held on every scenario judged.</p>')
    body += ['<h2 id="properties-heading">Properties</h2>', _properties(summary)]
    settings = [("target", summary.get("target")), ("backend", summary.get("backend")),
                ("ruleset", summary.get("ruleset")), ("seed", summary.get("seed")),
                ("command", summary.get("command")), ("elapsed", _n(summary.get("elapsed_s")) + "s")]
    body.append('<h2 id="settings">Settings</h2><table>'
                + "".join(f"<tr><th>{_e(k)}</th><td><code>{_e(v)}</code></td></tr>" for k, v in settings
                          if v not in (None, ""))
                + "</table>")
    body.append('<p class="muted">summary.json has all of this as data; index.md the same as text; findings/ the '
                "finding files and their repro scripts.</p>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e(title)}</title><style>{REPORT_CSS}</style></head>\n<body><main>\n"
            + "\n".join(body) + "\n</main></body></html>\n")
