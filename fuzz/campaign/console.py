"""What a campaign shows while it runs and when it ends: one progress line
(redrawn in place on a terminal, trimmed to its width; a plain line every
few seconds otherwise) and the summary."""

from __future__ import annotations

import os
import shutil
from typing import TextIO

from cgsim.report.defects import runner_said
from cgsim.report.markdown import defect_cards, node_rows
from cgsim.text import first_line

__all__ = ["Progress", "print_summary", "stopped_by"]


def stopped_by(interrupted: str | None) -> str:
    """Why a run is partial, as a phrase: "stopped by SIGINT", "campaign died"."""
    if not interrupted:
        return "stopped by the hard deadline"
    return f"stopped by {interrupted}" if interrupted.startswith("SIG") else interrupted


class Progress:
    def __init__(self, err: TextIO, quiet: bool):
        self.err = err
        self.quiet = quiet
        self.tty = hasattr(err, "isatty") and err.isatty()
        self.every = 0.25 if self.tty else 10.0
        self._shown = False

    def show(self, *, target: str, scenarios: int, findings: int, left_s: float, alive: int, workers: int,
             budget_s: float) -> None:
        if self.quiet:
            return
        text = (f"[fuzz {target}] {scenarios} scenarios · {findings} finding(s) · {left_s:.0f}s left · "
                f"workers {alive}/{workers}")
        if not self.tty:
            self.err.write(text + "\n")
            self.err.flush()
            return
        width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
        bar_room = width - len(text) - 3
        if bar_room >= 10:
            done = 1.0 - (left_s / budget_s if budget_s > 0 else 0.0)
            filled = int(round(max(0.0, min(1.0, done)) * bar_room))
            text = f"{text} |{'#' * filled}{'.' * (bar_room - filled)}|"
        self.err.write("\r" + text[:width].ljust(width))
        self.err.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
            self.err.write("\r" + " " * width + "\r")
            self.err.flush()
            self._shown = False


def print_summary(out: TextIO, summary: dict, run_dir: str) -> None:
    """The end of a campaign: the failing properties, how many held, those
    that judged nothing here, one card per defect with commands that work
    from anywhere (absolute paths: ``reports/latest`` moves), the report."""
    w = out.write
    run_dir = os.path.abspath(run_dir)
    s = summary["settings"]
    state = "" if summary["complete"] else f"  [PARTIAL: {stopped_by(summary.get('interrupted'))}]"
    w(f"cgsim fuzz {summary['run_id']}: target={s['target']} backend={s['backend']} ruleset={s['ruleset']} "
      f"seed={s['seed']} workers={s['workers']} budget={s['budget_s']:g}s{state}\n")
    w(f"ran {summary['scenarios']} scenarios in {summary['elapsed_s']:.1f}s\n")
    props = summary["properties"]
    failing = [p for p, v in props.items() if v["failures"]]
    held = [p for p, v in props.items() if v["checks"] and not v["failures"]]
    idle = [p for p, v in props.items() if not v["checks"] and not v["failures"]]
    for p in failing:
        w(f"  FAILED {p}: {props[p]['failures']} of {props[p]['checks']} scenarios it judged\n")
    w(f"  {len(held)} held\n")
    if idle:
        w(f"  judged nothing here (they do not apply to these scenarios, target or ruleset): {', '.join(idle)}\n")
    findings = {f["id"]: f for f in summary["findings"]}
    defects = defect_cards(summary)
    w(f"{len(defects)} defect(s) in {len(findings)} finding(s)\n")
    for fid in summary.get("manager_level", []):
        f = findings[fid]
        w(f"  {f['property']} ({fid}): {runner_said(f)}\n")
    for card in defects:
        primary = findings[card["primary"]]
        others = [findings[i] for i in card["findings"][1:] if i in findings]
        names = [primary["property"]] + [p for p in card["properties"] if p != primary["property"]]
        label = f"documented defect {card['known_defect']}: " if card.get("known_defect") else ""
        flaky = f"; FLAKY: {primary['flaky']}" if primary.get("flaky") else ""
        w(f"  {label}{', '.join(names)} ({primary['status']}{flaky})\n    {first_line(primary.get('message', ''))}\n"
          f"    replay: python -m fuzz replay {os.path.join(run_dir, primary['path'])}"
          f"{'' if s.get('backend', 'mock') == 'mock' else ' --backend ' + s['backend']}\n"
          f"    repro: {os.path.join(run_dir, primary['repro_path'])}\n")
        if runner_said(primary):
            w(f"    engine's runner: {runner_said(primary)}\n")
        for f in others:
            w(f"    also shrunk for {f['property']}: {os.path.join(run_dir, f['path'])}\n")
    for e in summary.get("inflight", []) if not summary["complete"] else []:
        w(f"in flight: worker {e.get('worker')} (started {e.get('started_at') or '?'}): "
          f"{e.get('scenario_short') or '?'}\n")
    nodes = node_rows(summary.get("workers", []))
    if nodes:
        w("nodes:\n")
        for r in nodes:
            w(f"  {r['node']}: {r['workers']} worker(s), {r['scenarios']} scenarios, {r['restarts']} restart(s)\n")
    for n in summary["notes"]:
        w(f"note: {n}\n")
    w(f"report: {os.path.join(run_dir, 'index.html')} (the same as text: index.md)\n")
    out.flush()

