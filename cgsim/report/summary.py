"""summary.json (schema-versioned) and the files rendered from it, plus the
``reports/latest`` pointer."""

from __future__ import annotations

import os

from cgsim.report.atomic import atomic_symlink, atomic_write_json, atomic_write_text
from cgsim.report.junit import render_junit
from cgsim.report.markdown import render_markdown

__all__ = ["SUMMARY_SCHEMA", "SUMMARY_SCHEMA_VERSION", "write_report", "update_latest"]

SUMMARY_SCHEMA = "cgsim.campaign-summary"
SUMMARY_SCHEMA_VERSION = 1


def write_report(run_dir: str, summary: dict) -> None:
    """Write summary.json, junit.xml and index.md.  The summary goes last: a
    reader that finds a summary finds the other two consistent with some
    (possibly older) state of the same run."""
    summary = dict(summary)
    summary.setdefault("schema", SUMMARY_SCHEMA)
    summary.setdefault("schema_version", SUMMARY_SCHEMA_VERSION)
    atomic_write_text(os.path.join(run_dir, "junit.xml"), render_junit(summary))
    atomic_write_text(os.path.join(run_dir, "index.md"), render_markdown(summary))
    atomic_write_json(os.path.join(run_dir, "summary.json"), summary)


def update_latest(report_dir: str, run_id: str) -> None:
    """``reports/latest`` (a symlink) and ``reports/LATEST`` (a file naming the
    run, for filesystems without symlinks), each replaced atomically."""
    atomic_write_text(os.path.join(report_dir, "LATEST"), run_id + "\n")
    try:
        atomic_symlink(run_id, os.path.join(report_dir, "latest"))
    except OSError:
        pass
