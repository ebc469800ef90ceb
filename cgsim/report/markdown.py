"""index.md: a campaign report a person reads with no tools.

Every path in it is relative to the run directory (the one holding
index.md), and it says so: a report that is moved, archived or uploaded
keeps working commands."""

from __future__ import annotations

import json
from typing import Mapping

from cgsim.report.defects import runner_said

__all__ = ["render_markdown", "node_rows", "defect_cards"]


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
    inflight = [] if summary.get("complete") else summary.get("inflight", [])
    verdict = (f"**{len(defect_cards(summary))} defect(s)** in {len(findings)} finding(s)" if findings
               else "**no findings**")
    under_test = (s.get("environment") or {}).get("code_under_test")
    lines = [
        f"# cgsim fuzz campaign `{summary.get('run_id')}`" + (f" on {under_test}" if under_test else ""),
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
    else:
        lines += ["One card per defect: a minimal scenario with every property it violates (or one documented "
                  "defect of the engine), and the findings it stands for, each shrunk for its own property.",
                  "Paths and commands below are relative to this run's directory (the one holding this "
                  "`index.md`): `cd` there first.", ""]
    by_id = {f["id"]: f for f in findings}
    for n, card in enumerate(defect_cards(summary), 1):
        f = by_id[card["primary"]]
        others = [by_id[i] for i in card["findings"][1:] if i in by_id]
        names = [f["property"]] + [p for p in card["properties"] if p != f["property"]]
        lines += [
            f"### {n}. {', '.join(names)}",
            "",
        ]
        if card.get("known_defect"):
            lines.append(f"- **documented defect**: {card['known_defect']}")
        if len(card["properties"]) > 1:
            lines.append(f"- **violates**: {', '.join(f'`{p}`' for p in card['properties'])} (one scenario)")
        lines += [
            f"- **finding**: `{f['id']}` · **property**: {f.get('statement') or f['property']}",
            f"- **kind**: {f.get('kind')} · **status**: {f.get('status')} · **target**: `{f.get('target')}` · **backend**: `{f.get('backend')}`",
            f"- **what was seen**: {f.get('message')}",
            *([f"- **reached by**: `{f['launch']['line']}`"] if (f.get("launch") or {}).get("line") else []),
            *([f"- **the engine's scheduler**: {said}"] if (said := scheduler_said(f)) else []),
            *([f"- **the engine's runner**: {said}"] if (said := runner_said(f)) else []),
            f"- **finding file**: `{f.get('path')}`",
            f"- **repro script**: `{f.get('repro_path')}`",
        ]
        if f.get("flaky"):
            lines.append(f"- **flaky**: {f['flaky']}")
        if f.get("duplicates"):
            lines.append(f"- **also found as**: {', '.join('`' + d + '`' for d in f['duplicates'])}")
        if f.get("picture"):
            lines += ["", f"![dispatch map of {f['id']}: the graph every batch lands on, this batch boxed]({f['picture']})"]
        elif f.get("picture_error"):
            lines += ["", f"(no dispatch map: {f['picture_error']})"]
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
        ]
        if f.get("scenario_code"):
            lines += ["```python", f["scenario_code"], "```", ""]
        lines += [
            "<details><summary>Scenario JSON</summary>",
            "",
            "```json",
            json.dumps(f.get("scenario"), indent=2),
            "```",
            "",
            "</details>",
            "",
        ]
        if others:
            lines += ["The same defect, shrunk for each property on its own:", ""]
            for o in others:
                lines.append(f"- `{o['property']}` ({o.get('status')}): `{o.get('path')}` · "
                             f"`{o.get('replay_command', '')}` · `python {o.get('repro_path')}`")
            lines.append("")
    manager_level = [by_id[i] for i in summary.get("manager_level", []) if i in by_id]
    if manager_level:
        lines += ["## Manager-level only", "",
                  "Findings of the manager that the engine's own runner, built from each one's launch, never "
                  "reaches: not defects of the engine.", ""]
        lines += [f"- `{f['property']}` `{f['id']}`: {runner_said(f)}" for f in manager_level] + [""]
    if inflight:
        lines += ["", "## In flight", "",
                  "Scenarios the workers were running when this report was written (after a campaign died: the "
                  "scenario each worker was on; none of them is a finding).", ""]
        lines += _table(["worker", "started", "scenario"],
                        [[e.get("worker"), e.get("started_at") or "?", f"`{e.get('scenario_short') or '?'}`"]
                         for e in inflight])
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
        on_nodes = any("node" in w for w in workers)  # a campaign over Ray
        lines += _table(
            ["worker", "scenarios", "restarts", "end"] + (["node"] if on_nodes else []),
            [[w.get("worker"), w.get("scenarios"), w.get("restarts"), w.get("end")]
             + ([w.get("node") or "?"] if on_nodes else []) for w in workers],
        )
        if on_nodes:
            lines += ["", "## Nodes", ""]
            lines += _table(["node", "workers", "scenarios", "restarts"],
                            [[r["node"], r["workers"], r["scenarios"], r["restarts"]] for r in node_rows(workers)])
    notes = summary.get("notes", [])
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    lines += ["", "The same report for a browser, pictures and a per-worker timeline included: `index.html`.",
              "How to read this report: `reports/README.md` in the cgsim repository.", ""]
    return "\n".join(lines)


def defect_cards(summary: dict) -> list[dict]:
    """The summary's cards (``defects``), or one per finding for a summary
    written before findings were grouped."""
    cards = summary.get("defects")
    if cards is not None:
        return cards
    return [{"id": f["id"], "properties": [f["property"]], "known_defect": f.get("known_defect"), "primary": f["id"],
             "findings": [f["id"]]} for f in summary.get("findings", [])]


def node_rows(workers: list[dict]) -> list[dict]:
    """One row per node of a campaign's workers (over Ray): {"node",
    "workers", "scenarios", "restarts"}; [] when no worker names a node."""
    rows: dict[str, dict] = {}
    for w in workers:
        if "node" not in w:
            continue
        node = w.get("node") or "?"
        if w.get("node_ip"):
            node = f"{node} ({w['node_ip']})"
        r = rows.setdefault(node, {"node": node, "workers": 0, "scenarios": 0, "restarts": 0})
        r["workers"] += 1
        r["scenarios"] += w.get("scenarios") or 0
        r["restarts"] += w.get("restarts") or 0
    return list(rows.values())


def scheduler_said(f: Mapping) -> str | None:
    """A finding's scheduler evidence in a sentence (None: it has none)."""
    said = f.get("scheduler_evidence")
    if not said:
        return None
    if "error" in said:
        return f"could not be asked ({said['error']})"
    if said.get("batches_from") == "scheduler":
        return f"every batch of this scenario was scheduled by {said['scheduler']} for {said['requests']} requests"
    where = f"in {said['runs']} runs ({said['scheduled']} batches) of `{said['launch']}`"
    parts = []
    if "batch_scheduled" in said:
        parts.append(f"the batch {'was' if said['batch_scheduled'] else 'was never'} scheduled")
    if "graph_used" in said:
        parts.append(f"{'a' if said['graph_used'] else 'no'} scheduled batch dispatches to the graph")
    return f"{' and '.join(parts)} {where}"
