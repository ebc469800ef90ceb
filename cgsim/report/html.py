"""index.html: the campaign report for a browser, rendered from the summary.

Self-contained and viewable offline: CSS inline, pictures inlined as data:
URIs, the timeline inline SVG, no script and nothing fetched, so the file
can be mailed, attached to a CI run or opened from an archive.  Headline
first, then the findings (picture, what was seen, replay commands), the
property table, coverage, the per-worker timeline and the settings.
"""

from __future__ import annotations

import base64
import html
import json
from typing import Any, Mapping

from cgsim.report.markdown import defect_cards, scheduler_said

__all__ = ["render_html"]

_CSS = """
:root { --fail: #c62828; --ok: #2e7d32; --muted: #666; --line: #ddd; --bg: #fafafa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222; margin: 0; background: #fff; }
main { max-width: 1280px; margin: 0 auto; padding: 16px 24px 48px; }
h1 { font-size: 22px; margin: 8px 0 4px; }
h2 { font-size: 18px; margin: 32px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 16px; margin: 0 0 6px; }
code, pre { font: 12.5px/1.4 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
pre { background: var(--bg); border: 1px solid var(--line); border-radius: 4px; padding: 8px 10px; overflow-x: auto; margin: 6px 0; }
.headline { display: flex; flex-wrap: wrap; gap: 10px 18px; align-items: baseline; margin: 6px 0 4px; }
.verdict { font-weight: 700; font-size: 16px; padding: 2px 10px; border-radius: 12px; color: #fff; }
.verdict.fail { background: var(--fail); } .verdict.ok { background: var(--ok); }
.partial { color: #e65100; font-weight: 600; }
.muted { color: var(--muted); }
.defect { border: 1px solid var(--line); border-left: 4px solid var(--fail); border-radius: 4px; padding: 12px 14px; margin: 14px 0; }
.finding { margin: 8px 0; } .finding.also { border-top: 1px dashed var(--line); padding-top: 6px; }
.finding dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 6px 0; }
.finding dt { color: var(--muted); } .finding dd { margin: 0; }
.finding img { max-width: 100%; height: auto; border: 1px solid var(--line); margin: 8px 0; }
.nopicture { color: var(--muted); font-style: italic; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 10px 3px 0; text-align: left; vertical-align: top; }
th { font-weight: 600; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.failed td { color: var(--fail); font-weight: 600; }
.bar { display: inline-block; height: 10px; background: #90a4ae; vertical-align: middle; margin-right: 6px; }
.timeline { border: 1px solid var(--line); border-radius: 4px; background: #fff; }
details summary { cursor: pointer; color: #1565c0; }
.coverage-grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr)); gap: 0 24px; }
.coverage-grid h3 { margin-top: 10px; }
"""

def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def _settings_rows(summary: Mapping) -> list[tuple[str, str]]:
    s = summary.get("settings", {})
    keys = ("target", "backend", "ruleset", "profile", "budget_s", "workers", "seed", "timeout_s", "max_examples",
            "gpus", "command", "cgsim_version", "hypothesis_version", "python", "host")
    rows = [(k, str(s.get(k))) for k in keys if s.get(k) not in (None, "")]
    rows += [("started", str(summary.get("started_at"))), ("finished", str(summary.get("finished_at")))]
    return rows


def _headline(summary: Mapping) -> str:
    findings = summary.get("findings", [])
    s = summary.get("settings", {})
    defects = len(defect_cards(summary))
    verdict = (f'<span class="verdict fail" id="verdict">{defects} defect{"s" if defects != 1 else ""} · '
               f'{len(findings)} finding{"s" if len(findings) != 1 else ""}</span>'
               if findings else '<span class="verdict ok" id="verdict">no findings</span>')
    state = ("complete" if summary.get("complete")
             else f'<span class="partial">PARTIAL: {_e(summary.get("interrupted") or "stopped early, or still running")}</span>')
    rate = summary.get("scenarios_per_s")
    parts = [
        verdict,
        f'<span><b>{_e(summary.get("scenarios", 0))}</b> scenarios in {float(summary.get("elapsed_s") or 0):.1f}s'
        + (f" ({_e(rate)}/s)" if rate else "") + "</span>",
        f'<span>target <code>{_e(s.get("target"))}</code> · backend <code>{_e(s.get("backend"))}</code> · '
        f'ruleset <code>{_e(s.get("ruleset"))}</code></span>',
        f"<span>report {state}</span>",
    ]
    return f'<div class="headline">{"".join(parts)}</div>'


def _card(n: int, card: Mapping, by_id: Mapping[str, Mapping], images: Mapping[str, bytes]) -> str:
    """One defect: its minimal scenario's finding in full, then the findings
    it stands for (each shrunk for its own property), compact."""
    f = by_id[card["primary"]]
    names = [f["property"]] + [p for p in card["properties"] if p != f["property"]]
    head = (f'<h3 class="defect-title">{n}. {", ".join(_e(p) for p in names)}</h3>'
            + (f'<div>documented defect <b>{_e(card["known_defect"])}</b></div>' if card.get("known_defect") else "")
            + (f'<div class="muted">one scenario violates {len(card["properties"])} properties</div>'
               if len(card["properties"]) > 1 else ""))
    out = [f'<div class="defect" id="defect-{_e(card["id"])}">', head, _finding(f, images)]
    for other in (by_id[i] for i in card["findings"][1:] if i in by_id):
        out.append(_finding(other, images, compact=True))
    out.append("</div>")
    return "\n".join(out)


def _finding(f: Mapping, images: Mapping[str, bytes], compact: bool = False) -> str:
    fid = f.get("id", "")
    if compact:
        replay = "\n".join(x for x in (f.get("replay_command"), f"python {f.get('repro_path')}") if x)
        return (f'<section class="finding also" id="finding-{_e(fid)}" data-property="{_e(f.get("property"))}">'
                f"<div>The same defect, shrunk for <code>{_e(f.get('property'))}</code> ({_e(f.get('status'))}): "
                f"<code>{_e(f.get('path'))}</code></div>"
                f'<pre class="replay"><code>{_e(replay)}</code></pre></section>')
    rows = [
        ("property", f"<code>{_e(f.get('property'))}</code>: {_e(f.get('statement') or '')}"),
        ("what was seen", _e(f.get("message"))),
        *([("reached by", f"<code>{_e(f['launch']['line'])}</code>")] if (f.get("launch") or {}).get("line") else []),
        *([("the engine's scheduler", _e(said))] if (said := scheduler_said(f)) else []),
        ("kind · status", f"{_e(f.get('kind'))} · {_e(f.get('status'))}"),
        ("target · backend", f"<code>{_e(f.get('target'))}</code> · <code>{_e(f.get('backend'))}</code>"),
        ("finding file", f"<code>{_e(f.get('path'))}</code>"),
        ("repro script", f"<code>{_e(f.get('repro_path'))}</code>"),
    ]
    if f.get("duplicates"):
        rows.append(("also found as", ", ".join(f"<code>{_e(d)}</code>" for d in f["duplicates"])))
    if f.get("flaky"):
        rows.append(("flaky", _e(f["flaky"])))
    out = [f'<section class="finding" id="finding-{_e(fid)}" data-property="{_e(f.get("property"))}">',
           f"<h3>{_e(f.get('property'))} <span class=\"muted\"><code>{_e(fid)}</code></span></h3>",
           "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"]
    picture = f.get("picture")
    if picture and picture in images:
        out.append(f'<img class="dispatch-map" src="{_data_uri(images[picture])}" alt="dispatch map of {_e(fid)}: '
                   f'every batch of its config, the graph it lands on, this finding\'s batch boxed">')
    elif f.get("picture_error"):
        out.append(f'<p class="nopicture">no picture: {_e(f["picture_error"])}</p>')
    replay = "\n".join(x for x in (f.get("replay_command"), f"python {f.get('repro_path')}") if x)
    out.append("<div>Replay (exit 1 while the bug is there):</div>")
    out.append(f'<pre class="replay"><code>{_e(replay)}</code></pre>')
    out.append(f"<div>Scenario: <code>{_e(f.get('scenario_short', ''))}</code></div>")
    if f.get("scenario_code"):
        out.append(f'<pre class="scenario-code"><code>{_e(f["scenario_code"])}</code></pre>')
    out.append("<details><summary>Scenario JSON</summary>"
               f"<pre><code>{_e(json.dumps(f.get('scenario'), indent=2))}</code></pre></details>")
    out.append("</section>")
    return "\n".join(out)


def _properties(summary: Mapping) -> str:
    rows = []
    for pid, v in summary.get("properties", {}).items():
        cls = ' class="failed"' if v.get("failures") else ""
        rows.append(f"<tr{cls}><td><code>{_e(pid)}</code></td><td class=\"num\">{_e(v.get('checks', 0))}</td>"
                    f"<td class=\"num\">{_e(v.get('failures', 0))}</td><td>{_e(v.get('statement', ''))}</td></tr>")
    return ('<table id="properties"><thead><tr><th>property</th><th>checks</th><th>failures</th><th>statement</th></tr>'
            "</thead><tbody>" + "".join(rows) + "</tbody></table>")


def _coverage(summary: Mapping) -> str:
    out = []
    for dim, counts in summary.get("coverage", {}).items():
        if not counts:
            continue
        top = max(counts.values()) or 1
        rows = "".join(
            f'<tr><td>{_e(k)}</td><td class="num">{_e(v)}</td><td><span class="bar" style="width:{200 * v / top:.0f}px"></span></td></tr>'
            for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0]))))
        out.append(f'<div><h3>{_e(dim.replace("_", " "))}</h3><table class="coverage">{rows}</table></div>')
    return f'<div class="coverage-grid">{"".join(out)}</div>' if out else '<p class="muted">no scenarios ran</p>'


_SPAN_COLORS = (("done", "#90a4ae"), ("stopped", "#90a4ae"), ("running", "#64b5f6"), ("restarted", "#ffb74d"),
                ("killed", "#e57373"), ("died", "#e57373"), ("error", "#e57373"), ("terminated", "#e57373"),
                ("exited", "#e57373"))


def _span_color(how: str | None) -> str:
    for word, color in _SPAN_COLORS:
        if how and word in how:
            return color
    return "#64b5f6"  # still running


def _timeline(summary: Mapping) -> str:
    tl = summary.get("timeline") or {}
    lanes = tl.get("workers") or []
    if not lanes:
        return '<p class="muted">no worker timeline in this summary</p>'
    end = max([float(tl.get("elapsed_s") or 0)]
              + [s["end_s"] for w in lanes for s in w.get("spans", []) if s.get("end_s") is not None]
              + [f[k] for f in tl.get("findings", []) for k in ("found_s", "recorded_s") if f.get(k) is not None]) or 1.0
    left, width, lane_h, top = 90, 1000, 30, 24
    height = top + lane_h * len(lanes) + 34
    x = lambda t: left + width * max(0.0, t) / end  # noqa: E731
    out = [f'<svg class="timeline" id="timeline" xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" '
           f'height="{height}" viewBox="0 0 {left + width + 20} {height}" font-family="sans-serif" font-size="11" '
           'role="img" aria-label="per-worker timeline">']
    step = _nice_step(end)
    t = 0.0
    while t <= end + 1e-9:
        out.append(f'<line x1="{x(t):.1f}" y1="{top - 6}" x2="{x(t):.1f}" y2="{height - 26}" stroke="#eee"/>'
                   f'<text x="{x(t):.1f}" y="{height - 12}" text-anchor="middle" fill="#555">{t:g}s</text>')
        t += step
    budget = summary.get("settings", {}).get("budget_s")
    if isinstance(budget, (int, float)) and 0 < budget <= end:
        out.append(f'<line x1="{x(budget):.1f}" y1="{top - 10}" x2="{x(budget):.1f}" y2="{height - 26}" stroke="#555" '
                   f'stroke-dasharray="4 3"/><text x="{x(budget) + 3:.1f}" y="{top - 12}" fill="#555">budget</text>')
    by_worker = {}
    for f in tl.get("findings", []):
        by_worker.setdefault(f.get("worker"), []).append(f)
    for i, lane in enumerate(lanes):
        y = top + i * lane_h
        gpu = f" (GPU {lane['gpu']})" if lane.get("gpu") not in (None, "") else ""
        out.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">worker {_e(lane.get("worker"))}{_e(gpu)}</text>')
        for s in lane.get("spans", []):
            a, b = float(s.get("start_s") or 0), s.get("end_s")
            b = end if b is None else float(b)
            how = s.get("end") or "running"
            out.append(f'<rect class="span" x="{x(a):.1f}" y="{y + 5}" width="{max(1.5, x(b) - x(a)):.1f}" height="16" '
                       f'rx="3" fill="{_span_color(how)}"><title>worker {_e(lane.get("worker"))}, incarnation '
                       f'{_e(s.get("incarnation"))}: {a:.1f}s to {b:.1f}s, {_e(how)}</title></rect>')
        for f in by_worker.pop(lane.get("worker"), []):
            out.append(_finding_marker(f, x, y))
    orphans = [f for fs in by_worker.values() for f in fs]
    if orphans:  # no lane (found by the parent, or an unknown worker): on the axis
        for f in orphans:
            out.append(_finding_marker(f, x, top + len(lanes) * lane_h - 14))
    out.append("</svg>")
    legend = ('<div class="muted">bars: worker processes (grey: ran to the end; orange: restarted; red: died or killed; '
              'blue: still running) · red diamonds: a finding first confirmed, its line: shrinking until the version '
              'on disk was written; hover for details</div>')
    rows = "".join(
        f'<tr><td><a href="#finding-{_e(f.get("id"))}"><code>{_e(f.get("id"))}</code></a></td><td>{_e(f.get("property"))}</td>'
        f'<td class="num">{_e(f.get("worker"))}</td><td class="num">{_secs(f.get("found_s"))}</td>'
        f'<td class="num">{_secs(f.get("recorded_s"))}</td><td>{_e(f.get("status"))}</td></tr>'
        for f in tl.get("findings", []))
    table = ('<table id="finding-times"><thead><tr><th>finding on disk</th><th>property</th><th>worker</th>'
             '<th>first confirmed</th><th>written</th><th>status</th></tr></thead><tbody>' + rows + "</tbody></table>"
             if rows else "")
    return "\n".join(out) + legend + table


def _finding_marker(f: Mapping, x: Any, y: float) -> str:
    found, rec = f.get("found_s"), f.get("recorded_s")
    if found is None:
        return ""
    cx, cy = x(float(found)), y + 13
    parts = []
    if rec is not None and rec > found:
        parts.append(f'<line x1="{cx:.1f}" y1="{cy}" x2="{x(float(rec)):.1f}" y2="{cy}" stroke="#c62828" stroke-width="2"/>')
    tip = f"{f.get('property')} ({f.get('id')}): found at {float(found):.1f}s" + (
        f", written {f.get('status')} at {float(rec):.1f}s" if rec is not None else "")
    parts.append(f'<a href="#finding-{_e(f.get("id"))}"><path class="finding-marker" d="M{cx:.1f},{cy - 7} l6,7 l-6,7 l-6,-7 z" '
                 f'fill="#c62828" stroke="#fff"><title>{_e(tip)}</title></path></a>')
    return "".join(parts)


def _secs(t: Any) -> str:
    return "-" if t is None else f"{float(t):.1f}s"


def _nice_step(span: float) -> float:
    for step in (0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400):
        if span / step <= 10:
            return float(step)
    return span / 10


def render_html(summary: Mapping, images: Mapping[str, bytes] | None = None) -> str:
    """The report page.  ``images``: the picture files the summary names
    (``finding["picture"]``, relative to the run directory) with their bytes."""
    images = images or {}
    findings = summary.get("findings", [])
    under_test = ((summary.get("settings") or {}).get("environment") or {}).get("code_under_test")
    title = f"cgsim fuzz campaign {summary.get('run_id')}" + (f" on {under_test}" if under_test else "")
    body = [f"<h1>{_e(title)}</h1>", _headline(summary), '<h2 id="findings">Findings</h2>']
    if findings:
        body.append('<p class="muted">One card per defect: a minimal scenario with every property it violates (or '
                    "one documented defect of the engine), and the findings it stands for. Run the replay commands "
                    "from the report's directory.</p>")
        by_id = {f["id"]: f for f in findings}
        body += [_card(n, card, by_id, images) for n, card in enumerate(defect_cards(summary), 1)]
    else:
        body.append('<p id="no-findings">None: every property held on every scenario run.</p>')
    body += ['<h2 id="properties-heading">Properties</h2>', _properties(summary),
             '<h2 id="coverage">Coverage</h2>', _coverage(summary),
             '<h2 id="workers">Workers</h2>', _timeline(summary)]
    workers = summary.get("workers", [])
    if workers:
        rows = "".join(f"<tr><td>{_e(w.get('worker'))}</td><td class=\"num\">{_e(w.get('scenarios'))}</td>"
                       f"<td class=\"num\">{_e(w.get('restarts'))}</td><td>{_e(w.get('end'))}</td></tr>" for w in workers)
        body.append("<table><thead><tr><th>worker</th><th>scenarios</th><th>restarts</th><th>end</th></tr></thead>"
                    f"<tbody>{rows}</tbody></table>")
    notes = summary.get("notes", [])
    if notes:
        body.append('<h2 id="notes">Notes</h2><ul>' + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    body.append('<h2 id="settings">Settings</h2><table>'
                + "".join(f"<tr><th>{_e(k)}</th><td><code>{_e(v)}</code></td></tr>" for k, v in _settings_rows(summary))
                + "</table>")
    body.append('<p class="muted">summary.json has all of this as data; junit.xml one test case per property; '
                "findings/ the finding files and their repro scripts.</p>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n<body><main>\n"
            + "\n".join(body) + "\n</main></body></html>\n")
