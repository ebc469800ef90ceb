"""index.md: a campaign report a person reads with no tools."""

from __future__ import annotations

import json

__all__ = ["render_markdown"]


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in r) + " |")
    return out


def _counts(counter: dict) -> str:
    if not counter:
        return "-"
    return ", ".join(f"{k} ×{v}" for k, v in sorted(counter.items(), key=lambda kv: (-kv[1], str(kv[0]))))


def _scenario_label(status: str | None) -> str:
    return {
        "shrunk": "Shrunk scenario",
        "shrink-interrupted": "Scenario (shrinking was cut short: the smallest found so far)",
        "shrinking": "Scenario (not yet shrunk: the worker stopped while shrinking)",
    }.get(status or "", "Scenario (not shrunk)")


def _cut(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _target_coverage(tc: dict | None) -> list[str]:
    """Which lines of the target's own CUDA-graph code the campaign executed."""
    if tc is None:
        return []
    out = ["", "## Target code coverage", ""]
    if tc.get("note"):
        out += [tc["note"], ""]
    files = tc.get("files") or []
    if files:
        total = tc.get("total", {})
        out.append(f"{tc.get('tool', 'coverage')}: {total.get('executed', 0)} of {total.get('statements', 0)} statements "
                   f"executed ({total.get('percent', 0)}%) in the target's CUDA-graph modules.")
        out.append("")
        out += _table(["module", "statements", "executed", "%", "never executed (lines)"],
                      [[f"`{f['path']}`", f.get("statements", "-"), f.get("executed", "-"), f.get("percent", "-"),
                        _cut(f.get("missing") or f.get("error") or "")] for f in files])
    diff = tc.get("diff")
    if diff:
        out += ["", f"Changed lines against {diff.get('base') or '?'} ({diff.get('how') or diff.get('note', '')}):", ""]
        if diff.get("files"):
            out += _table(["module", "changed lines", "changed statements", "never ran"],
                          [[f"`{f['path']}`", f["changed_lines"], f["changed_statements"], _cut(f["never_ran"] or "-")]
                           for f in diff["files"]])
        elif diff.get("note"):
            out.append(diff["note"])
        else:
            out.append("No changed lines in these modules.")
    return out


def render_markdown(summary: dict) -> str:
    s = summary.get("settings", {})
    findings = summary.get("findings", [])
    state = "complete" if summary.get("complete") else f"PARTIAL ({summary.get('interrupted') or 'stopped early'})"
    verdict = f"**{len(findings)} finding(s)**" if findings else "**no findings**"
    lines = [
        f"# cgsim fuzz campaign `{summary.get('run_id')}`",
        "",
        f"{verdict} · {summary.get('scenarios', 0)} scenarios in {summary.get('elapsed_s', 0):.1f}s · report {state}",
        "",
        "## Settings",
        "",
    ]
    lines += _table(
        ["setting", "value"],
        [[k, f"`{s.get(k)}`"] for k in ("target", "backend", "ruleset", "profile", "budget_s", "workers", "seed", "timeout_s", "max_examples", "gpus", "command") if s.get(k) not in (None, "")]
        + [["started", summary.get("started_at")], ["finished", summary.get("finished_at")]],
    )
    lines += ["", "## Findings", ""]
    if not findings:
        lines.append("None: every property held on every scenario run.")
    for f in findings:
        lines += [
            f"### `{f['id']}`: {f['property']}",
            "",
            f"- **property**: {f.get('statement') or f['property']}",
            f"- **kind**: {f.get('kind')} · **status**: {f.get('status')} · **target**: `{f.get('target')}` · **backend**: `{f.get('backend')}`",
            f"- **what was seen**: {f.get('message')}",
            f"- **finding file**: `{f.get('path')}`",
            f"- **repro script**: `{f.get('repro_path')}`",
        ]
        if f.get("duplicates"):
            lines.append(f"- **also found as**: {', '.join('`' + d + '`' for d in f['duplicates'])}")
        lines += [
            "",
            "Replay (exit 1 while the bug is there):",
            "",
            "```sh",
            f.get("replay_command", ""),
            f"python {f.get('repro_path')}",
            "```",
            "",
            f"{_scenario_label(f.get('status'))}: `{f.get('scenario_short', '')}`",
            "",
            "<details><summary>Scenario JSON</summary>",
            "",
            "```json",
            json.dumps(f.get("scenario"), indent=2),
            "```",
            "",
            "</details>",
            "",
        ]
    lines += ["", "## Properties", ""]
    props = summary.get("properties", {})
    lines += _table(
        ["property", "checks", "failures", "statement"],
        [[f"`{p}`", v.get("checks", 0), v.get("failures", 0), v.get("statement", "")] for p, v in props.items()],
    )
    cov = summary.get("coverage", {})
    lines += ["", "## Coverage", ""]
    lines += _table(
        ["dimension", "exercised"],
        [[k.replace("_", " "), _counts(v)] for k, v in cov.items()],
    )
    lines += _target_coverage(summary.get("target_coverage"))
    workers = summary.get("workers", [])
    if workers:
        lines += ["", "## Workers", ""]
        lines += _table(
            ["worker", "scenarios", "restarts", "end"],
            [[w.get("worker"), w.get("scenarios"), w.get("restarts"), w.get("end")] for w in workers],
        )
    notes = summary.get("notes", [])
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    lines += ["", "How to read this report: see `reports/README.md`.", ""]
    return "\n".join(lines)
