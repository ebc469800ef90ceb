"""JUnit XML for a campaign: one testcase per property, each finding a
<failure> of its property's testcase, the repro path a <property>."""

from __future__ import annotations

import xml.etree.ElementTree as ET

__all__ = ["render_junit"]


def render_junit(summary: dict) -> str:
    settings = summary.get("settings", {})
    target = settings.get("target", "?")
    props: dict = summary.get("properties", {})
    by_prop: dict[str, list[dict]] = {}
    for f in summary.get("findings", []):
        by_prop.setdefault(f["property"], []).append(f)
    names = list(props) + [p for p in by_prop if p not in props]
    failures = sum(1 for p in names if by_prop.get(p))
    skipped = sum(1 for p in names if not by_prop.get(p) and not props.get(p, {}).get("checks"))
    suite = ET.Element(
        "testsuite",
        name=f"cgsim.fuzz[{target}]",
        tests=str(len(names)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
        time=f"{summary.get('elapsed_s', 0) or 0:.3f}",
        timestamp=str(summary.get("started_at", "")),
    )
    sp = ET.SubElement(suite, "properties")
    for key in ("run_id", "complete"):
        ET.SubElement(sp, "property", name=key, value=str(summary.get(key)))
    for key in ("target", "backend", "ruleset", "seed", "budget_s", "workers", "profile"):
        ET.SubElement(sp, "property", name=key, value=str(settings.get(key)))
    for name in names:
        info = props.get(name, {})
        case = ET.SubElement(
            suite, "testcase", classname=f"cgsim.fuzz.{_safe(target)}", name=name, time="0"
        )
        found = by_prop.get(name, [])
        if found:
            cp = ET.SubElement(case, "properties")
            for i, f in enumerate(found):
                suffix = "" if i == 0 else f".{i + 1}"
                ET.SubElement(cp, "property", name=f"finding{suffix}", value=f["id"])
                ET.SubElement(cp, "property", name=f"repro{suffix}", value=f.get("repro_path", ""))
                ET.SubElement(cp, "property", name=f"replay{suffix}", value=f.get("replay_command", ""))
            first = found[0]
            failure = ET.SubElement(case, "failure", message=_one_line(f"{name}: {first.get('message', '')}"), type=first.get("kind", "violation"))
            failure.text = "\n\n".join(
                f"{f['id']} ({f.get('status')}): {f.get('message', '')}\n"
                f"scenario: {f.get('scenario_short', '')}\n"
                f"repro: {f.get('repro_path', '')}\n"
                f"replay: {f.get('replay_command', '')}"
                for f in found
            )
        elif not info.get("checks"):
            ET.SubElement(case, "skipped", message="no scenario of this campaign exercised this property")
        else:
            out = ET.SubElement(case, "system-out")
            out.text = f"{info.get('checks', 0)} checks, 0 failures: {info.get('statement', '')}"
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in text)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
