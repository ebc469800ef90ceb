"""The release x finding matrix of docs/findings.md, from replays.

    PYTHONPATH=. python docs/findings/matrix.py --row >> rows.jsonl   # in a venv with a vLLM release
    PYTHONPATH=. python docs/findings/matrix.py --markdown rows.jsonl  # the table for docs/findings.md

``--row`` replays every finding JSON next to this script on the vLLM that
imports here (CGSIM_VLLM_SOURCE for a source tree), each under the ruleset of
that tree's design, with the code behind ``python -m fuzz replay``.  A cell
is ``1`` when the finding's property is violated and recognised as its
documented defect (cgsim.targets.vllm.known), ``0`` when it is not, ``(N)``
when the release has the defect but documented defect N stops the scenario
before it shows, ``n/a`` when the tree cannot express the scenario's config
(the feature is newer), ``nr`` when vLLM's own config path refuses the
settings the scenario stands for, or builds another manager from them (not
reachable from settings a user can type: manager-level only there).
"""

from __future__ import annotations

import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def row() -> dict:
    from cgsim.report.findings import load_finding
    from cgsim.scenario import Scenario
    from cgsim.targets import get_target
    from cgsim.targets.vllm.compat import require_vllm
    from cgsim.targets.vllm.doctor import _run
    from cgsim.targets.vllm.known import classify, stopped_by

    get_target("vllm").prepare_environment()
    caps = require_vllm()
    cells, reasons = {}, {}
    for path in sorted(glob.glob(os.path.join(HERE, "*.json"))):
        doc = load_finding(path)
        defect = classify(doc)
        trace, found = _run(Scenario.from_json({**doc.scenario, "ruleset": caps.ruleset}))
        if trace.unsupported:
            cells[doc.id] = "n/a" if trace.unsupported.startswith("config not expressible") else "nr"
            reasons[doc.id] = trace.unsupported
            continue
        hit = any(f.property == doc.property and classify(f, caps.version) == defect for f in found)
        cells[doc.id] = "1" if hit else "0"
        if not hit and defect is not None and defect.present_in(caps.version):
            stoppers = stopped_by(found, defect, caps.version)
            if stoppers:
                cells[doc.id] = "(" + ",".join(str(r) for r in stoppers) + ")"
    return {"release": ".".join(caps.version.split("+")[0].split(".")[:2]), "version": caps.version,
            "source": caps.source.commit if caps.source else None, "ruleset": caps.ruleset, "cells": cells,
            "reasons": reasons}


def markdown(rows: list[dict]) -> str:
    from cgsim.report.findings import load_finding
    from cgsim.targets.vllm.known import classify

    rows = sorted(rows, key=lambda r: tuple(int(x) for x in r["release"].split(".")))
    ids = sorted({fid for r in rows for fid in r["cells"]},
                 key=lambda fid: (classify(load_finding(os.path.join(HERE, fid + ".json"))).row, fid))
    head = "| finding | # | " + " | ".join(r["release"] for r in rows) + " |"
    out = [head, "|" + "---|" * (len(rows) + 2)]
    for fid in ids:
        d = classify(load_finding(os.path.join(HERE, fid + ".json")))
        out.append(f"| `{fid}` | {d.row} | " + " | ".join(r["cells"].get(fid, "?") for r in rows) + " |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if "--row" in argv:
        print(json.dumps(row()))
        return 0
    if "--markdown" in argv:
        paths = [a for a in argv if not a.startswith("--")]
        rows = [json.loads(line) for p in paths for line in open(p, encoding="utf-8") if line.strip()]
        print(markdown(rows))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
