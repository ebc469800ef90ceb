"""Exit 0 when a vLLM campaign report lists only documented vLLM defects.

    python .ci/check_vllm_report.py REPORT_DIR/latest

Every finding of a campaign against vLLM carries ``known_defect`` (recorded
when it was found, cgsim.targets.vllm.known): a documented defect of that
release, or null.  A null one is a new vLLM defect to document or a cgsim
bug to fix: exit 1, naming it.  No report (the campaign could not run):
exit 2.
"""

import json
import os
import sys


def main(argv):
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    path = os.path.join(argv[0], "summary.json")
    try:
        with open(path, encoding="utf-8") as fh:
            summary = json.load(fh)
    except (OSError, ValueError) as exc:
        print(f"error: no campaign report at {path} ({exc}); the campaign did not run", file=sys.stderr)
        return 2
    env = summary.get("settings", {}).get("environment", {})
    findings = summary.get("findings", [])
    unknown = [f for f in findings if not f.get("known_defect")]
    for f in findings:
        print(f"{f['property']}: {f.get('known_defect') or 'NOT A DOCUMENTED DEFECT'}  ({f['id']})")
    print(f"vLLM {env.get('vllm_version')}: {len(findings)} finding(s), {len(unknown)} not documented")
    if not summary.get("scenarios"):
        print("error: the campaign ran no scenario", file=sys.stderr)
        return 2
    return 1 if unknown else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
