"""The in-flight file protocol: ``.work/inflight-w<N>.json`` holds the
scenario worker N is running now.

The entry is written before a scenario runs and emptied when it returns, so
a non-empty file names the scenario a worker was running: an executor reads
it after a worker died (the death becomes a finding of that scenario), every
report lists it while the campaign runs, and ``fuzz report`` lists it after
the campaign died.  A local worker writes its own file; over Ray the sink on
the driver's node writes it for the worker (``ray_actors.FindingsSink``), in
the same format plus the worker's node.

Writing is cheap (one rewrite, no fsync) and best effort: a full disk must
not look like a failure of the scenario.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import time
from typing import Any

from cgsim.families import FamilyRegistryError, family_of_scenario

__all__ = ["inflight_path", "inflight_entry", "InflightFile", "read_inflight", "describe_inflight",
           "recorded_inflight"]

_NAME = re.compile(r"^inflight-w(\d+)\.json$")


def inflight_path(run_dir: str, index: int) -> str:
    return os.path.join(run_dir, ".work", f"inflight-w{index}.json")


def inflight_entry(worker: int, incarnation: int, pid: int, scenario: dict, node: str | None = None,
                   started: float | None = None) -> dict:
    """What the file of a worker about to run ``scenario`` holds."""
    return {"worker": worker, "incarnation": incarnation, "pid": pid, **({"node": node} if node is not None else {}),
            "started": round(time.time() if started is None else started, 3), "scenario": scenario}


class InflightFile:
    """One worker's in-flight file, kept open: ``write`` an entry, ``clear``
    it when the scenario returns (also creates the file empty)."""

    def __init__(self, run_dir: str, index: int):
        self.path = inflight_path(run_dir, index)
        self._fh: Any = None

    def _rewrite(self, text: str) -> None:
        try:
            if self._fh is None:
                self._fh = open(self.path, "w", encoding="utf-8")
            self._fh.seek(0)
            self._fh.write(text)
            self._fh.truncate()
            self._fh.flush()
        except (OSError, ValueError):
            pass

    def write(self, entry: dict) -> None:
        self._rewrite(json.dumps(entry))

    def clear(self) -> None:
        self._rewrite("")


def read_inflight(run_dir: str, index: int) -> dict | None:
    """What worker ``index`` was running: an ``inflight_entry``, or None
    (idle, never started, unreadable)."""
    try:
        with open(inflight_path(run_dir, index), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    try:
        data = json.loads(text) if text.strip() else None
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("scenario"), dict):
        return None
    return data


def describe_inflight(data: dict) -> dict:
    """A summary's "inflight" entry for what ``read_inflight`` returned."""
    started = data.get("started")
    try:
        short = family_of_scenario(data["scenario"]).scenario_short(data["scenario"])
    except (FamilyRegistryError, TypeError, ValueError, KeyError):
        short = ""
    when = None
    if isinstance(started, (int, float)):
        when = _dt.datetime.fromtimestamp(started).astimezone().isoformat(timespec="seconds")
    return {"worker": data.get("worker"), "incarnation": data.get("incarnation"), "pid": data.get("pid"),
            "started_at": when, "since_s": round(time.time() - started, 1) if isinstance(started, (int, float)) else None,
            "scenario_short": short, "scenario": data["scenario"]}


def recorded_inflight(run_dir: str) -> list[dict] | None:
    """What every worker with an in-flight file was running, by worker
    index (``read_inflight``'s entries); None where no worker has a file (a
    run directory without its scratch folder, e.g. an uploaded report)."""
    try:
        names = os.listdir(os.path.join(run_dir, ".work"))
    except OSError:
        return None
    indices = sorted(int(m.group(1)) for m in map(_NAME.match, names) if m)
    if not indices:
        return None
    return [data for data in (read_inflight(run_dir, i) for i in indices) if data is not None]
