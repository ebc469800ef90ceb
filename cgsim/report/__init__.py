"""Campaign reports, rendered from plain data: findings as JSON files,
summary.json, JUnit XML, a Markdown index and standalone repro scripts, all
written atomically."""

from cgsim.report.atomic import atomic_symlink, atomic_write_json, atomic_write_text
from cgsim.report.findings import finding_path, load_finding, scan_findings, write_finding
from cgsim.report.junit import render_junit
from cgsim.report.markdown import render_markdown
from cgsim.report.repro import render_repro, write_repro
from cgsim.report.summary import SUMMARY_SCHEMA, SUMMARY_SCHEMA_VERSION, update_latest, write_report

__all__ = [
    "atomic_symlink",
    "atomic_write_json",
    "atomic_write_text",
    "finding_path",
    "load_finding",
    "scan_findings",
    "write_finding",
    "render_junit",
    "render_markdown",
    "render_repro",
    "write_repro",
    "SUMMARY_SCHEMA",
    "SUMMARY_SCHEMA_VERSION",
    "write_report",
    "update_latest",
]
